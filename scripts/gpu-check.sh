#!/usr/bin/env bash
# shellcheck disable=SC2317  # cleanup() and print_summary() run from the EXIT trap
# End-to-end check of gpuckpt on a machine with an NVIDIA GPU and its driver (docs/GPU.md):
# builds what it needs, lists the GPUs, measures the roofline ceilings, starts the CUDA demo
# server with several GiB of VRAM state, checkpoints that VRAM to host memory and back through
# the CUDA driver API (no CRIU needed) and checks the GPU-side hash of the whole VRAM state is
# unchanged; then, where CRIU works, a PyTorch decoder dumped and restored mid-conversation
# (scripts/gpu/torch_decoder_server.py) and a full `gpuckpt dump` + `gpuckpt restore` of the
# demo server. Prints a summary (rewritten after every check) and exits non-zero if any check
# failed. With $OUT set: gpu-check.log, summary.txt and results.tar.gz (the JSON results and
# logs) go there.
#
#   scripts/gpu-check.sh                        # build in build-gpu-check/, then check
#   scripts/gpu-check.sh --make-bundle gpu-bundle   # on a dev machine (no GPU needed): build
#                                               # a self-contained bundle, inside the repository
#                                               # (git-ignored), for a GPU machine that lacks
#                                               # the build dependencies
#   scripts/gpu-check.sh --bundle gpu-bundle    # on the GPU machine: check with that bundle
# Options: --build-dir DIR, --vram-gib N (default 4), --torch-gib N (default 1.5), --no-criu,
# --no-torch, --no-tests, --budget-s S (default 330: the whole check ends by then), --keep,
# --jobs N, --bench-dump SIZE (also `gpuckpt bench dump` of a SIZE demo server, 3 runs, on the
# disk of the repository: the storage path on this machine's cores)
# Exit: 0 all checks passed (some may be skipped), 1 a check failed, 2 usage, 7 no GPU.
set -uo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
me=gpu-check.sh
build=${GPUCKPT_BUILD_DIR:-$here/build-gpu-check}
bundle=""
make_bundle=""
vram_gib=4
torch_gib=1.5
do_criu=1
do_torch=1
do_tests=1
keep=0
jobs=16
bench_size=""
# The device machine gives one command 10 minutes; the whole check must end well within, with
# its summary written (it is rewritten after every check, so a kill still leaves results).
budget_s=330

usage() {  # usage EXIT_CODE
  sed -n "3,22p" "$0" | sed 's/^# \{0,1\}//' >&2
  exit "$1"
}
while [ $# -gt 0 ]; do
  case $1 in
    --build-dir) build=${2:?}; shift ;;
    --bundle) bundle=${2:?}; shift ;;
    --make-bundle) make_bundle=${2:?}; shift ;;
    --vram-gib) vram_gib=${2:?}; shift ;;
    --torch-gib) torch_gib=${2:?}; shift ;;
    --budget-s) budget_s=${2:?}; shift ;;
    --no-criu) do_criu=0 ;;
    --no-torch) do_torch=0 ;;
    --no-tests) do_tests=0 ;;
    --keep) keep=1 ;;
    --jobs) jobs=${2:?}; shift ;;
    --bench-dump) bench_size=${2:?}; shift ;;
    -h|--help) usage 0 ;;
    *) echo "$me: unknown argument $1" >&2; usage 2 ;;
  esac
  shift
done
case $vram_gib in ''|*[!0-9.]*) echo "$me: --vram-gib needs a number" >&2; exit 2 ;; esac
case $torch_gib in ''|*[!0-9.]*) echo "$me: --torch-gib needs a number" >&2; exit 2 ;; esac
case $budget_s in ''|*[!0-9]*) echo "$me: --budget-s needs whole seconds" >&2; exit 2 ;; esac

# ---- logging, results, cleanup -----------------------------------------------------------

work=$(mktemp -d "${TMPDIR:-/tmp}/gpuckpt-gpu-check.XXXXXX")
out_dir=${OUT:-}
if [ -n "$out_dir" ]; then
  mkdir -p "$out_dir"
  log=$out_dir/gpu-check.log
else
  log=$work/gpu-check.log
fi
exec > >(tee -a "$log") 2>&1
tee_pid=$!

orig_ld_library_path=${LD_LIBRARY_PATH-}
results=()
failures=0
children=()
# The test programs this check builds, carries in a bundle and runs (in this order).
gpu_tests=(device_gpu_test kernels_binaries_test device_cli_test library_search_test)
restored=()  # CUDA processes that went through a checkpoint: locked before they are killed
children_links=()
summary_file=$work/summary.txt
deadline=$((SECONDS + budget_s))

say() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*"; }
write_summary() {  # after every check: a command killed at its limit still returns results
  {
    echo "==== gpuckpt GPU check summary ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -n)) ===="
    local r
    for r in "${results[@]}"; do echo "$r"; done
    if [ "${1:-}" != final ]; then
      echo "RESULT: incomplete (still running, or stopped at $((SECONDS)) s of ${budget_s} s)"
    elif [ "$failures" -eq 0 ]; then echo "RESULT: all checks passed"
    else echo "RESULT: $failures check(s) FAILED"; fi
  } >"$summary_file.tmp" && mv -f "$summary_file.tmp" "$summary_file"
  if [ -n "$out_dir" ]; then cp "$summary_file" "$out_dir/summary.txt"; fi
}
# Everything else that comes back goes into one archive, $OUT/results.tar.gz, packed again at
# each addition: the device tool returns at most 8 files, and a command killed at its limit
# still returns what was packed so far. $OUT holds gpu-check.log, summary.txt and the archive.
results_dir=$work/results
mkdir -p "$results_dir"
pack_results() {
  [ -n "$out_dir" ] || return 0
  tar -czf "$out_dir/results.tar.gz.tmp" -C "$results_dir" . &&
    mv -f "$out_dir/results.tar.gz.tmp" "$out_dir/results.tar.gz"
}
keep_result() {  # keep_result FILE NAME: a copy of FILE as NAME in the archive
  cp "$1" "$results_dir/$2" && pack_results
}
append_result() {  # append_result NAME < TEXT: appended to NAME in the archive
  cat >>"$results_dir/$1" && pack_results
}
record() {  # record STATUS NAME DETAIL   (STATUS: PASS, FAIL, SKIP, INFO)
  results+=("$(printf '%-5s %-26s %s' "$1" "$2" "$3")")
  [ "$1" = FAIL ] && failures=$((failures + 1))
  say "[$1] $2: $3"
  write_summary
}
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }
div() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
gbps() {  # gbps BYTES SECONDS
  awk -v b="$1" -v s="$2" 'BEGIN { if (s > 0 && b > 0) printf "%.2f", b / s / 1e9; else print "n/a" }'
}
left() { echo $((deadline - SECONDS)); }
cap() {  # cap SECONDS -> that, or what is left of the budget (at least 1)
  local l
  l=$(left)
  if [ "$l" -lt 1 ]; then l=1; fi
  if [ "$1" -lt "$l" ]; then echo "$1"; else echo "$l"; fi
}
have_time() {  # have_time SECONDS NAME -> 1 (and a SKIP) when the budget cannot fit it
  if [ "$(left)" -ge "$1" ]; then return 0; fi
  record SKIP "$2" "time budget: $(left) s left of ${budget_s} s, needs ~$1 s"
  return 1
}

print_summary() {
  write_summary final
  echo
  cat "$summary_file"
}

# Killing a live CUDA process right after a restore has crashed hosts on some drivers
# (NVIDIA/cuda-checkpoint#53); a locked one is safe. Best effort, in parallel, bounded.
lock_then_kill() {  # lock_then_kill PID...
  local p lockers=()
  if [ -n "${gpuckpt:-}" ] && [ -x "${gpuckpt:-}" ]; then
    for p in "$@"; do
      if kill -0 "$p" 2>/dev/null; then
        timeout 15 "$gpuckpt" cuda-checkpoint --pid "$p" --action lock --timeout-ms 5000 \
          >/dev/null 2>&1 &
        lockers+=("$!")
      fi
    done
    for p in "${lockers[@]}"; do wait "$p" 2>/dev/null; done
  fi
  for p in "$@"; do
    if kill -0 "$p" 2>/dev/null; then kill -9 "$p" 2>/dev/null; fi
  done
}

cleanup() {
  local rc=$?
  local p
  if [ -n "${watchdog:-}" ]; then kill "$watchdog" 2>/dev/null; fi
  lock_then_kill "${restored[@]}"
  for p in "${children[@]}"; do
    if kill -0 "$p" 2>/dev/null; then kill -9 "$p" 2>/dev/null; fi
  done
  for p in "${children_links[@]}"; do rm -f "$p"; done
  if [ ${#results[@]} -gt 0 ]; then print_summary; fi
  if [ "$keep" = 1 ]; then echo "$me: kept $work"; else rm -rf "$work"; fi
  exec 1>&- 2>&-
  wait "$tee_pid" 2>/dev/null
  exit "$rc"
}
trap cleanup EXIT
trap 'record FAIL "$me" "stopped by a signal at $SECONDS s (budget ${budget_s} s)"; exit 130' INT TERM

die() {  # die CODE MESSAGE
  record FAIL "$me" "$2"
  exit "$1"
}

# JSON fields without jq: python3 where present, else grep/sed on the first "key": value.
have_python=0
command -v python3 >/dev/null 2>&1 && have_python=1
json_get() {  # json_get FILE KEY   -> scalar value of the first "KEY" (nested keys: a.b.c)
  if [ "$have_python" = 1 ]; then
    LD_LIBRARY_PATH=$orig_ld_library_path python3 - "$1" "$2" <<'EOF' 2>/dev/null
import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."):
    v = v[int(k)] if isinstance(v, list) else v.get(k)
    if v is None:
        break
print("" if v is None else (str(v).lower() if isinstance(v, bool) else v))
EOF
  else
    local key=${2##*.}
    grep -o "\"$key\": *\(\"[^\"]*\"\|[-0-9.eE+]*\|true\|false\|null\)" "$1" | head -n1 |
      sed -e 's/^"[^"]*": *//' -e 's/^"//' -e 's/"$//' -e 's/^null$//'
  fi
}
stage_get() {  # stage_get FILE STAGE FIELD  (from a gpuckpt --json "timeline")
  if [ "$have_python" = 1 ]; then
    LD_LIBRARY_PATH=$orig_ld_library_path python3 - "$1" "$2" "$3" <<'EOF' 2>/dev/null
import json, sys
for s in json.load(open(sys.argv[1]))["timeline"]["stages"]:
    if s["name"] == sys.argv[2]:
        print(s[sys.argv[3]]); break
EOF
  else  # nlohmann sorts keys: bytes, gbps, name, seconds, start
    awk -v n="\"$2\"" -v f="\"$3\"" '
      index($0, "\"name\": " n) { found = 1; next }
      found && index($0, f ":") { sub(/.*: */, ""); sub(/,$/, ""); print; exit }' "$1"
  fi
}
print_timeline() {  # print_timeline FILE
  if [ "$have_python" = 1 ]; then
    LD_LIBRARY_PATH=$orig_ld_library_path python3 - "$1" <<'EOF' 2>/dev/null || cat "$1"
import json, sys
t = json.load(open(sys.argv[1]))["timeline"]
for s in t["stages"]:
    gb = s["bytes"] / 1e9
    print(f"    {s['name']:<24} {s['seconds']:9.3f} s  {gb:9.3f} GB  {s['gbps']:8.2f} GB/s")
print(f"    {'total':<24} {t['total_seconds']:9.3f} s")
EOF
  else
    cat "$1"
  fi
}

# ---- build (or use a bundle) -------------------------------------------------------------

configure_and_build() {  # configure_and_build WITH_TESTS BUILD_TIMEOUT_S
  local tests=$1 limit=$2 t targets
  say "configuring $build (Release, tests=$tests)"
  if ! timeout 300 cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DGPUCKPT_BUILD_BENCH=OFF -DGPUCKPT_BUILD_TESTS="$tests" >"$work/cmake.log" 2>&1; then
    return 1
  fi
  targets=(gpuckpt)
  ninja -C "$build" -t targets all >"$work/targets.txt" 2>/dev/null
  for t in gpuckpt-roofline-gpu gpuckpt-cuda-demo-server gpuckpt_criu_plugin "${gpu_tests[@]}"; do
    if grep -q "^$t:" "$work/targets.txt"; then targets+=("$t"); fi
  done
  say "building ${targets[*]} (-j$jobs, at most ${limit} s)"
  timeout "$limit" ninja -C "$build" -j "$jobs" "${targets[@]}" >"$work/build.log" 2>&1
}

build_all() {  # build_all BUILD_TIMEOUT_S
  local t0 limit=$1
  t0=$(now)
  if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
    die 1 "cmake and ninja are needed to build here (or use --bundle, see --make-bundle)"
  fi
  if ! configure_and_build ON "$limit"; then
    # A build without the tests still lets the other checks run, but is never a PASS: the
    # GPU tests would be missing (a timeout is the usual cause on a small machine).
    tail -n 15 "$work/cmake.log" "$work/build.log" 2>/dev/null
    record FAIL build "the build with the GPU tests failed or passed ${limit} s (log above)"
    if [ -n "$make_bundle" ] || ! configure_and_build OFF "$limit"; then
      tail -n 25 "$work/cmake.log" "$work/build.log" 2>/dev/null
      die 1 "build failed (log above). On a machine without gpuckpt's build dependencies \
(liburing, zstd, xxhash, spdlog, CLI11, nlohmann-json), build a bundle on a dev machine: \
scripts/gpu-check.sh --make-bundle gpu-bundle, then run scripts/gpu-check.sh --bundle gpu-bundle here"
    fi
    record INFO build "built without the tests in $build ($(elapsed "$t0") s)"
  else
    record PASS build "Release build in $build ($(elapsed "$t0") s)"
  fi
  bin=$build/bin
  plugin_dir=$build/lib/gpuckpt/criu
  tests_dir=$build/tests
}

make_bundle_dir() {
  local dest=$1 f lib size
  # No GPU and no time limit of the device here, but a bounded build all the same.
  build_all "${GPUCKPT_BUNDLE_BUILD_TIMEOUT:-5400}"
  rm -rf "$dest"
  mkdir -p "$dest/bin" "$dest/lib/gpuckpt" "$dest/tests" "$dest/deps"
  cp -L "$bin"/gpuckpt "$bin"/gpuckpt-roofline-gpu "$bin"/gpuckpt-cuda-demo-server "$dest/bin/" ||
    die 1 "the kernels were not built (nvcc missing?)"
  # The guard process and any other helper gpuckpt runs from its bin/.
  for f in "$bin"/*; do
    [ -f "$f" ] && [ -x "$f" ] && [ ! -e "$dest/bin/$(basename "$f")" ] && cp -L "$f" "$dest/bin/"
  done
  cp -L "$build/lib/gpuckpt/kernels.manifest" "$dest/lib/gpuckpt/" 2>/dev/null
  if [ -d "$plugin_dir" ]; then cp -rL "$plugin_dir" "$dest/lib/gpuckpt/"; fi
  local missing=()
  for f in "${gpu_tests[@]}"; do
    if [ -x "$tests_dir/$f" ]; then cp -L "$tests_dir/$f" "$dest/tests/"; else missing+=("$f"); fi
  done
  # The libcuda.so.1 library_search_test plants, beside the real driver there.
  if [ -d "$tests_dir/planted" ]; then cp -rL "$tests_dir/planted" "$dest/tests/"; fi
  if [ ${#missing[@]} -gt 0 ]; then
    record FAIL bundle "test programs missing: ${missing[*]} (GoogleTest not found?)"
  fi
  if [ ! -f "$dest/lib/gpuckpt/criu/gpuckpt_criu_plugin.so" ]; then
    record FAIL bundle "the CRIU plugin was not built (criu-plugin.h missing: scripts/install-criu.sh)"
  fi
  # Shared libraries beyond glibc and the C++ runtime, which every target system has (newer),
  # CRIU's included (a native build: libprotobuf-c, libnl, libnet, gnutls, nftables ...).
  local criu_prefix=${GPUCKPT_CRIU_PREFIX:-/opt/gpuckpt-criu}
  for f in "$dest"/bin/* "$dest"/tests/* "$criu_prefix/bin/criu"; do
    [ -f "$f" ] || continue
    ldd "$f" 2>/dev/null | awk '/=> \// { print $3 }'
  done | sort -u | while read -r lib; do
    case $(basename "$lib") in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
      *) cp -L "$lib" "$dest/deps/" ;;
    esac
  done
  # Debug symbols are most of the size; the device tool carries 64 MiB in all.
  if command -v strip >/dev/null; then
    find "$dest/bin" "$dest/tests" "$dest/deps" "$dest/lib" -type f \( -perm -u+x -o -name '*.so*' \) \
      -exec strip --strip-debug {} + 2>/dev/null
  fi
  # The tests find the binaries by the build directory compiled into them.
  echo "$build" >"$dest/origin"
  if [ -x "$criu_prefix/bin/criu" ]; then
    local parts=(bin)
    if [ -d "$criu_prefix/root" ]; then parts+=(root); fi
    if [ -d "$criu_prefix/lib" ]; then parts+=(lib); fi
    tar -C "$criu_prefix" -czf "$dest/criu.tar.gz" "${parts[@]}"
  else
    record INFO bundle "no CRIU at $criu_prefix: the bundle checks the CUDA path only"
  fi
  size=$(du -sm "$dest" | cut -f1)
  local nlibs extra=""
  nlibs=$(find "$dest/deps" -type f | wc -l)
  if [ -f "$dest/criu.tar.gz" ]; then extra=", CRIU"; fi
  if [ "$size" -gt 60 ]; then
    record FAIL bundle "$dest is ${size} MiB: the device tool carries 64 MiB at most"
  elif [ "$failures" -eq 0 ]; then
    record PASS bundle "$dest: ${size} MiB (${nlibs} libraries${extra})"
  fi
  say "on the GPU machine, from the repository root: scripts/gpu-check.sh --bundle ${dest#"$here"/}"
}

use_bundle() {
  local dir origin
  dir=$(cd "$bundle" 2>/dev/null && pwd) || die 2 "bundle $bundle does not exist"
  [ -x "$dir/bin/gpuckpt" ] || die 2 "$dir is not a bundle made by --make-bundle"
  # For gpuckpt, criu (which gpuckpt runs) and the tests; python3 keeps the machine's own
  # (orig_ld_library_path): the bundle's libffi & co. must not shadow the system's for torch.
  export LD_LIBRARY_PATH="$dir/deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  bin=$dir/bin
  plugin_dir=$dir/lib/gpuckpt/criu
  tests_dir=$dir/tests
  origin=$(cat "$dir/origin" 2>/dev/null || true)
  if [ -n "$origin" ] && [ ! -e "$origin" ]; then
    mkdir -p "$(dirname "$origin")" && ln -s "$dir" "$origin" && children_links+=("$origin")
  fi
  if [ -f "$dir/criu.tar.gz" ] && [ -z "${GPUCKPT_CRIU:-}" ]; then
    mkdir -p "$work/criu" && tar -C "$work/criu" -xzf "$dir/criu.tar.gz" &&
      export GPUCKPT_CRIU="$work/criu/bin/criu"
  fi
  record PASS build "prebuilt bundle $dir"
}

if [ -n "$make_bundle" ]; then
  case $make_bundle in /*) ;; *) make_bundle=$PWD/$make_bundle ;; esac
  deadline=$((SECONDS + 86400))  # no device budget while bundling
  make_bundle_dir "$make_bundle"
  if [ "$failures" -gt 0 ]; then exit 1; fi
  exit 0
fi
# A backstop behind the per-command limits below (its output must not hold the log's pipe).
( sleep $((budget_s + 20)); kill -TERM $$ ) >/dev/null 2>&1 &
watchdog=$!
say "gpuckpt GPU check: repo $here, work dir $work, VRAM state ${vram_gib} GiB, budget ${budget_s} s"
if [ -n "$bundle" ]; then use_bundle; else build_all "$(cap 240)"; fi
gpuckpt=$bin/gpuckpt
server=$bin/gpuckpt-cuda-demo-server
roofline=$bin/gpuckpt-roofline-gpu

# ---- devices -----------------------------------------------------------------------------

timeout "$(cap 60)" "$gpuckpt" devices
rc=0
timeout "$(cap 60)" "$gpuckpt" --json devices >"$work/devices.json" || rc=$?
keep_result "$work/devices.json" devices.json
if [ "$rc" = 7 ]; then
  record FAIL devices "$(json_get "$work/devices.json" reason)"
  exit 7
fi
[ "$rc" = 0 ] || die 1 "gpuckpt devices failed (exit $rc)"
gpu_name=$(json_get "$work/devices.json" gpus.0.name)
gpu_uuid=$(json_get "$work/devices.json" gpus.0.uuid)
ckpt_api=$(json_get "$work/devices.json" driver.checkpoint_api)
remap=$(json_get "$work/devices.json" driver.gpu_remap)
record PASS devices "$gpu_name $gpu_uuid, $(json_get "$work/devices.json" driver.cuda_version_string), NVIDIA $(json_get "$work/devices.json" driver.kernel_module_version), driver $(json_get "$work/devices.json" driver.library), checkpoint API: $ckpt_api, GPU remap: $remap"
# What the results depend on beyond the driver: a VM's kernel decides what CRIU can do.
record INFO environment "kernel $(uname -r), $(ldd --version 2>/dev/null | head -n 1), $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), python3 $(LD_LIBRARY_PATH=$orig_ld_library_path python3 -c 'import sys; print(sys.version.split()[0])' 2>/dev/null || echo none)"

# ---- roofline ----------------------------------------------------------------------------

bw="" d2h="" h2d="" tensor="" fp32=""
if [ ! -x "$roofline" ]; then
  record FAIL roofline "$roofline missing: nvcc was not found when building"
elif have_time 60 roofline; then
  t0=$(now)
  if timeout "$(cap 90)" "$roofline" >"$work/roofline.json" 2>"$work/roofline.err"; then
    keep_result "$work/roofline.json" roofline.json
    bw=$(json_get "$work/roofline.json" bandwidth_gbps)
    d2h=$(json_get "$work/roofline.json" details.d2h_pinned_gbps)
    h2d=$(json_get "$work/roofline.json" details.h2d_pinned_gbps)
    tensor=$(json_get "$work/roofline.json" tensor_gflops)
    fp32=$(json_get "$work/roofline.json" fp32_gflops)
    record PASS roofline "HBM $bw GB/s (copy $(json_get "$work/roofline.json" details.copy_gbps), triad $(json_get "$work/roofline.json" details.triad_gbps)), FP32 $fp32 GFLOP/s, bf16 tensor $tensor GFLOP/s by mma.sync (not wgmma: a lower bound on Hopper), pinned H2D $h2d / D2H $d2h GB/s ($(elapsed "$t0") s)"
  else
    record FAIL roofline "gpuckpt-roofline-gpu failed: $(tail -n 3 "$work/roofline.err")"
  fi
  # The CLI's view of the same measurement (runs the binary next to gpuckpt).
  if timeout "$(cap 60)" "$gpuckpt" --json roofline --target gpu --quick >"$work/cli-roofline.json" 2>"$work/cli-roofline.err"; then
    record PASS "gpuckpt roofline" "parsed the kernels' JSON"
  else
    record FAIL "gpuckpt roofline" "$(tail -n 2 "$work/cli-roofline.err")"
  fi
fi

# ---- the CUDA demo server ----------------------------------------------------------------

[ -x "$server" ] || die 1 "$server missing: nvcc was not found when building"
[ "$ckpt_api" = true ] || die 1 "the driver lacks the checkpoint API: $(json_get "$work/devices.json" driver.checkpoint_error)"

launch_server() {  # launch_server NAME KIND [VRAM_GIB [ARGS...]]: starts it in the background
  local name=$1 kind=$2 vram=${3:-$vram_gib} pid  # KIND: demo or torch
  shift 2
  if [ $# -gt 0 ]; then shift; fi
  # Own session: CRIU dumps it as a standalone tree, and the check's shell is not part of it.
  local session=()
  if command -v setsid >/dev/null; then session=(setsid); fi
  if [ "$kind" = torch ]; then
    PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=$orig_ld_library_path "${session[@]}" python3 \
      "$torch_server" --socket "$work/$name.sock" --gib "$torch_gib" --seed 7 \
      </dev/null >"$work/$name.out" 2>"$work/$name.err" &
  else
    "${session[@]}" "$server" --socket "$work/$name.sock" --vram-gib "$vram" --seed 7 "$@" \
      </dev/null >"$work/$name.out" 2>"$work/$name.err" &
  fi
  pid=$!
  disown "$pid"  # killed on purpose (cleanup, CRIU dump): no job notices
  children+=("$pid")
  printf '%s\n' "$pid" >"$work/$name.launcher"
}
await_server() {  # await_server NAME KIND -> sets srv_pid, srv_sock once it prints READY
  local name=$1 kind=$2 deadline_s limit launcher
  srv_sock=$work/$name.sock
  launcher=$(cat "$work/$name.launcher")
  limit=$(cap 120)
  deadline_s=$((SECONDS + limit))
  until grep -q '^READY ' "$work/$name.out" 2>/dev/null; do
    if ! kill -0 "$launcher" 2>/dev/null && ! grep -q '^READY ' "$work/$name.out"; then
      record FAIL "$name server" "exited: $(tail -n 5 "$work/$name.err" | tr '\n' ' ')"
      return 1
    fi
    if [ $SECONDS -ge $deadline_s ]; then
      record FAIL "$name server" "printed no READY within $limit s"
      return 1
    fi
    sleep 0.2
  done
  # The server's own pid (setsid forks when it would otherwise lead a process group).
  srv_pid=$(ask_any "$kind" "$srv_sock" INFO | tr ' ' '\n' | sed -n 's/^pid=//p')
  if [ -z "$srv_pid" ]; then
    record FAIL "$name server" "does not answer INFO"
    return 1
  fi
  children+=("$srv_pid")
}
ask_any() {  # ask_any KIND SOCKET REQUEST -> the reply on stdout
  local t
  t=$(cap 60)
  if [ "$1" = torch ]; then
    LD_LIBRARY_PATH=$orig_ld_library_path timeout "$t" python3 "$torch_server" --client "$2" "$3" \
      --timeout "$t"
  else
    timeout "$t" "$server" --client "$2" "$3" --timeout-ms $((t * 1000 - 500))
  fi
}
ask() { ask_any demo "$@"; }
hash_of() { awk '{ print $3 }' <<<"$1"; }

t0=$(now)
launch_server demo demo
launch_server twin demo  # same seed and requests, never checkpointed: the reference
await_server demo demo || exit 1
demo_pid=$srv_pid demo_sock=$srv_sock
await_server twin demo || exit 1
twin_pid=$srv_pid twin_sock=$srv_sock
vram_bytes=$(ask "$demo_sock" INFO | tr ' ' '\n' | sed -n 's/^vram_bytes=//p')
record PASS "demo server" "pid $demo_pid with $(div "${vram_bytes:-0}" 1073741824) GiB of VRAM state, twin pid $twin_pid ($(elapsed "$t0") s)"

requests_ok=1
for req in "GEN The capital of France is" "GEN Checkpoint me" "GEN and restore me, byte for byte"; do
  a=$(ask "$demo_sock" "$req") b=$(ask "$twin_sock" "$req")
  if [ -z "$a" ] || [ "$a" != "$b" ]; then requests_ok=0; fi
done
state=$(ask "$demo_sock" STATE)
hash_before=$(hash_of "$state")
if [ "$requests_ok" = 1 ] && [ -n "$hash_before" ]; then
  record PASS requests "3 GEN requests, deterministic (twin agrees): $state"
else
  record FAIL requests "demo and twin disagree or did not answer (demo: '$a', twin: '$b')"
fi

vram_of_pid() {  # MiB nvidia-smi attributes to a pid ("" when not listed / no nvidia-smi)
  command -v nvidia-smi >/dev/null || return 0
  timeout 20 nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
    awk -F', *' -v p="$1" '$1 == p { print $2 }'
}

# ---- CUDA checkpoint without CRIU: lock, checkpoint, restore, unlock ---------------------

cuda_step() {  # cuda_step ACTION [ARGS...] -> $work/cuda-ACTION.json; returns gpuckpt's exit code
  local action=$1
  shift
  timeout "$(cap 90)" "$gpuckpt" --json cuda-checkpoint --pid "$demo_pid" --action "$action" "$@" \
    >"$work/cuda-$action.json" 2>"$work/cuda-$action.err"
}
check_state() {  # check_state ACTION EXPECTED -> records the step; 1 on a wrong state
  local action=$1 want=$2 got secs init
  got=$(json_get "$work/cuda-$action.json" state_after)
  secs=$(stage_get "$work/cuda-$action.json" "cuda_$action" seconds)
  init=$(stage_get "$work/cuda-$action.json" cuda_init seconds)
  if [ "$got" = "$want" ]; then
    record PASS "cuda $action" "state $got in ${secs:-?} s (this gpuckpt process's cuInit: ${init:-?} s, paid once)"
    return 0
  fi
  record FAIL "cuda $action" "state '$got', expected '$want': $(cat "$work/cuda-$action.err")"
  return 1
}

restored+=("$demo_pid")  # from here on it may be a restored CUDA process
lock_s="" ckpt_s="" rest_s="" unlock_s=""
nvsmi_before=$(vram_of_pid "$demo_pid")
stage_ok=0
if cuda_step lock --timeout-ms 10000; then
  check_state lock locked && stage_ok=1
  lock_s=$(stage_get "$work/cuda-lock.json" cuda_lock seconds)
else
  record FAIL "cuda lock" "$(cat "$work/cuda-lock.err")"
fi
if [ "$stage_ok" = 1 ]; then
  stage_ok=0
  if cuda_step checkpoint; then
    check_state checkpoint checkpointed && stage_ok=1
  else
    record FAIL "cuda checkpoint" "$(cat "$work/cuda-checkpoint.err")"
  fi
fi
if [ "$stage_ok" = 1 ]; then
  ckpt_s=$(stage_get "$work/cuda-checkpoint.json" cuda_checkpoint seconds)
  used_before=$(json_get "$work/cuda-checkpoint.json" gpu_memory_used_before)
  used_after=$(json_get "$work/cuda-checkpoint.json" gpu_memory_used_after)
  nvsmi_after=$(vram_of_pid "$demo_pid")
  # VRAM released: NVML's device-wide use drops by about the server's state, and nvidia-smi
  # no longer lists the process.
  if [ -n "$used_before" ] && [ -n "$used_after" ]; then
    freed=$((used_before - used_after))
    if awk -v f="$freed" -v v="$vram_bytes" 'BEGIN { exit !(f >= 0.9 * v) }'; then
      record PASS "vram released" "NVML: $(div "$freed" 1e9) GB freed (state $(div "$vram_bytes" 1e9) GB); nvidia-smi: ${nvsmi_before:-?} MiB -> ${nvsmi_after:-not listed}"
    else
      record FAIL "vram released" "NVML: only $(div "$freed" 1e9) GB freed of $(div "$vram_bytes" 1e9) GB"
    fi
  elif [ -n "$nvsmi_before" ]; then
    if [ -z "$nvsmi_after" ] || [ "$nvsmi_after" = 0 ]; then
      record PASS "vram released" "nvidia-smi: $nvsmi_before MiB -> not listed"
    else
      record FAIL "vram released" "nvidia-smi still lists $nvsmi_after MiB for pid $demo_pid"
    fi
  else
    record SKIP "vram released" "neither NVML nor nvidia-smi answered"
  fi
  cuda_step state
  got=$(json_get "$work/cuda-state.json" state_after)
  if [ "$got" = checkpointed ]; then
    record PASS "cuda state" "a separate gpuckpt process sees 'checkpointed'"
  else
    record FAIL "cuda state" "'$got': $(cat "$work/cuda-state.err")"
  fi
  stage_ok=0
  if cuda_step restore; then
    check_state restore locked && stage_ok=1
    rest_s=$(stage_get "$work/cuda-restore.json" cuda_restore seconds)
  else
    record FAIL "cuda restore" "$(cat "$work/cuda-restore.err")"
  fi
fi
if [ "$stage_ok" = 1 ]; then
  if cuda_step unlock; then
    check_state unlock running
    unlock_s=$(stage_get "$work/cuda-unlock.json" cuda_unlock seconds)
  else
    record FAIL "cuda unlock" "$(cat "$work/cuda-unlock.err")"
  fi
else
  # Whatever failed, do not leave the server frozen on the GPU for the next checks.
  cuda_step resume >/dev/null 2>&1 || cuda_step unlock >/dev/null 2>&1
fi
# The stage figures, beside the ceilings measured above (pinned copies: the PCIe ceiling).
record INFO "stage figures" "lock ${lock_s:-?} s | checkpoint $(gbps "${vram_bytes:-0}" "${ckpt_s:-0}") GB/s D2H in ${ckpt_s:-?} s (PCIe pinned D2H ceiling ${d2h:-?} GB/s) | restore $(gbps "${vram_bytes:-0}" "${rest_s:-0}") GB/s H2D in ${rest_s:-?} s (PCIe pinned H2D ceiling ${h2d:-?} GB/s) | unlock ${unlock_s:-?} s | HBM ${bw:-?} GB/s | bf16 tensor ${tensor:-?} GFLOP/s, mma.sync (not wgmma)"

state=$(ask "$demo_sock" STATE)
if [ "$(hash_of "$state")" = "$hash_before" ]; then
  record PASS "vram hash (cuda)" "identical after checkpoint+restore: $hash_before"
else
  record FAIL "vram hash (cuda)" "before $hash_before, after '$state'"
fi

# Restore through the gpuPairs path (identity map: a one-GPU machine has no other target).
if [ "$remap" != true ]; then
  record SKIP "cuda remap restore" "driver without GPU remapping (needs CUDA 13.0 / r580)"
elif have_time 30 "cuda remap restore"; then
  if cuda_step suspend && cuda_step resume --gpu-map "$gpu_uuid=$gpu_uuid" &&
     [ "$(hash_of "$(ask "$demo_sock" STATE)")" = "$hash_before" ]; then
    record PASS "cuda remap restore" "suspend + resume --gpu-map $gpu_uuid=$gpu_uuid, hash unchanged"
  else
    record FAIL "cuda remap restore" "$(cat "$work/cuda-suspend.err" "$work/cuda-resume.err" 2>/dev/null)"
    cuda_step resume >/dev/null 2>&1
  fi
fi

a=$(ask "$demo_sock" "GEN after the CUDA checkpoint") b=$(ask "$twin_sock" "GEN after the CUDA checkpoint")
if [ -n "$a" ] && [ "$a" = "$b" ]; then
  record PASS "serving after restore" "same answer as the never-checkpointed twin: $a"
else
  record FAIL "serving after restore" "demo '$a' vs twin '$b'"
fi

# ---- CRIU ----------------------------------------------------------------------------------

criu_bin=${GPUCKPT_CRIU:-}
if [ -z "$criu_bin" ]; then
  for c in "${GPUCKPT_CRIU_PREFIX:-/opt/gpuckpt-criu}/bin/criu" "$(command -v criu 2>/dev/null)"; do
    if [ -n "$c" ] && [ -x "$c" ]; then criu_bin=$c; break; fi
  done
fi
criu_ok=0
criu_args=()
if [ "$do_criu" = 0 ]; then
  record SKIP "criu" "--no-criu"
elif [ -z "$criu_bin" ]; then
  record SKIP "criu" "CRIU is not installed here (scripts/install-criu.sh needs apt)"
elif [ ! -f "$plugin_dir/gpuckpt_criu_plugin.so" ]; then
  record SKIP "criu" "the CRIU plugin was not built (no criu-plugin.h at configure time)"
else
  export GPUCKPT_CRIU="$criu_bin"
  criu_ok=1
  # A failed `criu check` often names a feature these dumps do not use; the dumps themselves
  # then say what fails, which is worth more on a rare GPU machine than a SKIP.
  if timeout "$(cap 30)" "$criu_bin" check >"$work/criu-check.log" 2>&1; then
    record PASS "criu check" "$("$criu_bin" --version 2>/dev/null | head -n 1)"
  else
    criu_args+=(--no-criu-check)
    record INFO "criu check" "fails here, dumping all the same: $(tail -n 3 "$work/criu-check.log" | tr '\n' ' ')"
  fi
fi

save_criu_logs() {  # save_criu_logs TAG
  {
    echo "==== $1"
    cat "$work/$1-dump.json" "$work/$1-dump.err" "$work/$1-restore.json" "$work/$1-restore.err"
  } 2>/dev/null | append_result criu.log
}
plugin_figures() {  # plugin_figures FILE BYTES -> device stages of a gpuckpt dump/restore JSON
  # A tree's are "NAME@PID", one per process with CUDA state: their bytes are not known apart.
  local f=$1 bytes=$2 n s out="" names
  names=$(grep -o '"name": *"[^"]*"' "$f" | sed 's/^"name": *"//; s/"$//')
  while read -r n; do
    s=$(stage_get "$f" "$n" seconds)
    [ -n "$s" ] || continue
    case $n in
      device_checkpoint|device_restore) out+="$n ${s} s ($(gbps "$bytes" "$s") GB/s) " ;;
      *) out+="$n ${s} s " ;;
    esac
  done < <(grep -E '^(cuda_init|device_lock|device_checkpoint|device_restore|unlock)(@[0-9]+)?$' <<<"$names")
  echo "${out:-no device stages}"
}

# gpuckpt dump of PID to CKPT (extra dump args after), then waits for the pid to be free.
criu_dump() {  # criu_dump TAG PID CKPT [ARGS...] -> 0 on success
  local tag=$1 pid=$2 ckpt=$3 t0
  shift 3
  t0=$(now)
  if timeout "$(cap 150)" "$gpuckpt" --json dump --pid "$pid" -o "$ckpt" "${criu_args[@]}" "$@" \
      >"$work/$tag-dump.json" 2>"$work/$tag-dump.err"; then
    record PASS "$tag dump" "$(json_get "$work/$tag-dump.json" image_bytes) image bytes, gpu=$(json_get "$work/$tag-dump.json" gpu) ($(elapsed "$t0") s)"
    print_timeline "$work/$tag-dump.json"
    return 0
  fi
  record FAIL "$tag dump" "$(tail -n 5 "$work/$tag-dump.err" | tr '\n' ' ')"
  return 1
}
wait_gone() {  # wait_gone PID: reaps/awaits it, so that CRIU can restore with that pid
  wait "$1" 2>/dev/null
  for _ in $(seq 100); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  return 1
}
criu_restore() {  # criu_restore TAG CKPT SOCK PROBE_REQUEST [ARGS...] -> sets new_pid
  local tag=$1 ckpt=$2 sock=$3 req=$4 t0
  shift 4
  t0=$(now)
  new_pid=""
  if timeout "$(cap 150)" "$gpuckpt" --json restore "$ckpt" --probe "unix:$sock" --request "$req" \
      "${criu_args[@]}" "$@" \
      >"$work/$tag-restore.json" 2>"$work/$tag-restore.err"; then
    new_pid=$(json_get "$work/$tag-restore.json" pid)
    children+=("$new_pid")
    restored+=("$new_pid")
    record PASS "$tag restore" "pid $new_pid, first answer '$(json_get "$work/$tag-restore.json" first_answer)' ($(elapsed "$t0") s)"
    print_timeline "$work/$tag-restore.json"
    return 0
  fi
  record FAIL "$tag restore" "$(tail -n 5 "$work/$tag-restore.err" | tr '\n' ' ')"
  return 1
}

# ---- a real workload: a PyTorch decoder, dumped mid-conversation -------------------------

torch_server=$here/scripts/gpu/torch_decoder_server.py
if [ "$do_torch" = 0 ]; then
  record SKIP torch "--no-torch"
elif ! LD_LIBRARY_PATH=$orig_ld_library_path python3 -c 'import torch' >/dev/null 2>&1; then
  record SKIP torch "python3 with torch is not installed here"
elif [ "$criu_ok" = 0 ]; then
  record SKIP torch "needs CRIU (above)"
elif have_time 150 torch; then
  tsay() {  # tsay TEXT: one conversation turn on both servers; 1 when they differ
    local turn=$1 x y
    x=$(ask_any torch "$torch_sock" "SAY 12 $turn") y=$(ask_any torch "$ttwin_sock" "SAY 12 $turn")
    if [ -n "$x" ] && [ "$x" = "$y" ] && [ "${x%% *}" = OK ]; then last_turn=$x; return 0; fi
    last_turn="server '$x' vs reference '$y'"
    return 1
  }
  tstate_equal() {
    [ "$(ask_any torch "$torch_sock" STATE)" = "$(ask_any torch "$ttwin_sock" STATE)" ]
  }
  # The three wall-clock numbers of the mission for this decoder, beside the ceilings measured
  # above: a cold start (python, torch and the model from nothing to the first answer), a
  # restore from a checkpoint, and a migration; then `gpuckpt report` puts them side by side.
  # The conversation must go on exactly after all of it (the restore's last copy is kept, then
  # migrated).
  transient_figures() {
    local b=$work/bench f k ok=1 py
    mkdir -p "$b"
    py=(env "LD_LIBRARY_PATH=$orig_ld_library_path" PYTHONUNBUFFERED=1 python3 "$torch_server")
    if ! timeout "$(cap 90)" "$gpuckpt" --json bench coldstart --runs 2 --probe "unix:$b/cold.sock" \
        --request PING --probe-timeout 80 -- "${py[@]}" --socket "$b/cold.sock" \
        --gib "$torch_gib" --seed 7 >"$b/coldstart.json" 2>"$b/coldstart.err"; then
      record FAIL "torch coldstart" "$(tail -n 3 "$b/coldstart.err" | tr '\n' ' ')"
      return
    fi
    criu_dump bench "$torch_pid" "$b/torch.ckpt" || return
    wait_gone "$torch_pid" || { record FAIL "torch bench" "pid $torch_pid still there after the dump"; return; }
    if ! timeout "$(cap 60)" "$gpuckpt" --json bench restore "$b/torch.ckpt" --runs 2 --keep \
        --probe "unix:$torch_sock" --request PING "${criu_args[@]}" >"$b/restore.json" \
        2>"$b/restore.err"; then
      record FAIL "torch bench restore" "$(tail -n 3 "$b/restore.err" | tr '\n' ' ')"
      return
    fi
    if ! timeout "$(cap 60)" "$gpuckpt" --json bench migrate --pid "$torch_pid" --to "$b/migrate" \
        --probe "unix:$torch_sock" --request PING "${criu_args[@]}" >"$b/migrate.json" \
        2>"$b/migrate.err"; then
      record FAIL "torch bench migrate" "$(tail -n 3 "$b/migrate.err" | tr '\n' ' ')"
      return
    fi
    local line=""
    for k in coldstart restore migrate; do
      line+="$k $(json_get "$b/$k.json" summary.median_seconds) s (median of $(json_get "$b/$k.json" summary.runs)), "
    done
    record INFO "torch transient" "${line}decoder of ${torch_gib} GiB bf16 with its KV cache, to the first answer"
    f=(--coldstart "$b/coldstart.json" --restore "$b/restore.json" --migrate "$b/migrate.json")
    if [ -s "$work/cli-roofline.json" ]; then f+=(--roofline "$work/cli-roofline.json"); fi
    if timeout "$(cap 30)" "$gpuckpt" --json report "${f[@]}" >"$b/report.json" 2>"$b/report.err" &&
       timeout "$(cap 30)" "$gpuckpt" report "${f[@]}"; then
      keep_result "$b/report.json" transient.json
    else
      ok=0
      record FAIL "gpuckpt report" "$(tail -n 3 "$b/report.err" | tr '\n' ' ')"
    fi
    rm -rf "$b/torch.ckpt" "$b/migrate"
    if tsay "After the benchmarks, go on." && tstate_equal; then
      [ "$ok" = 1 ] && record PASS "torch transient" "restored twice, migrated once: the next tokens and the KV cache still equal the reference: $last_turn"
    else
      record FAIL "torch transient" "$last_turn"
    fi
  }
  t0=$(now)
  launch_server torch torch
  launch_server torch-ref torch  # the uninterrupted reference run
  if await_server torch torch; then
    torch_pid=$srv_pid torch_sock=$srv_sock
    if await_server torch-ref torch; then
      ttwin_sock=$srv_sock
      info=$(ask_any torch "$torch_sock" INFO)
      torch_bytes=$(tr ' ' '\n' <<<"$info" | sed -n 's/^reserved_bytes=//p')
      record PASS "torch servers" "$info; reference pid $srv_pid ($(elapsed "$t0") s)"
      if tsay "Hello, who are you?" && tsay "Tell me about checkpoints."; then
        record PASS "torch conversation" "2 turns, greedy tokens equal the reference: $last_turn"
        round=0
        failures_before_rounds=$failures
        for mode in plain gpu-map leave-running; do
          round=$((round + 1))
          tag=torch$round
          if ! have_time 60 "torch $mode"; then break; fi
          if [ "$mode" = gpu-map ] && [ "$remap" != true ]; then
            record SKIP "torch gpu-map" "driver without GPU remapping (needs CUDA 13.0 / r580)"
            continue
          fi
          ckpt=$work/$tag.ckpt
          restored+=("$torch_pid")
          if [ "$mode" = leave-running ]; then
            criu_dump "$tag" "$torch_pid" "$ckpt" --leave-running || break
          else
            criu_dump "$tag" "$torch_pid" "$ckpt" || break
            wait_gone "$torch_pid" || { record FAIL "$tag" "pid $torch_pid still there after the dump"; break; }
            margs=()
            if [ "$mode" = gpu-map ]; then margs=(--gpu-map "$gpu_uuid=$gpu_uuid"); fi
            criu_restore "$tag" "$ckpt" "$torch_sock" PING "${margs[@]}" || break
            torch_pid=$new_pid
            record INFO "$tag device" "$(plugin_figures "$work/$tag-dump.json" "${torch_bytes:-0}") | restore: $(plugin_figures "$work/$tag-restore.json" "${torch_bytes:-0}")"
          fi
          save_criu_logs "$tag"
          rm -rf "$ckpt"
          if tsay "Round $round: go on where we stopped." && tstate_equal; then
            record PASS "torch $mode" "the next tokens and the KV cache equal the uninterrupted reference: $last_turn"
          else
            record FAIL "torch $mode" "$last_turn"
            break
          fi
        done
        if [ "$failures" -eq "$failures_before_rounds" ] && have_time 90 "torch transient"; then
          transient_figures
        fi
      else
        record FAIL "torch conversation" "$last_turn"
      fi
    fi
  fi
fi

# ---- full dump/restore of the demo server through CRIU -----------------------------------

if [ "$criu_ok" = 1 ] && have_time 90 "demo criu"; then
  hash_before=$(hash_of "$(ask "$demo_sock" STATE)")
  if criu_dump demo "$demo_pid" "$work/demo.ckpt"; then
    record INFO "demo dump device" "$(plugin_figures "$work/demo-dump.json" "${vram_bytes:-0}")"
    wait_gone "$demo_pid"
    if criu_restore demo "$work/demo.ckpt" "$demo_sock" STATE; then
      demo_pid=$new_pid
      record INFO "demo restore device" "$(plugin_figures "$work/demo-restore.json" "${vram_bytes:-0}")"
      state=$(ask "$demo_sock" STATE)
      if [ "$(hash_of "$state")" = "$hash_before" ]; then
        record PASS "vram hash (criu)" "identical after dump+restore: $hash_before"
      else
        record FAIL "vram hash (criu)" "before $hash_before, after '$state'"
      fi
      a=$(ask "$demo_sock" "GEN after CRIU") b=$(ask "$twin_sock" "GEN after CRIU")
      if [ -n "$a" ] && [ "$a" = "$b" ]; then
        record PASS "serving after criu" "same answer as the twin: $a"
      else
        record FAIL "serving after criu" "restored '$a' vs twin '$b'"
      fi
    fi
  fi
  save_criu_logs demo
  rm -rf "$work/demo.ckpt"
fi

# ---- gpuckpt killed in the middle of a dump: the service runs on, its VRAM given back ----
# The CRIU plugin locks and checkpoints the server's CUDA state while gpuckpt waits for criu;
# gpuckpt learns which tasks once criu has finished. Killed before (criu_dump) or after
# (compress_write, in a staged dump: --staging) that, the guard must resume the server with its
# VRAM back on the GPU, and with the guard killed too, the next `gpuckpt recover` must. A
# streaming dump (the default: no --staging) killed at criu_dump takes criu's image stream down
# with gpuckpt while the plugin may be locking or checkpointing: whether the plugin had begun
# depends on timing, so there only the server's answers are checked, not the summary's words.
# The proof: the server answers STATE (a CUDA call: it blocks while the state is locked or in
# host memory) with the hash of before, and its next answer equals the twin's.
children_named() {  # children_named PARENT COMM -> pids
  local d
  for d in /proc/[0-9]*; do
    [ "$(cat "$d/comm" 2>/dev/null)" = "$2" ] || continue
    [ "$(awk '{ print $4 }' "$d/stat" 2>/dev/null)" = "$1" ] && echo "${d#/proc/}"
  done
}
if [ "$criu_ok" = 1 ] && ! kill -0 "$demo_pid" 2>/dev/null; then
  record SKIP "dump killed" "the demo server (pid $demo_pid) is not running"
elif [ "$criu_ok" = 1 ]; then
  for fault in criu_dump compress_write criu_dump+guard criu_dump+stream; do
    have_time 40 "dump killed at $fault" || break
    point=${fault%+*}
    staging=(--staging "$work/fault-staging")
    [ "$fault" = criu_dump+stream ] && staging=()
    hash_before=$(hash_of "$(ask "$demo_sock" STATE)")
    mark=$work/fault.mark
    rm -rf "$mark" "$work/fault.ckpt" "$work/fault-staging"
    mkdir -p "$work/fault-staging"
    t0=$(now)
    GPUCKPT_FAULT_PAUSE=$point GPUCKPT_FAULT_MARK=$mark "$gpuckpt" dump --pid "$demo_pid" \
      -o "$work/fault.ckpt" "${staging[@]}" "${criu_args[@]}" \
      >"$work/fault.out" 2>&1 &
    g=$!
    limit=$((SECONDS + $(cap 60)))
    until [ -e "$mark" ] || ! kill -0 "$g" 2>/dev/null || [ $SECONDS -ge $limit ]; do sleep 0.1; done
    if [ ! -e "$mark" ]; then
      kill -9 "$g" 2>/dev/null
      wait "$g" 2>/dev/null
      record FAIL "dump killed at $fault" "gpuckpt never reached $point: $(tail -n 3 "$work/fault.out" | tr '\n' ' ')"
      break
    fi
    guard=$(children_named "$g" gpuckpt-guard | head -n 1)
    if [ -z "$guard" ]; then
      kill -9 "$g"
      record FAIL "dump killed at $fault" "no gpuckpt-guard child of gpuckpt $g"
      break
    fi
    rm -f "$work/recover.json"
    if [ "$fault" != criu_dump+guard ]; then
      how="its guard"
      kill -9 "$g"
      wait "$g" 2>/dev/null
      # Its summary goes to the stderr it shares with gpuckpt once it has recovered.
      limit=$((SECONDS + $(cap 90)))
      while kill -0 "$guard" 2>/dev/null && [ $SECONDS -lt $limit ]; do sleep 0.1; done
      summary=$(sed -n 's/^gpuckpt-guard: gpuckpt ended in the middle of an operation; //p' "$work/fault.out")
    else
      how="gpuckpt recover"
      kill -9 "$guard" "$g"
      wait "$g" 2>/dev/null
      timeout "$(cap 90)" "$gpuckpt" --json recover >"$work/recover.json" 2>"$work/recover.err"
      summary=$(json_get "$work/recover.json" recovered.0.summary)
    fi
    state=$(ask "$demo_sock" STATE)
    a=$(ask "$demo_sock" "GEN after a killed dump") b=$(ask "$twin_sock" "GEN after a killed dump")
    if [ "$(hash_of "$state")" = "$hash_before" ] && [ -n "$a" ] && [ "$a" = "$b" ] &&
       [ ! -e "$work/fault.ckpt" ] &&
       { [ "$fault" = criu_dump+stream ] ||
         [[ $summary == *"the CUDA state of process $demo_pid was restored"* ]]; }; then
      record PASS "dump killed at $fault" "SIGKILL at $point: $how resumed pid $demo_pid with its VRAM (hash $hash_before) and no checkpoint ('$summary'); next answer equals the twin's ($(elapsed "$t0") s)"
    else
      record FAIL "dump killed at $fault" "after SIGKILL at $point ($how): summary '$summary', STATE '$state' (before $hash_before), answer '$a' vs twin '$b', checkpoint left: $([ -e "$work/fault.ckpt" ] && echo yes || echo no); $(tail -n 3 "$work/fault.out" "$work/recover.err" 2>/dev/null | tr '\n' ' ')"
      break
    fi
  done
fi

# ---- a tree with CUDA in several processes: the front and two workers ----------------------
# Like a tensor-parallel server: the front never touches CUDA and each worker holds its share of
# the VRAM state. The CRIU plugin must lock and checkpoint every worker, the restore must bring
# back all of them with their VRAM, and a dump killed after the checkpoint must leave every
# worker running with its VRAM back on the GPU.
tree_pids() {  # tree_pids SOCKET -> the front's pid and the workers', one per line
  local info
  info=$(ask "$1" INFO)
  tr ' ' '\n' <<<"$info" | sed -n -e 's/^pid=//p' -e 's/^worker_pids=//p' | tr ',' '\n'
}
tree_round() {  # tree_round TAG: STATE hash unchanged and the next answer equals the twin's
  local tag=$1 state a b
  state=$(ask "$tree_sock" STATE)
  a=$(ask "$tree_sock" "GEN $tag") b=$(ask "$ttree_sock" "GEN $tag")
  if [ -n "$tree_hash" ] && [ "$(hash_of "$state")" = "$tree_hash" ] && [ -n "$a" ] &&
     [ "$a" = "$b" ]; then
    tree_hash=$(hash_of "$(ask "$tree_sock" STATE)")
    return 0
  fi
  tree_why="STATE '$state' (before $tree_hash), answer '$a' vs twin '$b'"
  return 1
}
if [ "$criu_ok" = 1 ] && have_time 70 "cuda tree"; then
  t0=$(now)
  launch_server tree demo 2 --workers 2
  launch_server tree-twin demo 2 --workers 2
  if await_server tree demo && tree_sock=$srv_sock && await_server tree-twin demo; then
    ttree_sock=$srv_sock
    mapfile -t tpids < <(tree_pids "$tree_sock")
    mapfile -t twpids < <(tree_pids "$ttree_sock")
    children+=("${tpids[@]}" "${twpids[@]}")
    a=$(ask "$tree_sock" "GEN a tree") b=$(ask "$ttree_sock" "GEN a tree")
    tree_hash=$(hash_of "$(ask "$tree_sock" STATE)")
    if [ "${#tpids[@]}" -eq 3 ] && [ -n "$tree_hash" ] && [ -n "$a" ] && [ "$a" = "$b" ]; then
      record PASS "tree server" "front ${tpids[0]}, CUDA workers ${tpids[1]} ${tpids[2]} (2 GiB of VRAM state between them), twin agrees: $a ($(elapsed "$t0") s)"
      tree_ok=1
    else
      record FAIL "tree server" "pids '${tpids[*]}', answer '$a' vs twin '$b'"
      tree_ok=0
    fi
    if [ "$tree_ok" = 1 ] && criu_dump tree "${tpids[0]}" "$work/tree.ckpt"; then
      restored+=("${tpids[@]}")
      gone=1
      for p in "${tpids[@]}"; do wait_gone "$p" || gone=0; done
      if [ "$gone" = 0 ]; then
        record FAIL "tree dump" "the tree's processes are still there after the dump"
      elif criu_restore tree "$work/tree.ckpt" "$tree_sock" STATE; then
        mapfile -t npids < <(tree_pids "$tree_sock")
        children+=("${npids[@]}")
        restored+=("${npids[@]}")
        record INFO "tree device" "$(plugin_figures "$work/tree-dump.json" 2147483648) | restore: $(plugin_figures "$work/tree-restore.json" 2147483648)"
        if [ "${npids[*]}" = "${tpids[*]}" ] && tree_round "after a restore"; then
          record PASS "tree restored" "pids ${npids[*]} as before, the workers' VRAM hash unchanged, the next answer equals the twin's"
        else
          record FAIL "tree restored" "pids '${npids[*]}' (before '${tpids[*]}'), ${tree_why:-}"
          tree_ok=0
        fi
      else
        tree_ok=0
      fi
      save_criu_logs tree
    else
      tree_ok=0
    fi
    rm -rf "$work/tree.ckpt"
    # Killed after the plugin has checkpointed both workers (a staged dump at compress_write).
    if [ "$tree_ok" = 1 ] && have_time 40 "tree dump killed"; then
      mark=$work/tree-fault.mark
      rm -rf "$mark" "$work/tree-fault.ckpt" "$work/tree-staging"
      mkdir -p "$work/tree-staging"
      t0=$(now)
      GPUCKPT_FAULT_PAUSE=compress_write GPUCKPT_FAULT_MARK=$mark "$gpuckpt" dump \
        --pid "${tpids[0]}" -o "$work/tree-fault.ckpt" --staging "$work/tree-staging" \
        "${criu_args[@]}" >"$work/tree-fault.out" 2>&1 &
      g=$!
      limit=$((SECONDS + $(cap 60)))
      until [ -e "$mark" ] || ! kill -0 "$g" 2>/dev/null || [ $SECONDS -ge $limit ]; do sleep 0.1; done
      guard=$(children_named "$g" gpuckpt-guard | head -n 1)
      if [ ! -e "$mark" ] || [ -z "$guard" ]; then
        kill -9 "$g" 2>/dev/null
        wait "$g" 2>/dev/null
        record FAIL "tree dump killed" "gpuckpt never reached compress_write, or has no guard: $(tail -n 3 "$work/tree-fault.out" | tr '\n' ' ')"
      else
        kill -9 "$g"
        wait "$g" 2>/dev/null
        limit=$((SECONDS + $(cap 90)))
        while kill -0 "$guard" 2>/dev/null && [ $SECONDS -lt $limit ]; do sleep 0.1; done
        summary=$(sed -n 's/^gpuckpt-guard: gpuckpt ended in the middle of an operation; //p' "$work/tree-fault.out")
        words=1
        for p in "${tpids[1]}" "${tpids[2]}"; do
          [[ $summary == *"the CUDA state of process $p was restored"* ]] || words=0
        done
        if [ "$words" = 1 ] && [ ! -e "$work/tree-fault.ckpt" ] && tree_round "after a killed dump"; then
          record PASS "tree dump killed" "SIGKILL at compress_write: its guard gave both workers their VRAM back and resumed the tree, no checkpoint ('$summary'); the hash is unchanged and the next answer equals the twin's ($(elapsed "$t0") s)"
        else
          record FAIL "tree dump killed" "summary '$summary', ${tree_why:-}, checkpoint left: $([ -e "$work/tree-fault.ckpt" ] && echo yes || echo no); $(tail -n 3 "$work/tree-fault.out" | tr '\n' ' ')"
        fi
      fi
    fi
  fi
fi

# ---- the GPU tests -------------------------------------------------------------------------

if [ "$do_tests" = 1 ]; then
  for t in "${gpu_tests[@]}"; do
    if [ ! -x "$tests_dir/$t" ]; then
      record FAIL "$t" "not built (GoogleTest missing?): the check is incomplete"
      continue
    fi
    have_time 20 "$t" || continue
    t0=$(now)
    if timeout "$(cap 120)" "$tests_dir/$t" >"$work/$t.log" 2>&1; then
      record PASS "$t" "$(grep -c '^\[       OK \]' "$work/$t.log") passed, $(grep -c '^\[  SKIPPED \] .* ([0-9]* ms)$' "$work/$t.log") skipped ($(elapsed "$t0") s)"
    else
      record FAIL "$t" "$(grep -E '^\[  FAILED  \]|Failure|Timeout' "$work/$t.log" | head -n 5 | tr '\n' ' ') (exit or timeout after $(elapsed "$t0") s)"
    fi
    append_result tests.log <"$work/$t.log"
  done
fi

# ---- the storage path on this machine: gpuckpt bench dump (--bench-dump SIZE) --------------
# The storage bench (gpuckpt streamed and staged, plain criu -D; each beside its floor) on a
# host with many cores, where the dev VM's 2 vCPUs are the bound. On the repository's disk: the
# work dir may be a tmpfs. Last: it takes what is left of the budget.
bench_table() {  # bench_table FILE -> the ceilings and floors, then one line per method
  LD_LIBRARY_PATH=$orig_ld_library_path python3 - "$1" <<'EOF' 2>&1
import json, sys
j = json.load(open(sys.argv[1]))
p, f = j["path"], j["floors"]
print(f"cores {p['cores']}, write {p['disk_write_gbps']:.2f} GB/s, read {p['disk_read_gbps']:.2f} GB/s, "
      f"fill {p['fill_gbps']:.2f} / huge {p['fill_huge_gbps']:.2f} GB/s, zstd {p['zstd_compress_gbps']:.2f} / "
      f"{p['zstd_decompress_gbps']:.2f} GB/s per core; floors: dump {f['dump']['seconds']:.2f} s "
      f"({f['dump']['bound']}), restore {f['restore']['seconds']:.2f} s ({f['restore']['bound']})")
for m in j["methods"]:
    r = lambda k: m.get(k) if m.get(k) is not None else float("nan")
    print(f"  {m['name']:<12} dump {r('dump_median_seconds'):6.2f} s ({r('dump_time_vs_criu'):.2f}x criu, "
          f"{r('dump_percent_of_floor'):.0f}% of floor; exited {r('dump_exit_median_seconds'):.2f} s) "
          f"runs {m.get('dump_seconds')}, restore "
          f"{r('restore_median_seconds'):6.2f} s ({r('restore_time_vs_criu'):.2f}x criu, "
          f"{r('restore_percent_of_floor'):.0f}% of floor) runs {m.get('restore_seconds')}, extra "
          f"{r('dump_extra_median_bytes') / 2**20:.0f} / {r('restore_extra_median_bytes') / 2**20:.0f} MiB")
EOF
}
if [ -n "$bench_size" ] && [ "$criu_ok" = 0 ]; then
  record SKIP "bench dump" "needs CRIU (above)"
elif [ -n "$bench_size" ] && have_time 150 "bench dump"; then
  bdir=$here/.gpu-check-bench
  rm -rf "$bdir" && mkdir -p "$bdir"
  record INFO "bench disk" "$(df -hT "$bdir" | tail -n 1 | awk '{ print $2, $3, "on", $7 }'); staging: $(df -hT /dev/shm | tail -n 1 | awk '{ print $2, $3 }')"
  t0=$(now)
  if timeout "$(cap 900)" "$gpuckpt" --json bench dump --dir "$bdir" --size "$bench_size" \
      --runs 3 "${criu_args[@]}" >"$work/bench-dump.json" 2>"$work/bench-dump.err"; then
    keep_result "$work/bench-dump.json" bench-dump.json
    table=$(bench_table "$work/bench-dump.json")
    printf '%s\n' "$table"
    record INFO "bench dump" "$(head -n 1 <<<"$table")"
    record PASS "bench dump" "$bench_size, 3 runs of each method ($(elapsed "$t0") s); the table is in the log and bench-dump.json"
  else
    record FAIL "bench dump" "$(tail -n 5 "$work/bench-dump.err" | tr '\n' ' ') ($(elapsed "$t0") s)"
  fi
  rm -rf "$bdir"
fi

if [ "$failures" -gt 0 ]; then exit 1; fi
exit 0
