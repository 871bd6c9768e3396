#!/bin/bash
# test/fuzz/run.sh [seconds per target, default 600]
#
# Builds the libFuzzer targets of test/fuzz/ with clang
# (-fsanitize=fuzzer,address,undefined) against the pure C parts of the
# relay (relay/filter.c with -DRELAY_FILTER_STANDALONE, relay/signature.c
# with -DRELAY_SIGNATURE_STANDALONE), runs each for the given time from its
# seed corpus (test/fuzz/corpus/<target>/) and prints the runs and crashes
# of each. Not run by CI; see docs/fuzzing.md.
#
# Environment:
#   FUZZ_DIR     where builds, grown corpora, logs and crash artifacts go
#                (default /tmp/pg_tide_fuzz; never inside the repository)
#   FUZZ_JOBS    how many targets run at once (default 1: one after another)
#   FUZZ_TARGETS which targets (default: all of them)
#   CC           the compiler (default clang)
set -u
SECS=${1:-600}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=${FUZZ_DIR:-/tmp/pg_tide_fuzz}
JOBS=${FUZZ_JOBS:-1}
CC=${CC:-clang}
TARGETS=${FUZZ_TARGETS:-"routing_config filter signature retry_after"}
CFLAGS="-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Wall -Wextra -I$ROOT/relay"

# clang comes from Debian's packages.
if ! command -v "$CC" >/dev/null && [ "$CC" = clang ]; then
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends clang >/dev/null || exit 1
fi
mkdir -p "$OUT/bin" || exit 1

# PostgreSQL's own base64 (libpgcommon.a), when present, for the
# differential check in fuzz_signature.c.
PGCOMMON=""
for d in $(pg_config --pkglibdir --libdir 2>/dev/null) /usr/lib/postgresql/15/lib; do
	if [ -f "$d/libpgcommon.a" ]; then
		PGCOMMON="$d/libpgcommon.a"
		break
	fi
done
echo "differential base64 check against PostgreSQL: ${PGCOMMON:-no (libpgcommon.a not found)}"

build() {
	local t=$1
	case $t in
	routing_config|filter)
		$CC $CFLAGS -DRELAY_FILTER_STANDALONE -o "$OUT/bin/fuzz_$t" \
			"$HERE/fuzz_$t.c" "$ROOT/relay/filter.c" -lcjson ;;
	signature)
		$CC $CFLAGS -DRELAY_SIGNATURE_STANDALONE ${PGCOMMON:+-DFUZZ_PG_B64} -o "$OUT/bin/fuzz_$t" \
			"$HERE/fuzz_$t.c" "$ROOT/relay/signature.c" $PGCOMMON -lcrypto -lcurl ;;
	retry_after)
		$CC $CFLAGS -DRELAY_SIGNATURE_STANDALONE -o "$OUT/bin/fuzz_$t" \
			"$HERE/fuzz_$t.c" "$ROOT/relay/signature.c" -lcrypto -lcurl ;;
	*)
		echo "unknown target $t" >&2; return 1 ;;
	esac
}

run() {
	local t=$1
	local corpus="$OUT/corpus/$t" art="$OUT/artifacts/$t"
	mkdir -p "$corpus" "$art"
	# new inputs go to $OUT/corpus/<target>; the seeds are only read
	"$OUT/bin/fuzz_$t" -max_total_time="$SECS" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
		-print_final_stats=1 -artifact_prefix="$art/" "$corpus" "$HERE/corpus/$t" \
		> "$OUT/$t.log" 2>&1
	echo $? > "$OUT/$t.rc"
}

for t in $TARGETS; do
	build "$t" || { echo "build of fuzz_$t failed" >&2; exit 1; }
done
echo "built $TARGETS in $OUT/bin; $SECS s per target, $JOBS at once; logs in $OUT/<target>.log"

n=0
for t in $TARGETS; do
	rm -f "$OUT/$t.rc"
	run "$t" &
	n=$((n + 1))
	if [ "$n" -ge "$JOBS" ]; then
		wait -n
		n=$((n - 1))
	fi
done
wait

status=0
printf '%-16s %12s %8s %8s %s\n' target runs exec/s crashes result
for t in $TARGETS; do
	runs=$(grep -o 'Done [0-9]* runs' "$OUT/$t.log" | tail -1 | grep -o '[0-9]*')
	eps=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$OUT/$t.log" | grep -o '[0-9]*$')
	crashes=$(find "$OUT/artifacts/$t" -type f | wc -l)
	rc=$(cat "$OUT/$t.rc" 2>/dev/null || echo '?')
	if [ "$rc" = 0 ] && [ "$crashes" = 0 ]; then res=ok; else res="FAILED (exit $rc, see $OUT/$t.log)"; status=1; fi
	printf '%-16s %12s %8s %8s %s\n' "$t" "${runs:-?}" "${eps:-?}" "$crashes" "$res"
done
exit $status
