#!/usr/bin/env bash
# Debian chroots made with debootstrap from the mirror this machine's apt
# already uses. test/run-in-chroot.sh runs the tests on other PostgreSQL
# versions in them; test/package-test.sh installs the built .deb in a clean
# one. Sourced by both; they run as root with `set -euo pipefail` and call
# chroot_cleanup from an EXIT trap, so no mount or process outlives them.

TIDE_CHROOT_BASE=${TIDE_CHROOT_BASE:-/var/tmp/pg_tide_chroots}
# Mount points made by chroot_mount, in the order they were made.
chroot_mounted=()

# The Debian suite whose postgresql-N package is PostgreSQL major version $1.
chroot_suite_for() {
	case "$1" in
	15) echo bookworm ;;
	17) echo trixie ;;
	18) echo sid ;;
	*)
		echo "no Debian suite packages PostgreSQL $1 (16 has no Debian package)" >&2
		return 1
		;;
	esac
}

# The main archive's URI in this machine's apt sources (deb822 or one-line
# format), so chroots use the mirror the machine already uses.
chroot_mirror() {
	local uris uri
	uris=$({
		cat /etc/apt/sources.list.d/*.sources 2>/dev/null | sed -n 's/^URIs:[[:space:]]*//p'
		cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
			sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p'
	} | tr -s ' \t' '\n\n')
	for uri in $uris; do
		case "$uri" in
		*security*) ;;
		http://* | https://*)
			echo "${uri%/}"
			return 0
			;;
		esac
	done
	echo "no Debian mirror found in /etc/apt/sources.list{,.d}" >&2
	return 1
}

# This machine's Debian codename (bookworm on CI).
chroot_host_suite() {
	. /etc/os-release && echo "${VERSION_CODENAME:-}"
}

# Whether anything is mounted at or below directory $1.
chroot_has_mounts() {
	findmnt -rn -o TARGET | grep -q -e "^$1$" -e "^$1/"
}

# Creates chroot $1 of suite $2 with packages $3... installed, unless it
# was made before with the same suite and packages (a marker file says so).
chroot_create() {
	local dir=$1 suite=$2
	shift 2
	local want="$suite $*" mirror
	if [ -f "$dir/.tide-chroot" ] && [ "$(cat "$dir/.tide-chroot")" = "$want" ]; then
		echo "reusing chroot $dir ($suite)"
		return 0
	fi
	case "$dir" in
	"$TIDE_CHROOT_BASE"/?*) ;;
	*)
		echo "refusing to create $dir outside $TIDE_CHROOT_BASE" >&2
		return 1
		;;
	esac
	if chroot_has_mounts "$dir"; then
		echo "refusing to replace $dir: something is mounted below it" >&2
		return 1
	fi
	mirror=$(chroot_mirror)
	rm -rf "$dir"
	mkdir -p "$TIDE_CHROOT_BASE"
	echo "debootstrap $suite from $mirror into $dir"
	debootstrap --variant=minbase "$suite" "$dir" "$mirror"

	if [ "$suite" = "$(chroot_host_suite)" ]; then
		# The host's own suites (updates, security), as its packages come from them.
		rm -f "$dir/etc/apt/sources.list"
		cp -a /etc/apt/sources.list.d/. "$dir/etc/apt/sources.list.d/"
		[ ! -f /etc/apt/sources.list ] || cp /etc/apt/sources.list "$dir/etc/apt/"
	else
		echo "deb $mirror $suite main" >"$dir/etc/apt/sources.list"
	fi
	# sid's Release file on the mirror can be past its Valid-Until date.
	echo 'Acquire::Check-Valid-Until "false";' >"$dir/etc/apt/apt.conf.d/90pg-tide"
	# A throwaway tree: dpkg need not fsync every file.
	echo force-unsafe-io >"$dir/etc/dpkg/dpkg.cfg.d/90pg-tide"
	# No service may start inside (the chroot shares the host's network),
	# and postgresql-N must not create a main cluster.
	printf '#!/bin/sh\nexit 101\n' >"$dir/usr/sbin/policy-rc.d"
	chmod +x "$dir/usr/sbin/policy-rc.d"
	mkdir -p "$dir/etc/postgresql-common"
	echo 'create_main_cluster = false' >"$dir/etc/postgresql-common/createcluster.conf"
	cp /etc/resolv.conf "$dir/etc/resolv.conf"

	chroot_mount "$dir"
	chroot_run "$dir" apt-get update -q
	chroot_run "$dir" apt-get install -y -q --no-install-recommends "$@"
	chroot_run "$dir" apt-get clean
	chroot_umount "$dir"
	echo "$want" >"$dir/.tide-chroot"
}

# Mounts /proc, /sys and /dev into chroot $1, with a /dev/shm of its own
# (PostgreSQL's dynamic shared memory must not meet the host's).
chroot_mount() {
	local dir=$1
	chroot_clear_stale_mounts "$dir"
	mount -t proc proc "$dir/proc"
	chroot_mounted+=("$dir/proc")
	mount -t sysfs sysfs "$dir/sys"
	chroot_mounted+=("$dir/sys")
	mount --bind /dev "$dir/dev"
	chroot_mounted+=("$dir/dev")
	mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$dir/dev/shm"
	chroot_mounted+=("$dir/dev/shm")
}

# Unmounts what a run killed before its EXIT trap left mounted in chroot
# $1 (a second mount on top would fail with "already mounted", exit 32).
# Runs in one chroot never overlap, so whatever is there is stale.
chroot_clear_stale_mounts() {
	local dir=$1 m
	chroot_stop_processes "$dir"
	for m in dev/shm dev sys proc; do
		if mountpoint -q "$dir/$m"; then
			echo "unmounting $dir/$m, left by an earlier run"
			umount "$dir/$m" 2>/dev/null || umount -l "$dir/$m"
		fi
	done
}

# Stops the processes still running inside chroot $1 (a server a failed
# test left behind): they were started by this script, and they would keep
# the mounts busy.
chroot_stop_processes() {
	local dir=$1 pid pids=() i
	for pid in $(ls /proc | grep -E '^[0-9]+$'); do
		[ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$dir" ] && pids+=("$pid")
	done
	[ ${#pids[@]} -gt 0 ] || return 0
	echo "stopping processes left in $dir: ${pids[*]}"
	kill -TERM "${pids[@]}" 2>/dev/null || true
	for i in $(seq 50); do
		kill -0 "${pids[@]}" 2>/dev/null || return 0
		sleep 0.1
	done
	kill -KILL "${pids[@]}" 2>/dev/null || true
}

# Unmounts what chroot_mount mounted into chroot $1, innermost first.
chroot_umount() {
	local dir=$1 i m keep=()
	chroot_stop_processes "$dir"
	for ((i = ${#chroot_mounted[@]} - 1; i >= 0; i--)); do
		m=${chroot_mounted[$i]}
		case "$m" in
		"$dir"/*) umount "$m" 2>/dev/null || umount -l "$m" ;;
		*) keep=("$m" "${keep[@]}") ;;
		esac
	done
	chroot_mounted=("${keep[@]}")
}

# Unmounts every chroot this script mounted (for the EXIT trap).
chroot_cleanup() {
	local m dirs=()
	for m in "${chroot_mounted[@]}"; do
		case "$m" in */proc) dirs+=("${m%/proc}") ;; esac
	done
	for m in "${dirs[@]}"; do
		chroot_umount "$m"
	done
}

# Runs a command in chroot $1 with a clean environment; VAR=value words
# before the command set variables (env's syntax).
chroot_run() {
	local dir=$1
	shift
	chroot "$dir" /usr/bin/env -i \
		PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"
}
