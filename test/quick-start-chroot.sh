#!/usr/bin/env bash
# The README's Quick start on a fresh Debian 12 machine: a bookworm chroot
# made anew for every run, holding only build-essential, git and
# ca-certificates, a clone of this checkout in it, and the README's two
# commands run there as root exactly as written: test/demo.sh, then
# test/run-tests.sh. A step that works only because a machine already has
# something (pkg-config, say) fails here. Run as root:
#   test/quick-start-chroot.sh [<commit>]    (default: this checkout's HEAD)
# The clone holds committed work only, as a user's clone would. The tests
# inherit PG_CFLAGS, PG_TEST_EXTRA (CI sets soak) and PROVE_FLAGS. The
# chroot shares the host's network: the demo's cluster listens on
# 127.0.0.1:5499 (the tests' too) and its webhook receiver on 127.0.0.1:8099,
# so nothing else may use those ports meanwhile.
set -euo pipefail

TIDE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$TIDE_ROOT/test/chroot.sh"
trap chroot_cleanup EXIT

commit=$(git -c safe.directory='*' -C "$TIDE_ROOT" rev-parse --verify "${1:-HEAD}^{commit}")
dir=$TIDE_CHROOT_BASE/bookworm-fresh
checkout=/root/pg_tide

# Nothing of an earlier run may remain: the marker file would let
# chroot_create reuse the tree, with whatever the last run installed.
rm -f "$dir/.tide-chroot"
start=$SECONDS
chroot_create "$dir" bookworm build-essential git ca-certificates
echo "== a clean Debian 12 chroot in $((SECONDS - start)) s"

echo "== git clone of $TIDE_ROOT at $commit into $checkout"
git -c safe.directory='*' clone -q --no-checkout "$TIDE_ROOT" "$dir$checkout"
git -c safe.directory='*' -C "$dir$checkout" -c advice.detachedHead=false checkout -q "$commit"

chroot_mount "$dir"
status=0
for command in test/demo.sh test/run-tests.sh; do
	start=$SECONDS
	rc=0
	echo "== $command (in $checkout, as root)"
	chroot_run "$dir" PG_CFLAGS="${PG_CFLAGS:-}" PG_TEST_EXTRA="${PG_TEST_EXTRA:-}" \
		PROVE_FLAGS="${PROVE_FLAGS:-}" sh -c "cd $checkout && $command" || rc=$?
	echo "== $command: exit $rc in $((SECONDS - start)) s"
	[ "$rc" -eq 0 ] || status=1
done
chroot_umount "$dir"
[ "$status" -eq 0 ] && echo "== the Quick start passed in a clean Debian 12" ||
	echo "== the Quick start FAILED in a clean Debian 12"
exit "$status"
