#!/usr/bin/env bash
# Installs the built packages in a clean Debian chroot that has only
# postgresql-N (apt resolves what they depend on): the core package
# postgresql-N-pg-tide, which must hold no broker module, and the redis
# sink's postgresql-N-pg-tide-redis, whose own dependencies must bring its
# client library (checked before Debian's redis-server is installed). Then,
# as postgres, it preloads pg_tide, starts a cluster, creates the extension,
# an outbox and a consumer group, publishes a message and polls it, checks
# that a kafka pipeline (its package not installed) is refused naming what
# to install, starts redis-server on 127.0.0.1 and delivers a message
# through a file pipeline and through a redis pipeline, read back with
# redis-cli. Fails unless each message read is the one published. As root:
#   test/package-test.sh <postgresql-N-pg-tide_*.deb> <postgresql-N-pg-tide-redis_*.deb>
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

usage="usage: $0 <postgresql-N-pg-tide_*.deb> <postgresql-N-pg-tide-redis_*.deb>"
if [ $# -ne 2 ]; then
	echo "$usage" >&2
	exit 2
fi
# The packages, in any order, known by their names.
deb=
redis_deb=
for d in "$@"; do
	d=$(readlink -f "$d")
	case "$(dpkg-deb -f "$d" Package)" in
	postgresql-*-pg-tide) deb=$d ;;
	postgresql-*-pg-tide-redis) redis_deb=$d ;;
	*)
		echo "$d is neither postgresql-N-pg-tide nor postgresql-N-pg-tide-redis" >&2
		exit 2
		;;
	esac
done
if [ -z "$deb" ] || [ -z "$redis_deb" ]; then
	echo "$usage" >&2
	exit 2
fi
name=$(dpkg-deb -f "$deb" Package)
major=$(sed -n 's/^postgresql-\([0-9]\+\)-pg-tide$/\1/p' <<<"$name")
[ -n "$major" ] || {
	echo "$deb is not a postgresql-N-pg-tide package ($name)" >&2
	exit 1
}
if [ "$(dpkg-deb -f "$redis_deb" Package)" != "postgresql-$major-pg-tide-redis" ]; then
	echo "$redis_deb is not postgresql-$major-pg-tide-redis" >&2
	exit 1
fi
suite=$(chroot_suite_for "$major")
clean=$TIDE_CHROOT_BASE/$suite-pg$major-clean
dir=$TIDE_CHROOT_BASE/$suite-pg$major-pkgtest
lib=usr/lib/postgresql/$major/lib
# The extension's version the package must install by default.
want_version=$(dpkg-deb --fsys-tarfile "$deb" |
	tar -xOf - ./usr/share/postgresql/"$major"/extension/pg_tide.control |
	sed -n "s/^default_version = '\(.*\)'/\1/p")

# Fails unless package file $1 holds each of the files $3... and none of
# the files matching extended regular expression $2 (or "" for no such check).
check_files() {
	local pkg=$1 absent=$2 files f
	shift 2
	echo "== files of $(basename "$pkg")"
	files=$(dpkg-deb -c "$pkg" | awk '$NF ~ /\.(so|control|sql)$/ {print $NF}')
	echo "$files"
	for f in "$@"; do
		grep -qx "./$f" <<<"$files" || {
			echo "FAILED: $(basename "$pkg") has no /$f" >&2
			exit 1
		}
	done
	if [ -n "$absent" ] && grep -E "$absent" <<<"$files"; then
		echo "FAILED: $(basename "$pkg") holds the files above, which belong to other packages" >&2
		exit 1
	fi
}

# The core holds no broker module: it must not need a broker's library.
check_files "$deb" '/pg_tide_[a-z]+\.so$' "$lib/pg_tide.so" \
	"usr/share/postgresql/$major/extension/pg_tide.control" \
	"usr/share/postgresql/$major/extension/pg_tide--$want_version.sql"
check_files "$redis_deb" '' "$lib/pg_tide_redis.so"

make_clean_chroot "$major"
if chroot_has_mounts "$dir"; then
	echo "refusing to replace $dir: something is mounted below it" >&2
	exit 1
fi
rm -rf "$dir"
cp -a "$clean" "$dir"
debs=()
for d in "$deb" "$redis_deb"; do
	install -m 644 "$d" "$dir/tmp/$(basename "$d")"
	debs+=("./$(basename "$d")")
done
chroot_mount "$dir"

echo "== apt-get install ${debs[*]} in a clean $suite with postgresql-$major"
chroot_run "$dir" sh -c "cd /tmp && apt-get install -y -q --no-install-recommends ${debs[*]}"
# Before redis-server is there: the package's own dependencies must have
# brought everything its module needs.
echo "== the libraries of /$lib/pg_tide_redis.so"
chroot_run "$dir" ldd "/$lib/pg_tide_redis.so" | tee /tmp/pg_tide_pkg_ldd.$$
if grep -q 'not found' /tmp/pg_tide_pkg_ldd.$$; then
	rm -f /tmp/pg_tide_pkg_ldd.$$
	echo "FAILED: postgresql-$major-pg-tide-redis does not bring a library its module needs" >&2
	exit 1
fi
rm -f /tmp/pg_tide_pkg_ldd.$$
echo "== apt-get install redis-server (Debian's, for the redis pipeline)"
chroot_run "$dir" apt-get install -y -q --no-install-recommends redis-server

# Runs as postgres inside the chroot: $1 the PostgreSQL major version,
# $2 the extension version to expect, $3 a word no earlier run's messages
# hold. The cluster listens on its socket only, redis on 127.0.0.1: the
# chroot shares the host's network.
cat >"$dir/tmp/pg_tide_check.sh" <<'CHECK'
#!/bin/bash
set -euo pipefail
bin=/usr/lib/postgresql/$1/bin
want_version=$2
run=$3
payload="{\"order\": 42, \"check\": \"package-test $run\"}"
d=$(mktemp -d /tmp/pg_tide_pkg.XXXXXX)
redis_port=
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
# Stops what this script started; shows the server's log when it failed.
stop() {
	local rc=$?
	[ "$rc" -eq 0 ] || tail -n 40 "$d/server.log" >&2
	[ -z "$redis_port" ] || redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1 || true
	"$bin/pg_ctl" -D "$d/data" -m fast -w stop >/dev/null
}
trap stop EXIT
# Runs SQL $1 (from stdin, as psql interpolates :'var' only there) with
# variables payload, dir and $2..., given as name=value.
sql() {
	local cmd=$1 v vars=()
	shift
	for v in "payload=$payload" "dir=$d" "$@"; do vars+=(-v "$v"); done
	"$bin/psql" -h "$d" -X -q -v ON_ERROR_STOP=1 -At "${vars[@]}" <<<"$cmd"
}
# Whether JSON texts $1 and $2 are the same jsonb (the layout may differ).
same_json() {
	[ -n "$1" ] && [ "$(sql "SELECT :'a'::jsonb = :'b'::jsonb" "a=$1" "b=$2")" = t ]
}
# Waits up to 60 s for command $@ to print something; prints it.
wait_for() {
	local out i
	for i in $(seq 600); do
		out=$("$@" 2>/dev/null || true)
		[ -z "$out" ] || {
			echo "$out"
			return 0
		}
		sleep 0.1
	done
	return 1
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
same_json "$polled" "$payload" || {
	echo "FAILED: the polled payload is not the one published" >&2
	exit 1
}
# A broker sink whose package is not installed: its pipeline is refused,
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

# Delivery by the relay: a file pipeline and a redis pipeline, then one
# message for both.
sql "SELECT tide.relay_set_outbox('to_file', 'orders', 'to_file',
	jsonb_build_object('sink_type', 'file', 'path', :'dir' || '/orders.jsonl'))" >/dev/null
# A free port picked by the kernel, tried again if another process
# takes it before redis does.
for attempt in 1 2 3 4 5; do
	redis_port=$(perl -MIO::Socket::INET -e 'print IO::Socket::INET->new(Listen => 1, LocalAddr => "127.0.0.1", LocalPort => 0)->sockport')
	redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$d" --save '' --appendonly no \
		--daemonize yes --logfile "$d/redis.log" --pidfile "$d/redis.pid"
	wait_for redis-cli -p "$redis_port" ping >/dev/null && break
	redis_port=
done
[ -n "$redis_port" ] || {
	cat "$d/redis.log" >&2
	echo "FAILED: redis-server did not start" >&2
	exit 1
}
echo "redis-server $(redis-server --version | sed -n 's/.* v=\([^ ]*\).*/\1/p') on 127.0.0.1:$redis_port"
sql "SELECT tide.relay_set_outbox('to_redis', 'orders', 'to_redis',
	jsonb_build_object('sink_type', 'redis', 'url', 'redis://127.0.0.1:' || :'port' || '/0',
		'stream', 'orders'))" "port=$redis_port" >/dev/null
payload="{\"order\": 43, \"check\": \"package-test relay $run\"}"
sql "SELECT tide.outbox_publish('orders', :'payload')" >/dev/null
echo "published: $payload"
# A new pipeline's group starts at the outbox's first message: both come.
line=$(wait_for grep -F "relay $run" "$d/orders.jsonl") || {
	sql "SELECT * FROM tide.relay_pipeline_status" >&2 || true
	echo "FAILED: the file pipeline wrote nothing in 60 s" >&2
	exit 1
}
echo "the file pipeline wrote: $line"
same_json "$(sql "SELECT :'line'::jsonb -> 'payload'" "line=$line")" "$payload" || {
	echo "FAILED: the file pipeline wrote another payload" >&2
	exit 1
}
# The field after "payload" in each entry (docs/sinks/redis.md), of the
# message published last.
read_redis() {
	redis-cli -p "$redis_port" --raw XRANGE orders - + |
		awk 'prev == "payload" { print } { prev = $0 }' | grep -F "relay $run"
}
entry=$(wait_for read_redis) || {
	sql "SELECT * FROM tide.relay_pipeline_status" >&2 || true
	echo "FAILED: the redis pipeline added nothing to stream orders in 60 s" >&2
	exit 1
}
echo "redis-cli XRANGE orders: payload $entry"
same_json "$entry" "$payload" || {
	echo "FAILED: the redis stream holds another payload" >&2
	exit 1
}
CHECK
chmod 755 "$dir/tmp/pg_tide_check.sh"
echo "== a cluster with pg_tide preloaded: publish and poll, deliver through the relay"
chroot_run "$dir" runuser -u postgres -- /tmp/pg_tide_check.sh "$major" "$want_version" \
	"$$-$(date +%s%N)"
chroot_umount "$dir"
rm -rf "$dir"
echo "== package test passed: $name and postgresql-$major-pg-tide-redis $(dpkg-deb -f "$deb" Version) on $suite"
