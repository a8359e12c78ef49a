#!/usr/bin/env bash
# The test command (README.md, .ci/run): builds if needed, then runs the whole CTest suite.
# Tests that need a GPU skip with a stated reason on machines without one.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${GPUCKPT_BUILD_DIR:-$here/build}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$build" -j "$(nproc)"
cd "$build"
ctest --output-on-failure --timeout 300 -j "$(nproc)" "$@"
