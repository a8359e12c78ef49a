#!/usr/bin/env bash
# The S3-compatible server the object-storage tests start (tests/e2e_s3_test.cpp): s3rver from
# the npm registry, pinned, into a private prefix. It speaks S3's REST API (multipart uploads,
# ranged reads, SigV4-style authorization headers) and keeps objects on disk. Node.js comes
# from Debian's packages when the machine has none.
set -euo pipefail
prefix=${GPUCKPT_S3RVER_PREFIX:-/opt/gpuckpt-s3rver}
version=3.7.1
bin=$prefix/node_modules/.bin/s3rver
if [ -x "$bin" ] && [ "$(node "$bin" --version 2>/dev/null)" = "$version" ]; then
  exit 0
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "install-s3rver.sh: installing nodejs npm"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
mkdir -p "$prefix"
npm install --prefix "$prefix" --no-audit --no-fund --no-save --loglevel=error "s3rver@$version" >/dev/null
[ "$(node "$bin" --version)" = "$version" ] || { echo "install-s3rver.sh: s3rver $version did not install" >&2; exit 1; }
echo "s3rver $version at $bin"
