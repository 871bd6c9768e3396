#!/usr/bin/env bash
# Runs pg_tide's tests on another PostgreSQL major version, in a Debian
# chroot of the suite that packages it (17: trixie, 18: sid):
#
#   test/run-in-chroot.sh <pg-major> prepare   debootstrap and apt (no tests)
#   test/run-in-chroot.sh <pg-major> test      test/run-tests.sh inside
#   test/run-in-chroot.sh <pg-major> package   build the packages inside (test/build-package.sh)
#
# Steps can be combined (17 prepare test package). Run as root. The chroot
# is $TIDE_CHROOT_BASE/<suite>-pg<major> and is reused when it holds the
# same packages. The tests inherit PG_CFLAGS, PG_TEST_EXTRA and PROVE_FLAGS;
# their server listens on 127.0.0.1:$TIDE_CHROOT_PORT (default 55<major>:
# the chroot shares the host's network). Packages go to $TIDE_DEB_DIR.
set -euo pipefail

TIDE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$TIDE_ROOT/test/chroot.sh"
trap chroot_cleanup EXIT

[ $# -ge 2 ] || {
	echo "usage: $0 <pg-major> prepare|test|package..." >&2
	exit 2
}
major=$1
shift
suite=$(chroot_suite_for "$major")
dir=$TIDE_CHROOT_BASE/$suite-pg$major
port=${TIDE_CHROOT_PORT:-55$major}
TIDE_DEB_DIR=${TIDE_DEB_DIR:-/var/tmp/pg_tide_debs}

# The packages: the tests' (test/lib.sh) and Debian's extension tooling.
packages() {
	(PG_MAJOR=$major && source "$TIDE_ROOT/test/lib.sh" && tide_packages)
	echo debhelper postgresql-server-dev-all
}

# A fresh copy of the source tree at /tide in the chroot (no .git, no build
# output from the host).
copy_tree() {
	rm -rf "$dir/tide"
	mkdir "$dir/tide"
	tar -C "$TIDE_ROOT" --exclude=.git --exclude='*.o' --exclude='*.so' --exclude='*.bc' \
		--exclude=test/receiver --exclude=test/sql_names -cf - . | tar -C "$dir/tide" -xf -
}

for step in "$@"; do
	case "$step" in
	prepare)
		# shellcheck disable=SC2046 # one word per package
		chroot_create "$dir" "$suite" $(packages)
		;;
	test)
		[ -f "$dir/.tide-chroot" ] || chroot_create "$dir" "$suite" $(packages)
		copy_tree
		chroot_mount "$dir"
		echo "== PostgreSQL $major in $suite: $(chroot_run "$dir" /usr/lib/postgresql/"$major"/bin/postgres --version)"
		chroot_run "$dir" PG_MAJOR="$major" TIDE_PORT="$port" TIDE_CLUSTER=/tmp/pg_tide_cluster \
			PG_CFLAGS="${PG_CFLAGS:-}" PG_TEST_EXTRA="${PG_TEST_EXTRA:-}" PROVE_FLAGS="${PROVE_FLAGS:-}" \
			/tide/test/run-tests.sh
		chroot_umount "$dir"
		;;
	package)
		[ -f "$dir/.tide-chroot" ] || chroot_create "$dir" "$suite" $(packages)
		copy_tree
		chroot_mount "$dir"
		chroot_run "$dir" PG_CFLAGS="${PG_CFLAGS:-}" /tide/test/build-package.sh /tide-debs
		chroot_umount "$dir"
		mkdir -p "$TIDE_DEB_DIR"
		cp "$dir"/tide-debs/*.deb "$TIDE_DEB_DIR/"
		rm -rf "$dir/tide-debs"
		;;
	*)
		echo "unknown step \"$step\" (prepare, test or package)" >&2
		exit 2
		;;
	esac
done
