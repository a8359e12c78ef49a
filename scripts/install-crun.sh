#!/usr/bin/env bash
# Builds crun with checkpoint and restore: Debian 12's own crun source package, configured
# against the libcriu that scripts/install-criu.sh installs, into the same private prefix.
# Debian 12 built its crun without CRIU (no libcriu-dev was among its build dependencies), so
# `crun checkpoint` there fails; podman's and CRI-O's crun on other distributions has it. gpuckpt restores a crun
# container through crun, and finds this one when the crun on PATH lacks CRIU
# (docs/CRIU.md, "crun").
#
#   scripts/install-crun.sh            # as root, after scripts/install-criu.sh
#
# Result (PREFIX = $GPUCKPT_CRIU_PREFIX, default /opt/gpuckpt-criu):
#   PREFIX/bin/crun                    crun, `crun --version` listing +CRIU; it loads
#                                      PREFIX/lib/libcriu.so.2 (its RUNPATH)
#   PREFIX/share/gpuckpt-criu/crun.txt source version, tarball hash, the libcriu it was built for
#
# Environment:
#   GPUCKPT_CRIU_PREFIX     install prefix (default /opt/gpuckpt-criu)
#   GPUCKPT_DEBIAN_MIRROR   Debian mirror (default http://deb.debian.org/debian)
#   GPUCKPT_CRUN_REINSTALL  1: download and build again even if already installed
set -euo pipefail

prefix=${GPUCKPT_CRIU_PREFIX:-/opt/gpuckpt-criu}
mirror=${GPUCKPT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm # the system's own release: its crun builds against its libraries
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
me=install-crun.sh
here=$(cd "$(dirname "$0")/.." && pwd)

build_deps=(build-essential pkg-config dpkg-dev libyajl-dev libseccomp-dev libsystemd-dev
  libcap-dev python3)

die() {
  echo "$me: $*" >&2
  exit 1
}

[ "$(id -u)" = 0 ] || die "must run as root"
[ -r "$keyring" ] || die "$keyring is missing: apt-get install debian-archive-keyring"
libcriu=$prefix/lib/libcriu.so.2
[ -f "$libcriu" ] && [ -f "$prefix/lib/pkgconfig/criu.pc" ] \
  || die "$libcriu is missing: run scripts/install-criu.sh first"

mkdir -p "$prefix"
exec 9>"$prefix/.install-crun.lock"
flock 9 || die "cannot lock $prefix/.install-crun.lock"

work=$(mktemp -d /tmp/gpuckpt-install-crun.XXXXXX)
trap 'rm -rf "$work"' EXIT
log=$work/log
# shellcheck source=scripts/debian-src.sh
. "$here/scripts/debian-src.sh"

stamp=$prefix/share/gpuckpt-criu/crun.txt
binary=$prefix/bin/crun
criu_hash=$(sha256sum "$libcriu" | cut -d' ' -f1)

# Installed, and built for this libcriu: nothing to do but the check below.
if [ "${GPUCKPT_CRUN_REINSTALL:-0}" != 1 ] && [ -x "$binary" ] && [ -f "$stamp" ] \
  && [ "$(awk '$1 == "libcriu" { print $2 }' "$stamp")" = "$criu_hash" ]; then
  :
else
  install_missing "crun's build dependencies" "${build_deps[@]}"

  # Bookworm's deb-src line alone (as install-criu.sh's for forky and sid).
  private_apt "$work/apt" "$mirror" "$keyring" "$suite"
  chown _apt "$work" 2>/dev/null || :
  version=$({ apt-cache "${apt_opts[@]}" showsrc crun 2>>"$log" || :; } \
    | awk '/^Version:/ { print $2 }' | sort -V | tail -n 1)
  [ -n "$version" ] || die "no crun source package in Debian $suite at $mirror"
  mkdir -p "$work/src"
  chown _apt "$work/src" 2>/dev/null || :
  (cd "$work/src" && quiet "downloading the crun=$version source package" \
    apt-get "${apt_opts[@]}" -q source --download-only "crun=$version")
  dsc=$(find "$work/src" -maxdepth 1 -name 'crun_*.dsc' | head -n1)
  [ -n "$dsc" ] || die "apt downloaded no crun_*.dsc for crun=$version (see $log)"
  # apt has checked every file against the signed index; dpkg-source applies Debian's patches.
  quiet "unpacking $dsc" dpkg-source --no-check -x "$dsc" "$work/src/crun"
  srcdir=$work/src/crun
  # crun includes <criu/criu.h> and its Makefile drops criu.pc's CFLAGS: the prefix's include
  # directory goes first, ahead of any older libcriu-dev of the system's.
  quiet "configuring crun=$version with libcriu" env PKG_CONFIG_PATH="$prefix/lib/pkgconfig" \
    sh -c 'cd "$1" && ./configure --disable-silent-rules CPPFLAGS="-I$2/include" \
      LDFLAGS="-Wl,-rpath,$2/lib -Wl,--enable-new-dtags"' sh "$srcdir" "$prefix"
  grep -q '^#define HAVE_CRIU 1' "$srcdir/config.h" \
    || die "crun's configure did not find libcriu in $prefix/lib/pkgconfig (see $log)"
  quiet "building crun=$version" make -C "$srcdir" -j "$(nproc)"
  "$srcdir/crun" --version | grep -q '+CRIU' || die "the crun built lacks +CRIU"

  mkdir -p "$prefix/bin" "$prefix/share/gpuckpt-criu"
  install -m 0755 "$srcdir/crun" "$binary.new"
  mv -f "$binary.new" "$binary"
  {
    echo "source crun $version"
    echo "dsc $(basename "$dsc") sha256 $(sha256sum "$dsc" | cut -d' ' -f1)"
    echo "libcriu $criu_hash"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  } >"$stamp"
fi

# ---------------------------------------------------------------- checks
got=$("$binary" --version 2>&1) || die "$binary --version failed: $got"
printf '%s\n' "$got" | grep -q '+CRIU' || die "$binary lacks +CRIU: $got"
echo "$(printf '%s\n' "$got" | head -n1) at $binary, with CRIU (libcriu $libcriu)"
