#!/usr/bin/env bash
# Installs CRIU from Debian 13 (trixie) into a private prefix on a Debian 12 (bookworm) machine,
# without touching the system's apt sources, its package state or its libc. See docs/CRIU.md.
#
#   scripts/install-criu.sh            # as root; quiet unless something fails
#
# Result (PREFIX = $GPUCKPT_CRIU_PREFIX, default /opt/gpuckpt-criu):
#   PREFIX/bin/criu                    wrapper: trixie's criu run by trixie's own ld.so and libraries
#   PREFIX/include/criu/criu-plugin.h  plugin header of the same CRIU version (and criu.h, version.h, ...)
#   PREFIX/root/                       the extracted trixie packages (criu and its runtime libraries)
#   PREFIX/share/gpuckpt-criu/packages.txt   exact package versions installed
#
# How: a private apt configuration (PREFIX/var/apt: its own sources list naming only trixie, its
# own lists and an empty dpkg status) resolves criu's dependency closure and downloads the .debs;
# `dpkg-deb -x` unpacks them under PREFIX/root. Nothing is installed with dpkg, the system's apt
# never sees trixie, so no system package can be upgraded by this.
#
# Environment:
#   GPUCKPT_CRIU_PREFIX     install prefix (default /opt/gpuckpt-criu)
#   GPUCKPT_CRIU_VERSION    exact Debian version of criu to install (default: trixie's current one)
#   GPUCKPT_DEBIAN_MIRROR   Debian mirror (default http://deb.debian.org/debian)
#   GPUCKPT_CRIU_REINSTALL  1: download and unpack again even if already installed
#   GPUCKPT_CRIU_NO_SMOKE   1: skip the dump+restore smoke test (criu check still runs)
set -euo pipefail

prefix=${GPUCKPT_CRIU_PREFIX:-/opt/gpuckpt-criu}
want_version=${GPUCKPT_CRIU_VERSION:-}
mirror=${GPUCKPT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=trixie
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
me=install-criu.sh

die() {
  echo "$me: $*" >&2
  exit 1
}

[ "$(id -u)" = 0 ] || die "must run as root (criu needs root; the prefix is $prefix)"
for c in apt-get apt-cache dpkg dpkg-deb flock mktemp setsid timeout readlink; do
  command -v "$c" >/dev/null 2>&1 || die "'$c' is missing (a Debian 12 system with apt is expected)"
done
[ "$(dpkg --print-architecture)" = amd64 ] || die "only amd64 is supported (this is $(dpkg --print-architecture))"
[ -r "$keyring" ] || die "$keyring is missing: apt-get install debian-archive-keyring"
case $prefix in /*) ;; *) die "GPUCKPT_CRIU_PREFIX must be an absolute path (got '$prefix')" ;; esac

mkdir -p "$prefix"
exec 9>"$prefix/.install.lock"
flock 9 || die "cannot lock $prefix/.install.lock"

work=$(mktemp -d /tmp/gpuckpt-install-criu.XXXXXX)
smoke_pids=()
cleanup() {
  local p
  for p in "${smoke_pids[@]}"; do kill -9 "$p" 2>/dev/null || :; done
  rm -rf "$work"
}
trap cleanup EXIT
log=$work/log

# quiet WHAT CMD...: runs CMD with its output in $log; on failure says WHAT failed, shows the
# tail of that output and exits.
quiet() {
  local what=$1
  shift
  if ! "$@" >>"$log" 2>&1; then
    echo "$me: $what failed:" >&2
    tail -n 25 "$log" | sed 's/^/  /' >&2
    exit 1
  fi
}

stamp=$prefix/share/gpuckpt-criu/packages.txt
wrapper=$prefix/bin/criu
root=$prefix/root

installed_version() {
  [ -f "$stamp" ] && [ -x "$wrapper" ] && [ -x "$root/usr/sbin/criu" ] \
    && [ -f "$prefix/include/criu/criu-plugin.h" ] || return 1
  awk '$1 == "criu" { print $2 }' "$stamp"
}

# ---------------------------------------------------------------- private apt configuration
aptdir=$prefix/var/apt
apt_opts=()
setup_apt() {
  mkdir -p "$aptdir"/{etc/sources.list.d,etc/preferences.d,lists/partial,cache/archives/partial}
  : >"$aptdir/status"
  local src="deb [signed-by=$keyring] $mirror $suite main"
  [ "${1:-}" = with-src ] && src+=$'\n'"deb-src [signed-by=$keyring] $mirror $suite main"
  printf '%s\n' "$src" >"$aptdir/etc/sources.list"
  # Command-line options win over anything in /etc/apt/apt.conf.d (proxies there still apply).
  apt_opts=(
    -o "Dir::Etc::SourceList=$aptdir/etc/sources.list"
    -o "Dir::Etc::SourceParts=$aptdir/etc/sources.list.d"
    -o "Dir::Etc::Preferences=$aptdir/etc/preferences"
    -o "Dir::Etc::PreferencesParts=$aptdir/etc/preferences.d"
    -o "Dir::State::Lists=$aptdir/lists"
    -o "Dir::State::status=$aptdir/status"
    -o "Dir::Cache=$aptdir/cache"
    -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
    -o "APT::Architecture=amd64" -o "APT::Architectures=amd64"
    -o "APT::Default-Release=$suite"
    -o "APT::Install-Recommends=false" -o "APT::Install-Suggests=false"
    -o "Acquire::Languages=none"
  )
  chown -R _apt "$aptdir/lists/partial" "$aptdir/cache/archives/partial" 2>/dev/null || :
  quiet "apt-get update of the private Debian $suite lists ($mirror)" \
    apt-get "${apt_opts[@]}" -q update
}

# ---------------------------------------------------------------- download and unpack
have=$(installed_version || :)
if [ -n "$have" ] && [ "${GPUCKPT_CRIU_REINSTALL:-0}" != 1 ] \
  && { [ -z "$want_version" ] || [ "$want_version" = "$have" ]; }; then
  : # already installed: only the checks below
else
  setup_apt
  version=$want_version
  if [ -z "$version" ]; then
    version=$(apt-cache "${apt_opts[@]}" policy criu 2>>"$log" | awk '/Candidate:/ { print $2 }')
    if [ -z "$version" ] || [ "$version" = "(none)" ]; then
      die "no criu package in Debian $suite at $mirror"
    fi
  fi
  rm -f "$aptdir"/cache/archives/*.deb
  quiet "downloading criu=$version and its dependencies from Debian $suite" \
    env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" -q -y --download-only \
    install "criu=$version" "libcriu-dev=$version"
  debs=("$aptdir"/cache/archives/*.deb)
  [ -e "${debs[0]}" ] || die "apt downloaded nothing for criu=$version (see $log)"

  new=$prefix/root.new
  rm -rf "$new"
  mkdir -p "$new" "$work/share"
  : >"$work/share/packages.txt"
  for d in "${debs[@]}"; do
    quiet "unpacking $d" dpkg-deb -x "$d" "$new"
    # shellcheck disable=SC2016 # dpkg-query's ${Field} syntax, not the shell's
    dpkg-deb --show --showformat='${Package} ${Version}\n' "$d" >>"$work/share/packages.txt"
  done
  sort -o "$work/share/packages.txt" "$work/share/packages.txt"
  [ -x "$new/usr/sbin/criu" ] || die "criu=$version did not unpack usr/sbin/criu"
  [ -x "$new/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" ] \
    || die "trixie's libc6 did not unpack usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"

  # The plugin header: libcriu-dev ships it; if a version ever does not, take it from the source
  # package of the same version (only the upstream tarball is fetched; apt checks its hash).
  mkdir -p "$work/include/criu"
  if [ -f "$new/usr/include/criu/criu-plugin.h" ]; then
    cp -a "$new"/usr/include/criu/. "$work/include/criu/"
  else
    setup_apt with-src
    mkdir -p "$work/src"
    chown _apt "$work/src" 2>/dev/null || :
    (cd "$work/src" && quiet "downloading the criu=$version source tarball" apt-get "${apt_opts[@]}" -q source --download-only --tar-only "criu=$version")
    tarball=$(find "$work/src" -maxdepth 1 -name 'criu_*.orig.tar.*' | head -n1)
    [ -n "$tarball" ] || die "no criu-plugin.h in libcriu-dev and no source tarball for criu=$version"
    quiet "extracting criu-plugin.h from $tarball" tar -xf "$tarball" -C "$work/src" --wildcards '*/criu/include/criu-plugin.h'
    cp "$work"/src/*/criu/include/criu-plugin.h "$work/include/criu/"
  fi

  # Swap the new tree in (a running criu keeps its mapped files; no half-written prefix).
  rm -rf "$prefix/root.old"
  [ -d "$root" ] && mv "$root" "$prefix/root.old"
  mv "$new" "$root"
  rm -rf "$prefix/root.old" "$prefix/include/criu"
  mkdir -p "$prefix/include" "$prefix/bin" "$prefix/share/gpuckpt-criu" "$prefix/lib/criu"
  cp -a "$work/include/criu" "$prefix/include/criu"

  cat >"$wrapper.new" <<EOF
#!/bin/sh
# gpuckpt: CRIU $version from Debian $suite, installed by scripts/install-criu.sh (docs/CRIU.md).
# criu needs glibc >= 2.38, so it runs with trixie's own loader and libraries from the prefix;
# --library-path (not LD_LIBRARY_PATH) keeps them away from anything criu executes.
root=\$(dirname "\$(readlink -f "\$0")")/../root
exec "\$root/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" --argv0 criu \\
  --library-path "\$root/usr/lib/x86_64-linux-gnu:\$root/lib/x86_64-linux-gnu" \\
  "\$root/usr/sbin/criu" "\$@"
EOF
  chmod 755 "$wrapper.new"
  mv "$wrapper.new" "$wrapper"
  cp "$work/share/packages.txt" "$stamp"
  rm -rf "$aptdir/lists" "$aptdir/cache/srcpkgcache.bin" "$aptdir/cache/pkgcache.bin"
fi

# ---------------------------------------------------------------- checks
got=$("$wrapper" --version 2>&1) || die "$wrapper --version failed: $got"
ver=$(printf '%s\n' "$got" | awk '/^Version:/ { print $2 }')
[ -n "$ver" ] || die "unexpected output of $wrapper --version: $got"

if ! out=$(timeout 120 "$wrapper" check 2>&1); then
  echo "$me: '$wrapper check' failed: this kernel cannot run CRIU $ver:" >&2
  printf '%s\n' "$out" | sed 's/^/  /' >&2
  exit 1
fi

if [ "${GPUCKPT_CRIU_NO_SMOKE:-0}" = 1 ]; then
  echo "criu $ver at $wrapper: criu check OK (smoke test skipped)"
  exit 0
fi

# Smoke test: a bash loop (no child processes; it sleeps with `read -t` on a FIFO nobody writes)
# appends a counter to a file (it must not inherit fd 9: CRIU refuses tasks holding file locks); dump it (criu kills it), reap it so its pid is free again, restore
# it detached, and check that the counter continues exactly where it stopped.
smoke_fail() {
  echo "$me: smoke test failed: $*" >&2
  local f
  for f in "$work"/img/*.log; do
    [ -f "$f" ] || continue
    echo "  --- $(basename "$f") (errors / last lines):" >&2
    { grep -E 'Error|FAIL' "$f" | grep -v RLIMIT_NOFILE || tail -n 8 "$f"; } | tail -n 12 | sed 's/^/  /' >&2
  done
  exit 1
}
last_line() { tail -n 1 "$work/counter" 2>/dev/null || :; }
wait_count() { # wait until the counter file's last value reaches $1
  local _ v
  for _ in $(seq 1 100); do
    v=$(last_line)
    [ -n "$v" ] && [ "$v" -ge "$1" ] && return 0
    sleep 0.1
  done
  return 1
}

mkfifo "$work/fifo"
mkdir "$work/img"
# shellcheck disable=SC2016 # the loop's variables belong to the inner bash
setsid bash -c 'echo $$ >"$3"; exec 3<>"$1"; i=0
  while :; do echo $i >>"$2"; i=$((i + 1)); read -t 0.05 -u 3 || :; done' \
  smoke "$work/fifo" "$work/counter" "$work/smoke.pid" </dev/null >/dev/null 2>&1 9>&- &
child=$!
disown "$child" # no job-status message when the dump kills it; bash still reaps it
smoke_pids+=("$child")
wait_count 5 || smoke_fail "the test process did not start counting"
pid=$(cat "$work/smoke.pid")
smoke_pids+=("$pid")

timeout 120 "$wrapper" dump -t "$pid" -D "$work/img" -o dump.log -v4 >>"$log" 2>&1 \
  || smoke_fail "criu dump of pid $pid failed"
# Until its zombie is reaped the pid is taken, and restore needs that very pid.
for _ in $(seq 1 100); do [ -e "/proc/$pid" ] || break; sleep 0.1; done
[ ! -e "/proc/$pid" ] || smoke_fail "pid $pid still exists after the dump (not reaped?)"
at_dump=$(last_line)
timeout 120 "$wrapper" restore -D "$work/img" -d -o restore.log -v4 --pidfile "$work/restored.pid" \
  >>"$log" 2>&1 || smoke_fail "criu restore failed"
rpid=$(cat "$work/restored.pid")
smoke_pids+=("$rpid")
wait_count $((at_dump + 5)) || smoke_fail "the restored process (pid $rpid) does not count on"
# The counter must go on from exactly the value after the one printed before the dump.
next=$(awk -v n="$at_dump" 'f { print; exit } $1 == n { f = 1 }' "$work/counter")
[ "$next" = $((at_dump + 1)) ] || smoke_fail "counter jumped from $at_dump to $next after restore"
kill -9 "$rpid" 2>/dev/null || :
smoke_pids=()
echo "criu $ver at $wrapper: criu check OK; dump+restore smoke test OK" \
  "(pid $pid, counter $at_dump -> $(last_line) after restore)"
