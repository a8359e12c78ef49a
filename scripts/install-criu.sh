#!/usr/bin/env bash
# Builds CRIU >= 4.2 from Debian's own source package (forky, else sid) natively on this Debian 12
# (bookworm) machine, against the system's glibc and libraries, and installs it into a private
# prefix. See docs/CRIU.md for why (kernels >= 6.16 need CRIU 4.2 to dump TCP sockets) and how.
#
#   scripts/install-criu.sh            # as root; quiet unless something fails
#
# Result (PREFIX = $GPUCKPT_CRIU_PREFIX, default /opt/gpuckpt-criu):
#   PREFIX/bin/criu                    criu, a native build (system loader, system libraries)
#   PREFIX/include/criu/criu-plugin.h  plugin header of the same CRIU version (and criu-log.h)
#   PREFIX/lib/libcriu.so.2            CRIU's RPC library, with criu.h and PREFIX/lib/pkgconfig/
#                                      criu.pc: what scripts/install-crun.sh builds crun against
#   PREFIX/share/gpuckpt-criu/build.txt   source version, tarball hash, patches, compiler, glibc
#
# gpuckpt's own patches in scripts/criu-patches/*.patch are applied, in name order, before the
# build (docs/CRIU.md, "Huge-page fill", "Parallel fill" and "Streaming into a runtime's CRIU"); a
# changed patch set rebuilds CRIU.
#
# How: a private apt configuration (PREFIX/var/apt: its own sources list naming only the deb-src
# lines of forky and sid, its own lists and an empty dpkg status) downloads the source package's
# upstream tarball; apt checks it against the suite's signed Sources index. The build
# dependencies are bookworm packages, installed with the system's apt. Nothing from forky or sid
# is installed as a package, so no system package can be upgraded by this.
#
# Environment:
#   GPUCKPT_CRIU_PREFIX     install prefix (default /opt/gpuckpt-criu)
#   GPUCKPT_CRIU_VERSION    exact Debian source version of criu to build (default: the newest of
#                           forky and sid, which must be >= 4.2)
#   GPUCKPT_DEBIAN_MIRROR   Debian mirror (default http://deb.debian.org/debian)
#   GPUCKPT_CRIU_REINSTALL  1: download and build again even if already installed
#   GPUCKPT_CRIU_NO_SMOKE   1: skip the dump+restore smoke tests (criu check still runs)
set -euo pipefail

prefix=${GPUCKPT_CRIU_PREFIX:-/opt/gpuckpt-criu}
want_version=${GPUCKPT_CRIU_VERSION:-}
mirror=${GPUCKPT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
suites=(forky sid)
min_upstream=4.2 # "criu/sockets: Restrict SO_PASSCRED and SO_PASSSEC to supported families"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
me=install-criu.sh
here=$(cd "$(dirname "$0")/.." && pwd)

# Build dependencies from bookworm (the subset of the source package's Build-Depends that the
# criu binary needs; documentation and the Python library are not built).
build_deps=(build-essential pkg-config libprotobuf-c-dev protobuf-c-compiler libprotobuf-dev
  protobuf-compiler python3-protobuf libnl-3-dev libnet1-dev libcap-dev libbsd-dev
  libgnutls28-dev uuid-dev libnftables-dev xz-utils patch)

die() {
  echo "$me: $*" >&2
  exit 1
}

[ "$(id -u)" = 0 ] || die "must run as root (criu needs root; the prefix is $prefix)"
for c in apt-get apt-cache dpkg dpkg-query flock mktemp setsid timeout make python3; do
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
# shellcheck source=scripts/debian-src.sh
. "$here/scripts/debian-src.sh"

stamp=$prefix/share/gpuckpt-criu/build.txt
binary=$prefix/bin/criu

patches=()
for p in "$here"/scripts/criu-patches/*.patch; do [ -f "$p" ] && patches+=("$p"); done
# One hash over the patches' names and contents: what build.txt records and compares.
patch_set() {
  local p
  for p in "${patches[@]}"; do
    basename "$p"
    cat "$p"
  done | sha256sum | cut -d' ' -f1
}

installed_version() {
  [ -f "$stamp" ] && [ -x "$binary" ] && [ -f "$prefix/include/criu/criu-plugin.h" ] \
    && [ -f "$prefix/lib/libcriu.so.2" ] || return 1
  [ "$(awk '$1 == "patches" { print $2 }' "$stamp")" = "$(patch_set)" ] || return 1
  awk '$1 == "source" { print $2 }' "$stamp"
}

# ---------------------------------------------------------------- private apt configuration
aptdir=$prefix/var/apt
apt_opts=()

# The newest source version of criu in the private lists.
newest_source_version() {
  apt-cache "${apt_opts[@]}" showsrc criu 2>>"$log" | awk '/^Version:/ { print $2 }' \
    | sort -V | tail -n 1
}

# ---------------------------------------------------------------- download and build
have=$(installed_version || :)
if [ -n "$have" ] && [ "${GPUCKPT_CRIU_REINSTALL:-0}" != 1 ] \
  && { [ -z "$want_version" ] || [ "$want_version" = "$have" ]; }; then
  : # already installed: only the checks below
else
  install_missing "CRIU's build dependencies" "${build_deps[@]}"

  private_apt "$aptdir" "$mirror" "$keyring" "${suites[@]}"
  version=${want_version:-$(newest_source_version)}
  [ -n "$version" ] || die "no criu source package in Debian ${suites[*]} at $mirror"
  upstream=${version#*:}
  upstream=${upstream%-*}
  [ "$(printf '%s\n%s\n' "$min_upstream" "$upstream" | sort -V | head -n1)" = "$min_upstream" ] \
    || die "criu $version is older than $min_upstream, which kernels >= 6.16 need (docs/CRIU.md)"

  # Only the upstream tarball: Debian's packaging builds documentation and the Python library
  # too, which gpuckpt does not use. apt verifies the tarball against the signed index.
  mkdir -p "$work/src"
  chown _apt "$work/src" 2>/dev/null || :
  (cd "$work/src" && quiet "downloading the criu=$version source tarball" \
    apt-get "${apt_opts[@]}" -q source --download-only --tar-only "criu=$version")
  tarball=$(find "$work/src" -maxdepth 1 -name 'criu_*.orig.tar.*' | head -n1)
  [ -n "$tarball" ] || die "apt downloaded no criu_*.orig.tar.* for criu=$version (see $log)"
  quiet "unpacking $tarball" tar -xf "$tarball" -C "$work/src"
  srcdir=$(find "$work/src" -mindepth 1 -maxdepth 1 -type d -name 'criu-*' | head -n1)
  [ -n "$srcdir" ] || die "$tarball has no criu-* directory"
  grep -q 'family == AF_UNIX || family == AF_NETLINK' "$srcdir/criu/sockets.c" \
    || die "criu=$version lacks the SO_PASSCRED/SO_PASSSEC family check (TCP dumps fail on >= 6.16)"

  for p in "${patches[@]}"; do
    quiet "applying $(basename "$p") to criu=$version" patch -p1 --forward -d "$srcdir" -i "$p"
  done

  jobs=$(nproc)
  # CRIU's own Makefile; WERROR=0 because a newer compiler's new warnings are not our failure.
  quiet "building criu=$version (make criu lib)" make -C "$srcdir" -j "$jobs" WERROR=0 criu lib
  [ -x "$srcdir/criu/criu" ] || die "the build made no criu/criu"
  [ -f "$srcdir/lib/c/libcriu.so" ] || die "the build made no lib/c/libcriu.so"

  new=$prefix/.new
  rm -rf "$new"
  mkdir -p "$new/bin" "$new/include/criu" "$new/share/gpuckpt-criu" "$new/lib/pkgconfig"
  install -m 0755 "$srcdir/criu/criu" "$new/bin/criu"
  install -m 0644 "$srcdir/criu/include/criu-plugin.h" "$srcdir/criu/include/criu-log.h" \
    "$new/include/criu/"
  # libcriu as CRIU's own `make install-lib` lays it out (its Python part is not needed).
  install -m 0755 "$srcdir/lib/c/libcriu.so" "$new/lib/libcriu.so.2"
  ln -s libcriu.so.2 "$new/lib/libcriu.so"
  install -m 0644 "$srcdir/lib/c/criu.h" "$srcdir/images/rpc.pb-c.h" \
    "$srcdir/criu/include/version.h" "$new/include/criu/"
  sed -e "s,@version@,$upstream," -e "s,@libdir@,$prefix/lib," \
    -e "s,@includedir@,$prefix/include/criu/," "$srcdir/lib/c/criu.pc.in" \
    >"$new/lib/pkgconfig/criu.pc"
  {
    echo "source criu $version"
    echo "tarball $(basename "$tarball") sha256 $(sha256sum "$tarball" | cut -d' ' -f1)"
    echo "patches $(patch_set) ${patches[*]##*/}"
    echo "compiler $(cc --version | head -n1)"
    echo "glibc $(dpkg-query -W -f='${Version}' libc6)"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  } >"$new/share/gpuckpt-criu/build.txt"
  sed -i 's/^source criu /source /' "$new/share/gpuckpt-criu/build.txt"

  # Swap the new files in; an older install (a trixie tree run through its own loader) goes.
  rm -rf "$prefix/root" "$prefix/root.old" "$prefix/lib/criu" "$prefix/include/criu" \
    "$prefix/lib/pkgconfig/criu.pc" "$prefix"/lib/libcriu.so*
  mkdir -p "$prefix/bin" "$prefix/include" "$prefix/share/gpuckpt-criu" "$prefix/lib/pkgconfig"
  mv "$new/include/criu" "$prefix/include/criu"
  mv "$new"/lib/libcriu.so* "$prefix/lib/"
  mv "$new/lib/pkgconfig/criu.pc" "$prefix/lib/pkgconfig/"
  mv -f "$new/bin/criu" "$binary"
  mv -f "$new/share/gpuckpt-criu/build.txt" "$stamp"
  rm -f "$prefix/share/gpuckpt-criu/packages.txt"
  rm -rf "$new" "$aptdir/lists" "$aptdir/cache"
fi

# ---------------------------------------------------------------- checks
got=$("$binary" --version 2>&1) || die "$binary --version failed: $got"
ver=$(printf '%s\n' "$got" | awk '/^Version:/ { print $2 }')
[ -n "$ver" ] || die "unexpected output of $binary --version: $got"

if ! out=$(timeout 120 "$binary" check 2>&1); then
  echo "$me: '$binary check' failed: this kernel cannot run CRIU $ver:" >&2
  printf '%s\n' "$out" | sed 's/^/  /' >&2
  exit 1
fi

if [ "${GPUCKPT_CRIU_NO_SMOKE:-0}" = 1 ]; then
  echo "criu $ver at $binary: criu check OK (smoke tests skipped)"
  exit 0
fi

# Smoke test: a TCP counter server (python3, stdlib only) listens on loopback and answers each
# connection with the next number. Dump it (criu kills it), wait until its pid is free, restore
# it detached, and check that the listening socket is back and the count goes on exactly.
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
ask() { # ask PORT: one connection, prints the server's answer
  python3 -c 'import socket,sys
s=socket.create_connection(("127.0.0.1",int(sys.argv[1])),timeout=10)
print(s.makefile().readline().strip())' "$1"
}

mkdir "$work/img"
# The server is started with fd 9 (the install lock) closed: CRIU refuses tasks holding locks.
setsid python3 -c 'import socket,sys,os
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)
s.bind(("127.0.0.1",0)); s.listen(8)
open(sys.argv[1]+".tmp","w").write("%d %d\n"%(os.getpid(),s.getsockname()[1]))
os.rename(sys.argv[1]+".tmp",sys.argv[1])
n=0
while True:
    c,_=s.accept(); c.sendall(b"%d\n"%n); c.close(); n+=1' "$work/server" \
  </dev/null >/dev/null 2>&1 9>&- &
smoke_pids+=("$!")
disown "$!"
for _ in $(seq 1 100); do [ -s "$work/server" ] && break; sleep 0.05; done
[ -s "$work/server" ] || smoke_fail "the TCP test server did not start"
read -r pid port <"$work/server"
smoke_pids+=("$pid")
[ "$(ask "$port")" = 0 ] && [ "$(ask "$port")" = 1 ] || smoke_fail "the TCP test server does not answer"

timeout 120 "$binary" dump -t "$pid" -D "$work/img" -o dump.log -v4 >>"$log" 2>&1 \
  || smoke_fail "criu dump of the TCP listener (pid $pid) failed"
for _ in $(seq 1 100); do [ -e "/proc/$pid" ] || break; sleep 0.05; done
[ ! -e "/proc/$pid" ] || smoke_fail "pid $pid still exists after the dump (not reaped?)"
timeout 120 "$binary" restore -D "$work/img" -d -o restore.log -v4 --pidfile "$work/restored.pid" \
  >>"$log" 2>&1 || smoke_fail "criu restore of the TCP listener failed"
rpid=$(cat "$work/restored.pid")
smoke_pids+=("$rpid")
next=$(ask "$port") || smoke_fail "the restored server (pid $rpid) does not accept on port $port"
[ "$next" = 2 ] || smoke_fail "the restored server answered '$next', expected 2"
kill -9 "$rpid" 2>/dev/null || :
smoke_pids=()
echo "criu $ver at $binary: criu check OK; TCP listener dump+restore smoke test OK (port $port)"
