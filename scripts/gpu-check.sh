#!/usr/bin/env bash
# shellcheck disable=SC2317  # cleanup() and print_summary() run from the EXIT trap
# End-to-end check of gpuckpt on a machine with an NVIDIA GPU and its driver (docs/GPU.md):
# builds what it needs, lists the GPUs, measures the roofline ceilings, starts the CUDA demo
# server with several GiB of VRAM state, checkpoints that VRAM to host memory and back through
# the CUDA driver API (no CRIU needed) and checks the GPU-side hash of the whole VRAM state is
# unchanged; then, where CRIU works, a full `gpuckpt dump` + `gpuckpt restore`. Prints a
# summary and exits non-zero if any check failed. Logs and results go to $OUT when set.
#
#   scripts/gpu-check.sh                      # build in build-gpu-check/, then check
#   scripts/gpu-check.sh --make-bundle DIR    # on a dev machine (no GPU needed): build a
#                                             # self-contained bundle for a GPU machine that
#                                             # lacks the build dependencies
#   scripts/gpu-check.sh --bundle DIR         # on the GPU machine: check with that bundle
# Options: --build-dir DIR, --vram-gib N (default 8), --no-criu, --no-tests, --keep, --jobs N
# Exit: 0 all checks passed (some may be skipped), 1 a check failed, 2 usage, 7 no GPU.
set -uo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
me=gpu-check.sh
build=${GPUCKPT_BUILD_DIR:-$here/build-gpu-check}
bundle=""
make_bundle=""
vram_gib=8
do_criu=1
do_tests=1
keep=0
jobs=16

usage() {  # usage EXIT_CODE
  sed -n "3,16p" "$0" | sed 's/^# \{0,1\}//' >&2
  exit "$1"
}
while [ $# -gt 0 ]; do
  case $1 in
    --build-dir) build=${2:?}; shift ;;
    --bundle) bundle=${2:?}; shift ;;
    --make-bundle) make_bundle=${2:?}; shift ;;
    --vram-gib) vram_gib=${2:?}; shift ;;
    --no-criu) do_criu=0 ;;
    --no-tests) do_tests=0 ;;
    --keep) keep=1 ;;
    --jobs) jobs=${2:?}; shift ;;
    -h|--help) usage 0 ;;
    *) echo "$me: unknown argument $1" >&2; usage 2 ;;
  esac
  shift
done
case $vram_gib in ''|*[!0-9.]*) echo "$me: --vram-gib needs a number" >&2; exit 2 ;; esac

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

results=()
failures=0
children=()
children_links=()
summary_file=$work/summary.txt

say() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*"; }
record() {  # record STATUS NAME DETAIL   (STATUS: PASS, FAIL, SKIP, INFO)
  results+=("$(printf '%-5s %-26s %s' "$1" "$2" "$3")")
  [ "$1" = FAIL ] && failures=$((failures + 1))
  say "[$1] $2: $3"
}
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }
div() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }

print_summary() {
  {
    echo "==== gpuckpt GPU check summary ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -n)) ===="
    local r
    for r in "${results[@]}"; do echo "$r"; done
    if [ "$failures" -eq 0 ]; then echo "RESULT: all checks passed"; else echo "RESULT: $failures check(s) FAILED"; fi
  } >"$summary_file"
  echo
  cat "$summary_file"
  if [ -n "$out_dir" ]; then cp "$summary_file" "$out_dir/summary.txt"; fi
}

cleanup() {
  local rc=$?
  local p
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
trap 'exit 130' INT TERM

die() {  # die CODE MESSAGE
  record FAIL "$me" "$2"
  exit "$1"
}

# JSON fields without jq: python3 where present, else grep/sed on the first "key": value.
have_python=0
command -v python3 >/dev/null 2>&1 && have_python=1
json_get() {  # json_get FILE KEY   -> scalar value of the first "KEY" (nested keys: a.b.c)
  if [ "$have_python" = 1 ]; then
    python3 - "$1" "$2" <<'EOF' 2>/dev/null
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
    python3 - "$1" "$2" "$3" <<'EOF' 2>/dev/null
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
    python3 - "$1" <<'EOF' 2>/dev/null || cat "$1"
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

configure_and_build() {  # configure_and_build WITH_TESTS
  local tests=$1 t targets
  say "configuring $build (Release, tests=$tests)"
  if ! timeout 300 cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DGPUCKPT_BUILD_BENCH=OFF -DGPUCKPT_BUILD_TESTS="$tests" >"$work/cmake.log" 2>&1; then
    return 1
  fi
  targets=(gpuckpt)
  ninja -C "$build" -t targets all >"$work/targets.txt" 2>/dev/null
  for t in gpuckpt-roofline-gpu gpuckpt-cuda-demo-server gpuckpt_criu_plugin \
           device_gpu_test device_cli_test kernels_binaries_test; do
    if grep -q "^$t:" "$work/targets.txt"; then targets+=("$t"); fi
  done
  say "building ${targets[*]} (-j$jobs)"
  timeout 600 ninja -C "$build" -j "$jobs" "${targets[@]}" >"$work/build.log" 2>&1
}

build_all() {
  local t0
  t0=$(now)
  if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
    die 1 "cmake and ninja are needed to build here (or use --bundle, see --make-bundle)"
  fi
  if ! configure_and_build ON && ! configure_and_build OFF; then
    tail -n 25 "$work/cmake.log" "$work/build.log" 2>/dev/null
    die 1 "build failed (log above). On a machine without gpuckpt's build dependencies \
(liburing, zstd, xxhash, spdlog, CLI11, nlohmann-json), build a bundle on a dev machine: \
scripts/gpu-check.sh --make-bundle DIR, then run scripts/gpu-check.sh --bundle DIR here"
  fi
  record PASS build "Release build in $build ($(elapsed "$t0") s)"
  bin=$build/bin
  plugin_dir=$build/lib/gpuckpt/criu
  tests_dir=$build/tests
}

make_bundle_dir() {
  local dest=$1 f lib size
  build_all
  rm -rf "$dest"
  mkdir -p "$dest/bin" "$dest/lib/gpuckpt" "$dest/tests" "$dest/deps"
  cp -L "$bin"/gpuckpt "$bin"/gpuckpt-roofline-gpu "$bin"/gpuckpt-cuda-demo-server "$dest/bin/" ||
    die 1 "the kernels were not built (nvcc missing?)"
  cp -L "$build/lib/gpuckpt/kernels.manifest" "$dest/lib/gpuckpt/" 2>/dev/null
  if [ -d "$plugin_dir" ]; then cp -rL "$plugin_dir" "$dest/lib/gpuckpt/"; fi
  for f in device_gpu_test device_cli_test kernels_binaries_test; do
    if [ -x "$tests_dir/$f" ]; then cp -L "$tests_dir/$f" "$dest/tests/"; fi
  done
  # Shared libraries beyond glibc and the C++ runtime, which every target system has (newer).
  for f in "$dest"/bin/* "$dest"/tests/*; do
    [ -f "$f" ] || continue
    ldd "$f" 2>/dev/null | awk '/=> \// { print $3 }'
  done | sort -u | while read -r lib; do
    case $(basename "$lib") in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
      *) cp -L "$lib" "$dest/deps/" ;;
    esac
  done
  # The tests find the binaries by the build directory compiled into them.
  echo "$build" >"$dest/origin"
  local criu_prefix=${GPUCKPT_CRIU_PREFIX:-/opt/gpuckpt-criu}
  if [ -x "$criu_prefix/bin/criu" ] && [ -d "$criu_prefix/root" ]; then
    tar -C "$criu_prefix" -czf "$dest/criu.tar.gz" bin root
  fi
  size=$(du -sm "$dest" | cut -f1)
  local nlibs extra=""
  nlibs=$(find "$dest/deps" -type f | wc -l)
  if [ -f "$dest/criu.tar.gz" ]; then extra=", CRIU"; fi
  record PASS bundle "$dest: ${size} MiB (${nlibs} libraries${extra})"
  if [ "$size" -gt 60 ]; then
    record INFO bundle "over 60 MiB: the device tool carries 64 MiB at most"
  fi
  say "on the GPU machine: scripts/gpu-check.sh --bundle $dest"
}

use_bundle() {
  local dir origin
  dir=$(cd "$bundle" 2>/dev/null && pwd) || die 2 "bundle $bundle does not exist"
  [ -x "$dir/bin/gpuckpt" ] || die 2 "$dir is not a bundle made by --make-bundle"
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
  make_bundle_dir "$make_bundle"
  exit 0
fi
say "gpuckpt GPU check: repo $here, work dir $work, VRAM state ${vram_gib} GiB"
if [ -n "$bundle" ]; then use_bundle; else build_all; fi
gpuckpt=$bin/gpuckpt
server=$bin/gpuckpt-cuda-demo-server
roofline=$bin/gpuckpt-roofline-gpu

# ---- devices -----------------------------------------------------------------------------

"$gpuckpt" devices
rc=0
timeout 120 "$gpuckpt" --json devices >"$work/devices.json" || rc=$?
if [ -n "$out_dir" ]; then cp "$work/devices.json" "$out_dir/devices.json"; fi
if [ "$rc" = 7 ]; then
  record FAIL devices "$(json_get "$work/devices.json" reason)"
  exit 7
fi
[ "$rc" = 0 ] || die 1 "gpuckpt devices failed (exit $rc)"
gpu_name=$(json_get "$work/devices.json" gpus.0.name)
gpu_uuid=$(json_get "$work/devices.json" gpus.0.uuid)
ckpt_api=$(json_get "$work/devices.json" driver.checkpoint_api)
remap=$(json_get "$work/devices.json" driver.gpu_remap)
record PASS devices "$gpu_name $gpu_uuid, $(json_get "$work/devices.json" driver.cuda_version_string), NVIDIA $(json_get "$work/devices.json" driver.kernel_module_version), checkpoint API: $ckpt_api, GPU remap: $remap"

# ---- roofline ----------------------------------------------------------------------------

bw="" d2h="" h2d=""
if [ -x "$roofline" ]; then
  t0=$(now)
  if timeout 300 "$roofline" >"$work/roofline.json" 2>"$work/roofline.err"; then
    if [ -n "$out_dir" ]; then cp "$work/roofline.json" "$out_dir/roofline.json"; fi
    bw=$(json_get "$work/roofline.json" bandwidth_gbps)
    d2h=$(json_get "$work/roofline.json" details.d2h_pinned_gbps)
    h2d=$(json_get "$work/roofline.json" details.h2d_pinned_gbps)
    record PASS roofline "HBM $bw GB/s (copy $(json_get "$work/roofline.json" details.copy_gbps), triad $(json_get "$work/roofline.json" details.triad_gbps)), FP32 $(json_get "$work/roofline.json" fp32_gflops) GFLOP/s, bf16 tensor $(json_get "$work/roofline.json" tensor_gflops) GFLOP/s, pinned H2D $h2d / D2H $d2h GB/s ($(elapsed "$t0") s)"
  else
    record FAIL roofline "gpuckpt-roofline-gpu failed: $(tail -n 3 "$work/roofline.err")"
  fi
  # The CLI's view of the same measurement (runs the binary next to gpuckpt).
  if timeout 300 "$gpuckpt" --json roofline --target gpu --quick >"$work/cli-roofline.json" 2>"$work/cli-roofline.err"; then
    record PASS "gpuckpt roofline" "parsed the kernels' JSON"
  else
    record FAIL "gpuckpt roofline" "$(tail -n 2 "$work/cli-roofline.err")"
  fi
else
  record FAIL roofline "$roofline missing: nvcc was not found when building"
fi

# ---- the CUDA demo server ----------------------------------------------------------------

[ -x "$server" ] || die 1 "$server missing: nvcc was not found when building"
[ "$ckpt_api" = true ] || die 1 "the driver lacks the checkpoint API: $(json_get "$work/devices.json" driver.checkpoint_error)"

start_server() {  # start_server NAME -> sets srv_pid, srv_sock
  local name=$1 deadline
  srv_sock=$work/$name.sock
  # Own session: CRIU dumps it as a standalone tree, and the check's shell is not part of it.
  local session=()
  if command -v setsid >/dev/null; then session=(setsid); fi
  "${session[@]}" "$server" --socket "$srv_sock" --vram-gib "$vram_gib" --seed 7 \
    </dev/null >"$work/$name.out" 2>"$work/$name.err" &
  srv_pid=$!
  disown "$srv_pid"  # killed on purpose (cleanup, CRIU dump): no job notices
  children+=("$srv_pid")
  deadline=$((SECONDS + 180))
  until grep -q '^READY ' "$work/$name.out" 2>/dev/null; do
    if ! kill -0 "$srv_pid" 2>/dev/null && ! grep -q '^READY ' "$work/$name.out"; then
      die 1 "$name server exited: $(cat "$work/$name.err")"
    fi
    [ $SECONDS -lt $deadline ] || die 1 "$name server printed no READY within 180 s"
    sleep 0.2
  done
  # The server's own pid (setsid forks when it would otherwise lead a process group).
  srv_pid=$(ask "$srv_sock" INFO | tr ' ' '\n' | sed -n 's/^pid=//p')
  [ -n "$srv_pid" ] || die 1 "$name server does not answer INFO"
  children+=("$srv_pid")
}
ask() {  # ask SOCKET REQUEST -> the reply on stdout
  timeout 180 "$server" --client "$1" "$2" --timeout-ms 170000
}
hash_of() { awk '{ print $3 }' <<<"$1"; }

t0=$(now)
start_server demo
demo_pid=$srv_pid demo_sock=$srv_sock
start_server twin  # same seed and requests, never checkpointed: what the restored one must equal
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
  timeout 30 nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
    awk -F', *' -v p="$1" '$1 == p { print $2 }'
}

# ---- CUDA checkpoint without CRIU: lock, checkpoint, restore, unlock ---------------------

cuda_step() {  # cuda_step ACTION [ARGS...] -> $work/cuda-ACTION.json; returns gpuckpt's exit code
  local action=$1
  shift
  timeout 300 "$gpuckpt" --json cuda-checkpoint --pid "$demo_pid" --action "$action" "$@" \
    >"$work/cuda-$action.json" 2>"$work/cuda-$action.err"
}
check_state() {  # check_state ACTION EXPECTED -> records the step; 1 on a wrong state
  local action=$1 want=$2 got secs stage
  got=$(json_get "$work/cuda-$action.json" state_after)
  stage=cuda_$action
  secs=$(stage_get "$work/cuda-$action.json" "$stage" seconds)
  if [ "$got" = "$want" ]; then
    record PASS "cuda $action" "state $got in ${secs:-?} s"
    return 0
  fi
  record FAIL "cuda $action" "state '$got', expected '$want': $(cat "$work/cuda-$action.err")"
  return 1
}

nvsmi_before=$(vram_of_pid "$demo_pid")
stage_ok=0
if cuda_step lock --timeout-ms 10000; then
  check_state lock locked && stage_ok=1
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
  record INFO "checkpoint speed" "$(div "$vram_bytes" "$(awk -v s="$ckpt_s" 'BEGIN { print s * 1e9 }')") GB/s VRAM->host in ${ckpt_s} s (pinned D2H ceiling ${d2h:-?} GB/s, HBM ${bw:-?} GB/s)"
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
    record INFO "restore speed" "$(div "$vram_bytes" "$(awk -v s="$rest_s" 'BEGIN { print s * 1e9 }')") GB/s host->VRAM in ${rest_s} s (pinned H2D ceiling ${h2d:-?} GB/s)"
  else
    record FAIL "cuda restore" "$(cat "$work/cuda-restore.err")"
  fi
fi
if [ "$stage_ok" = 1 ]; then
  if cuda_step unlock; then
    check_state unlock running
  else
    record FAIL "cuda unlock" "$(cat "$work/cuda-unlock.err")"
  fi
else
  # Whatever failed, do not leave the server frozen on the GPU for the next checks.
  cuda_step resume >/dev/null 2>&1 || cuda_step unlock >/dev/null 2>&1
fi

state=$(ask "$demo_sock" STATE)
if [ "$(hash_of "$state")" = "$hash_before" ]; then
  record PASS "vram hash (cuda)" "identical after checkpoint+restore: $hash_before"
else
  record FAIL "vram hash (cuda)" "before $hash_before, after '$state'"
fi

# Restore through the gpuPairs path (identity map: a one-GPU machine has no other target).
if [ "$remap" = true ]; then
  if cuda_step suspend && cuda_step resume --gpu-map "$gpu_uuid=$gpu_uuid" &&
     [ "$(hash_of "$(ask "$demo_sock" STATE)")" = "$hash_before" ]; then
    record PASS "cuda remap restore" "suspend + resume --gpu-map $gpu_uuid=$gpu_uuid, hash unchanged"
  else
    record FAIL "cuda remap restore" "$(cat "$work/cuda-suspend.err" "$work/cuda-resume.err" 2>/dev/null)"
    cuda_step resume >/dev/null 2>&1
  fi
else
  record SKIP "cuda remap restore" "driver without GPU remapping (needs CUDA 13.0 / r580)"
fi

a=$(ask "$demo_sock" "GEN after the CUDA checkpoint") b=$(ask "$twin_sock" "GEN after the CUDA checkpoint")
if [ -n "$a" ] && [ "$a" = "$b" ]; then
  record PASS "serving after restore" "same answer as the never-checkpointed twin: $a"
else
  record FAIL "serving after restore" "demo '$a' vs twin '$b'"
fi

# ---- full dump/restore through CRIU ------------------------------------------------------

criu_bin=${GPUCKPT_CRIU:-}
if [ -z "$criu_bin" ]; then
  for c in "${GPUCKPT_CRIU_PREFIX:-/opt/gpuckpt-criu}/bin/criu" "$(command -v criu 2>/dev/null)"; do
    if [ -n "$c" ] && [ -x "$c" ]; then criu_bin=$c; break; fi
  done
fi
if [ "$do_criu" = 0 ]; then
  record SKIP "criu dump/restore" "--no-criu"
elif [ -z "$criu_bin" ]; then
  record SKIP "criu dump/restore" "CRIU is not installed here (scripts/install-criu.sh needs apt)"
elif ! timeout 60 "$criu_bin" check >"$work/criu-check.log" 2>&1; then
  record SKIP "criu dump/restore" "criu check fails here: $(tail -n 2 "$work/criu-check.log" | tr '\n' ' ')"
elif [ ! -f "$plugin_dir/gpuckpt_criu_plugin.so" ]; then
  record SKIP "criu dump/restore" "the CRIU plugin was not built (no criu-plugin.h at configure time)"
else
  export GPUCKPT_CRIU="$criu_bin"
  hash_before=$(hash_of "$(ask "$demo_sock" STATE)")
  ckpt=$work/demo.ckpt
  t0=$(now)
  if timeout 900 "$gpuckpt" --json dump --pid "$demo_pid" -o "$ckpt" >"$work/dump.json" 2>"$work/dump.err"; then
    record PASS "criu dump" "$(json_get "$work/dump.json" image_bytes) image bytes, $(json_get "$work/dump.json" checkpoint_bytes) on storage, gpu=$(json_get "$work/dump.json" gpu) ($(elapsed "$t0") s)"
    print_timeline "$work/dump.json"
    # Reap it, so that its pid is free for CRIU to restore it with.
    wait "$demo_pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$demo_pid" 2>/dev/null || break; sleep 0.1; done
    t0=$(now)
    if timeout 900 "$gpuckpt" --json restore "$ckpt" --probe "unix:$demo_sock" --request STATE \
        >"$work/restore.json" 2>"$work/restore.err"; then
      new_pid=$(json_get "$work/restore.json" pid)
      children+=("$new_pid")
      record PASS "criu restore" "pid $new_pid, first answer '$(json_get "$work/restore.json" first_answer)' ($(elapsed "$t0") s)"
      print_timeline "$work/restore.json"
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
    else
      record FAIL "criu restore" "$(tail -n 5 "$work/restore.err")"
    fi
  else
    record FAIL "criu dump" "$(tail -n 5 "$work/dump.err")"
  fi
  if [ -n "$out_dir" ]; then
    cat "$work"/dump.json "$work"/dump.err "$work"/restore.json "$work"/restore.err \
      >"$out_dir/criu.log" 2>/dev/null
  fi
fi

# ---- the GPU tests -------------------------------------------------------------------------

if [ "$do_tests" = 1 ]; then
  for t in device_gpu_test kernels_binaries_test device_cli_test; do
    if [ ! -x "$tests_dir/$t" ]; then
      record SKIP "$t" "not built (GoogleTest missing?)"
      continue
    fi
    t0=$(now)
    if timeout 600 "$tests_dir/$t" >"$work/$t.log" 2>&1; then
      record PASS "$t" "$(grep -c '^\[       OK \]' "$work/$t.log") passed, $(grep -c '^\[  SKIPPED \]' "$work/$t.log") skipped ($(elapsed "$t0") s)"
    else
      record FAIL "$t" "$(grep -E '^\[  FAILED  \]|Failure' "$work/$t.log" | head -n 5 | tr '\n' ' ')"
    fi
    if [ -n "$out_dir" ]; then cat "$work/$t.log" >>"$out_dir/tests.log"; fi
  done
fi

if [ "$failures" -gt 0 ]; then exit 1; fi
exit 0
