#!/usr/bin/env bash
# One command on a fresh Debian 12 machine: installs every dependency from Debian's packages
# (CRIU >= 4.2 built from Debian's source package into a private prefix, see docs/CRIU.md),
# builds gpuckpt, and runs the demo (cold start vs restore of the demo server, with the
# transient report).
#   scripts/setup.sh            # install, build, run the demo
#   scripts/setup.sh --no-demo  # install and build only (CI)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${GPUCKPT_BUILD_DIR:-$here/build}
demo=1
for a in "$@"; do
  case $a in
    --no-demo) demo=0 ;;
    *) echo "usage: $0 [--no-demo]" >&2; exit 2 ;;
  esac
done

[ "$(id -u)" = 0 ] || { echo "setup.sh: run as root (apt-get, CRIU)" >&2; exit 1; }

pkgs=(build-essential cmake ninja-build pkg-config git
      liburing-dev libzstd-dev zstd libxxhash-dev libcli11-dev libspdlog-dev libfmt-dev
      nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev
      librsvg2-bin netpbm python3 clang-format shellcheck libsodium-dev libcurl4-openssl-dev
      # containerd's API messages (engine/src/container/containerd_api.proto)
      libprotobuf-c-dev protobuf-c-compiler
      # servers this project did not write, checkpointed by the end-to-end tests
      nginx redis-server redis-tools
      # the container tests: containers run by runc from a bundle a test makes, and by
      # containerd and Docker (daemons each test starts) from images it builds (no registry);
      # Debian's crun, built without CRIU (install-crun.sh builds one with it)
      runc containerd docker.io crun
      # the two-host tests: sshd runs only inside a network namespace that a test makes
      openssh-server openssh-client iproute2
      # scripts/bench-remote.sh and the runbooks in docs/OPERATORS.md
      jq curl)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Packages must not start their services here (openssh-server would listen on port 22):
  # tests start the servers they need, where they need them.
  made_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    made_policy=1
  fi
  apt-get install -y -qq "${missing[@]}" >/dev/null
  if [ $made_policy = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
fi

if [ ! -f /usr/local/cuda/include/cuda.h ] && [ -z "${CUDA_HOME:-}" ]; then
  echo "setup.sh: the CUDA toolkit (cuda.h, nvcc) is expected at /usr/local/cuda or \$CUDA_HOME" >&2
  exit 1
fi

"$here/scripts/install-criu.sh"
"$here/scripts/install-crun.sh"
"$here/scripts/install-s3rver.sh"

# Docker's restore passes CRIU no options but this file's (docs/OPERATORS.md, "Docker and
# containerd"); gpuckpt closes a container's TCP connections at the dump.
mkdir -p /etc/criu
if ! grep -qsx 'tcp-close' /etc/criu/runc.conf; then
  echo 'tcp-close' >> /etc/criu/runc.conf
fi

cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)"

if [ $demo = 1 ]; then
  "$here/scripts/demo.sh"
fi
