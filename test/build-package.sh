#!/usr/bin/env bash
# Builds the Debian package postgresql-N-pg-tide, for each PostgreSQL
# version in debian/pgversions that this machine supports, with Debian's
# own tooling (pg_buildext, debhelper), from a copy of the tree so that the
# checkout is left as it was. Puts the .deb files into <outdir>. Needs
# debhelper, postgresql-server-dev-all and the build dependencies in
# debian/control. Run as root (CI) or as any user.
#   test/build-package.sh <outdir>
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:?usage: $0 <outdir>}
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=$(mktemp -d /tmp/pg_tide_deb.XXXXXX)
trap 'rm -rf "$build"' EXIT

mkdir "$build/pg-tide"
tar -C "$root" --exclude=.git --exclude='*.o' --exclude='*.so' --exclude='*.bc' \
	--exclude=test/receiver --exclude=test/sql_names -cf - . | tar -C "$build/pg-tide" -xf -
cd "$build/pg-tide"
# debian/control names the versions this machine supports (15 on bookworm,
# 17 on trixie), as debian/control.in says.
pg_buildext updatecontrol
# PG_CFLAGS (CI sets -Werror) reaches the Makefile through pg_buildext.
# No -dbgsym package: nothing here installs it.
DEB_BUILD_OPTIONS="${DEB_BUILD_OPTIONS:+$DEB_BUILD_OPTIONS }noautodbgsym" dpkg-buildpackage -us -uc -b
for deb in "$build"/*.deb; do
	echo "== $(basename "$deb")"
	dpkg-deb -c "$deb" | awk '$NF ~ /\.(so|control|sql)$/ {print $NF}'
	cp "$deb" "$out/"
done
