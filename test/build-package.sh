#!/usr/bin/env bash
# Builds the Debian packages, for each PostgreSQL version N in
# debian/pgversions that this machine supports: postgresql-N-pg-tide (the
# core: webhook and file sinks) and postgresql-N-pg-tide-<sink> for each
# broker sink (kafka, nats, redis, rabbitmq, mqtt), with Debian's own
# tooling (pg_buildext, debhelper), from a copy of the tree so that the
# checkout is left as it was. Puts the .deb files into <outdir>. As root it
# installs what the build needs (debhelper, postgresql-server-dev-all and
# the Build-Depends of debian/control.in); as another user it says what is
# missing. On Debian 12 that builds them for PostgreSQL 15:
#   sudo test/build-package.sh <outdir>
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:?usage: $0 <outdir>}
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=$(mktemp -d /tmp/pg_tide_deb.XXXXXX)
trap 'rm -rf "$build"' EXIT

mkdir "$build/pg-tide"
# <outdir> inside the checkout (debs, say) holds earlier builds: not copied.
skip_out=()
[ "${out#"$root"/}" = "$out" ] || skip_out=(--exclude="./${out#"$root"/}")
tar -C "$root" --exclude=.git --exclude='*.o' --exclude='*.so' --exclude='*.bc' \
	--exclude=test/receiver --exclude=test/sql_names "${skip_out[@]}" -cf - . | tar -C "$build/pg-tide" -xf -
cd "$build/pg-tide"

# Runs apt-get $@ (as root) without questions, updating apt's lists first
# when they are missing or stale.
apt_get() {
	export DEBIAN_FRONTEND=noninteractive
	apt-get -y -q --no-install-recommends "$@" || { apt-get update -q && apt-get -y -q --no-install-recommends "$@"; }
}

# pg_buildext (postgresql-server-dev-all) writes debian/control, which
# names the versions this machine supports (15 on bookworm, 17 on trixie),
# as debian/control.in says; then apt installs its Build-Depends.
if [ "$(id -u)" -eq 0 ]; then
	apt_get install dpkg-dev debhelper postgresql-server-dev-all
	pg_buildext updatecontrol
	apt_get build-dep ./
else
	command -v pg_buildext >/dev/null || {
		echo "pg_buildext is missing: install postgresql-server-dev-all, or run this as root" >&2
		exit 1
	}
	pg_buildext updatecontrol
fi
dpkg-checkbuilddeps
# PG_CFLAGS (CI sets -Werror) reaches the Makefile through pg_buildext.
# No -dbgsym package: nothing here installs it.
DEB_BUILD_OPTIONS="${DEB_BUILD_OPTIONS:+$DEB_BUILD_OPTIONS }noautodbgsym" dpkg-buildpackage -us -uc -b
for deb in "$build"/*.deb; do
	echo "== $(basename "$deb")"
	dpkg-deb -c "$deb" | awk '$NF ~ /\.(so|control|sql)$/ {print $NF}'
	cp "$deb" "$out/"
done
