#!/usr/bin/env bash
# The unit tests (ctest label "unit") built with -fsanitize=address,undefined in their own build
# directory. The system tests (real CRIU, services, CUDA) run in the normal build (scripts/test.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${GPUCKPT_SANITIZE_BUILD_DIR:-$here/build-sanitize}
cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DGPUCKPT_SANITIZE=ON \
  -DGPUCKPT_BUILD_CRIU_PLUGIN=OFF -DGPUCKPT_BUILD_KERNELS=OFF -DGPUCKPT_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j "$(nproc)"
cd "$build"
# halt_on_error: a sanitizer report fails the test that triggered it.
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
ctest --output-on-failure --timeout 300 -j "$(nproc)" -L unit "$@"
