#!/usr/bin/env bash
# Shared set-up for test/demo.sh and test/run-tests.sh: packages, build,
# install, and a throwaway cluster with pg_tide preloaded. Runs as root;
# the cluster runs as the postgres user because initdb refuses root.
set -euo pipefail

TIDE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PG_MAJOR=${PG_MAJOR:-15}
# The chosen version's own pg_config (/usr/bin/pg_config picks the newest
# installed version); a relocated copy of a server works too.
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/$PG_MAJOR/bin/pg_config}
PG_BIN=/usr/lib/postgresql/$PG_MAJOR/bin
[ -x "$PG_CONFIG" ] && PG_BIN=$("$PG_CONFIG" --bindir)
TIDE_CLUSTER=${TIDE_CLUSTER:-/tmp/pg_tide_cluster}
TIDE_PORT=${TIDE_PORT:-5499}
export PGHOST=$TIDE_CLUSTER PGPORT=$TIDE_PORT PGUSER=postgres

log() { printf '\n== %s\n' "$*"; }

# Debian packages the build and the tests need (pkgconf: the Makefile asks
# pkg-config for the brokers' flags; libmicrohttpd-dev for test/receiver,
# the webhook receiver of the TAP tests and the demo; libpg-query-dev for
# test/sql_names, which checks the C code's SQL; libvalijson-dev and
# nlohmann-json3-dev for the JSON Schema module, and
# libtest-json-schema-acceptance-perl for the official JSON-Schema-Test-Suite
# its conformance runner reads; the brokers' libraries and servers). test/quick-start-chroot.sh checks that a clean Debian 12 needs
# nothing more.
# test/run-in-chroot.sh installs the same ones into its chroots.
tide_packages() {
	echo build-essential pkgconf postgresql-$PG_MAJOR postgresql-server-dev-$PG_MAJOR \
		postgresql-client-$PG_MAJOR libcurl4-openssl-dev libcjson-dev libssl-dev libipc-run-perl \
		libmicrohttpd-dev libpg-query-dev libvalijson-dev nlohmann-json3-dev \
		libtest-json-schema-acceptance-perl $(tide_broker_packages)
}

# The broker sinks' client libraries and libpq's (the Makefile builds a
# sink's module only where its library is installed) and the brokers their tests start;
# iproute2's ip brings up the loopback of TAP 047's network namespace; the
# brokers' own clients that docs/sinks/local.md reads with (TAP 059).
tide_broker_packages() {
	echo librdkafka-dev libnats-dev libhiredis-dev librabbitmq-dev libmosquitto-dev libpq-dev \
		redis-server nats-server rabbitmq-server mosquitto mosquitto-clients iproute2 \
		redis-tools amqp-tools kcat
}

# Installs those of tide_packages that are missing.
tide_install_packages() {
	local pkgs
	read -r -a pkgs <<<"$(tide_packages)"
	local missing=()
	for p in "${pkgs[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	if [ ${#missing[@]} -gt 0 ]; then
		log "installing ${missing[*]}"
		export DEBIAN_FRONTEND=noninteractive
		apt-get install -y --no-install-recommends "${missing[@]}" ||
			{ apt-get update && apt-get install -y --no-install-recommends "${missing[@]}"; }
	fi
}

# Builds and installs pg_tide into the server's directories.
tide_build_install() {
	log "building pg_tide"
	make -C "$TIDE_ROOT" -s PG_CONFIG="$PG_CONFIG" clean >/dev/null 2>&1 || true
	# PG_CFLAGS (CI sets -Werror) comes from the environment, so the
	# Makefile's own warning flags are added to it rather than replaced.
	make -C "$TIDE_ROOT" -s PG_CONFIG="$PG_CONFIG"
	make -C "$TIDE_ROOT" -s PG_CONFIG="$PG_CONFIG" install
}

# Stops the throwaway cluster if it runs.
tide_stop_cluster() {
	if [ -f "$TIDE_CLUSTER/data/postmaster.pid" ]; then
		runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$TIDE_CLUSTER/data" -m fast -w stop >/dev/null || true
	fi
}

# A fresh cluster in $TIDE_CLUSTER, listening on 127.0.0.1 and a socket there;
# $TIDE_EXTRA_CONF is appended to its postgresql.conf.
tide_start_cluster() {
	tide_stop_cluster
	rm -rf "$TIDE_CLUSTER"
	mkdir -p "$TIDE_CLUSTER"
	chown postgres: "$TIDE_CLUSTER"
	log "starting a throwaway cluster in $TIDE_CLUSTER (port $TIDE_PORT)"
	runuser -u postgres -- "$PG_BIN/initdb" -D "$TIDE_CLUSTER/data" -A trust -U postgres >/dev/null
	cat >>"$TIDE_CLUSTER/data/postgresql.conf" <<CONF
shared_preload_libraries = 'pg_tide'
listen_addresses = '127.0.0.1'
port = $TIDE_PORT
unix_socket_directories = '$TIDE_CLUSTER'
CONF
	# Callers add settings of their own, for example fsync = off for tests.
	printf '%s\n' "${TIDE_EXTRA_CONF:-}" >>"$TIDE_CLUSTER/data/postgresql.conf"
	runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$TIDE_CLUSTER/data" -l "$TIDE_CLUSTER/server.log" -w start >/dev/null
}

# Prints the server log, for failures.
tide_show_server_log() {
	if [ -f "$TIDE_CLUSTER/server.log" ]; then
		log "server log ($TIDE_CLUSTER/server.log)"
		tail -n 200 "$TIDE_CLUSTER/server.log"
	fi
}
