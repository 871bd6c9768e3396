#!/usr/bin/env bash
# Installs a built postgresql-N-pg-tide .deb in a clean Debian chroot that
# has only postgresql-N (apt resolves what the package depends on), preloads
# it, starts a cluster as postgres, creates the extension, an outbox and a
# consumer group, publishes a message and polls it: fails unless the polled
# payload is the one published. Run as root:
#   test/package-test.sh <postgresql-N-pg-tide_*.deb>
#   test/package-test.sh --prepare <N>    only make the clean chroot
# The clean chroot ($TIDE_CHROOT_BASE/<suite>-pg<N>-clean) is made once and
# copied for each run, so every run starts clean.
set -euo pipefail

TIDE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$TIDE_ROOT/test/chroot.sh"
trap chroot_cleanup EXIT

# Makes the clean chroot for PostgreSQL major version $1 (only postgresql-$1).
make_clean_chroot() {
	local suite
	suite=$(chroot_suite_for "$1")
	chroot_create "$TIDE_CHROOT_BASE/$suite-pg$1-clean" "$suite" "postgresql-$1"
}

if [ "${1:-}" = --prepare ]; then
	make_clean_chroot "${2:?usage: $0 --prepare <pg-major>}"
	exit 0
fi

deb=$(readlink -f "${1:?usage: $0 <postgresql-N-pg-tide_*.deb>}")
name=$(dpkg-deb -f "$deb" Package)
major=$(sed -n 's/^postgresql-\([0-9]\+\)-pg-tide$/\1/p' <<<"$name")
[ -n "$major" ] || {
	echo "$deb is not a postgresql-N-pg-tide package ($name)" >&2
	exit 1
}
suite=$(chroot_suite_for "$major")
clean=$TIDE_CHROOT_BASE/$suite-pg$major-clean
dir=$TIDE_CHROOT_BASE/$suite-pg$major-pkgtest
# The extension's version the package must install by default.
want_version=$(dpkg-deb --fsys-tarfile "$deb" |
	tar -xOf - ./usr/share/postgresql/"$major"/extension/pg_tide.control |
	sed -n "s/^default_version = '\(.*\)'/\1/p")

echo "== files of $(basename "$deb")"
dpkg-deb -c "$deb" | awk '$NF ~ /\.(so|control|sql)$/ {print $NF}' | tee /tmp/pg_tide_pkg_files.$$
for f in "lib/postgresql/$major/lib/pg_tide.so" "share/postgresql/$major/extension/pg_tide.control" \
	"share/postgresql/$major/extension/pg_tide--$want_version.sql"; do
	grep -qx "./usr/$f" /tmp/pg_tide_pkg_files.$$ || {
		echo "FAILED: the package has no /usr/$f" >&2
		exit 1
	}
done
rm -f /tmp/pg_tide_pkg_files.$$

make_clean_chroot "$major"
if chroot_has_mounts "$dir"; then
	echo "refusing to replace $dir: something is mounted below it" >&2
	exit 1
fi
rm -rf "$dir"
cp -a "$clean" "$dir"
install -m 644 "$deb" "$dir/tmp/$(basename "$deb")"
chroot_mount "$dir"

echo "== apt-get install ./$(basename "$deb") in a clean $suite with postgresql-$major"
chroot_run "$dir" sh -c "cd /tmp && apt-get install -y -q --no-install-recommends ./$(basename "$deb")"

# Runs as postgres inside the chroot: $1 the PostgreSQL major version,
# $2 the extension version to expect, $3 the payload to publish. The
# cluster listens on its socket only: the chroot shares the host's network.
cat >"$dir/tmp/pg_tide_check.sh" <<'CHECK'
#!/bin/bash
set -euo pipefail
bin=/usr/lib/postgresql/$1/bin
want_version=$2
payload=$3
d=$(mktemp -d /tmp/pg_tide_pkg.XXXXXX)
"$bin/initdb" -D "$d/data" -A trust -U postgres >/dev/null
cat >>"$d/data/postgresql.conf" <<CONF
shared_preload_libraries = 'pg_tide'
listen_addresses = ''
unix_socket_directories = '$d'
CONF
"$bin/pg_ctl" -D "$d/data" -l "$d/server.log" -w start >/dev/null || {
	cat "$d/server.log" >&2
	exit 1
}
trap '"$bin/pg_ctl" -D "$d/data" -m fast -w stop >/dev/null' EXIT
# Runs SQL $1 (from stdin, as psql interpolates :'var' only there) with
# variables payload and $2..., given as name=value.
sql() {
	local cmd=$1 v vars=()
	shift
	for v in "payload=$payload" "$@"; do vars+=(-v "$v"); done
	"$bin/psql" -h "$d" -X -q -v ON_ERROR_STOP=1 -At "${vars[@]}" <<<"$cmd"
}
sql 'CREATE EXTENSION pg_tide'
version=$(sql "SELECT extversion FROM pg_extension WHERE extname = 'pg_tide'")
echo "pg_tide $version on $("$bin/postgres" --version)"
[ "$version" = "$want_version" ] || {
	echo "FAILED: CREATE EXTENSION installed $version, not $want_version" >&2
	exit 1
}
sql "SELECT tide.outbox_create('orders'); SELECT tide.create_consumer_group('billing', 'orders')" >/dev/null
sql "SELECT tide.outbox_publish('orders', :'payload')" >/dev/null
polled=$(sql "SELECT payload FROM tide.poll_outbox('billing', 'worker-1', 10)")
echo "published: $payload"
echo "polled:    $polled"
# jsonb may lay the text out differently: the server compares.
[ -n "$polled" ] && [ "$(sql "SELECT :'polled'::jsonb = :'payload'::jsonb" "polled=$polled")" = t ] || {
	echo "FAILED: the polled payload is not the one published" >&2
	exit 1
}
# A broker sink's module is not in the package: its pipeline is refused,
# naming what to install, and pg_tide works on.
if out=$(sql "SELECT tide.relay_set_outbox('to_kafka', 'orders', 'to_kafka', '{\"sink_type\": \"kafka\", \"bootstrap_servers\": \"127.0.0.1:9092\", \"topic\": \"orders\"}')" 2>&1); then
	echo "FAILED: a kafka pipeline was accepted without pg_tide_kafka.so" >&2
	exit 1
fi
echo "a kafka pipeline: $out"
grep -q 'sink type "kafka" is not available on this server' <<<"$out" && grep -q 'librdkafka1' <<<"$out" || {
	echo "FAILED: the refusal of a kafka pipeline does not say what to install" >&2
	exit 1
}
CHECK
chmod 755 "$dir/tmp/pg_tide_check.sh"
echo "== a cluster with pg_tide preloaded: publish and poll"
chroot_run "$dir" runuser -u postgres -- /tmp/pg_tide_check.sh "$major" "$want_version" \
	"{\"order\": 42, \"check\": \"package-test $$ $(date +%s%N)\"}"
chroot_umount "$dir"
rm -rf "$dir"
echo "== package test passed: $name $(dpkg-deb -f "$deb" Version) on $suite"
