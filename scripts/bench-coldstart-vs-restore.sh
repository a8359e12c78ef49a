#!/usr/bin/env bash
# Cold start of the demo server versus restoring it from a checkpoint, both timed to the first
# answer, as a ratio (docs/PERFORMANCE.md, "Cold start vs restore (demo server)").
#
#   scripts/bench-coldstart-vs-restore.sh [--weights 4G] [--init-seconds 10] [--runs 3]
#                                         [--dir /var/tmp/gpuckpt-bench] [--drop-caches]
#
# Cold start = `gpuckpt bench coldstart`: spawn the server, which reads its weights into memory
# and sleeps --init-seconds (the runtime init a real server does), until it answers STATE.
# Restore    = `gpuckpt bench restore`: unpack the checkpoint, criu restore, first answer.
# The checkpoint is made once from a server that has served a few requests (KV state).
# --drop-caches drops the page cache before every run, so both read from disk; without it both
# read their input (weights file, checkpoint) from the page cache.
# Needs root (CRIU), python3 (the demo client), about 4x the weights in RAM (process, tmpfs
# staging, page cache) and 2x on disk under --dir.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${GPUCKPT_BUILD_DIR:-$here/build}
bin=$build/bin
size=4G
init=10
runs=3
dir=/var/tmp/gpuckpt-bench
drop=0
while [ $# -gt 0 ]; do
  case $1 in
    --weights) size=$2; shift 2 ;;
    --init-seconds) init=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --drop-caches) drop=1; shift ;;
    *) echo "usage: $0 [--weights SIZE] [--init-seconds S] [--runs N] [--dir DIR] [--drop-caches]" >&2; exit 2 ;;
  esac
done
g=$bin/gpuckpt
server=$bin/gpuckpt-demo-server
[ -x "$g" ] && [ -x "$server" ] || { echo "$0: build first ($build)" >&2; exit 1; }

mkdir -p "$dir"
sock=$dir/demo.sock
weights=$dir/weights-$size.bin
ckpt=$dir/demo-$size.ckpt
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
}
trap cleanup EXIT

ask() {
  python3 - "$sock" "$1" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(60)
s.connect(sys.argv[1])
s.sendall((sys.argv[2] + "\n").encode())
print(s.makefile().readline().strip())
PY
}
drop_caches() {
  if [ $drop = 1 ]; then sync; echo 3 >/proc/sys/vm/drop_caches; fi
}

[ -f "$weights" ] || "$server" --generate-weights "$weights" --size "$size"
serve=("$server" --socket "$sock" --weights "$weights" --init-seconds "$init")

echo "== cold start: $runs run(s), weights $size, init ${init}s"
drop_caches
"$g" --json bench coldstart --runs "$runs" --probe "unix:$sock" --request STATE \
  --probe-timeout 600 -- "${serve[@]}" >"$dir/coldstart.json"

echo "== checkpoint a server that has served 8 requests"
rm -rf "$ckpt"
setsid "${serve[@]}" </dev/null >>"$dir/server.log" 2>&1 &
pid=$!
disown "$pid"  # no job-status message when the dump kills it
for _ in $(seq 6000); do [ -S "$sock" ] && ask PING >/dev/null 2>&1 && break; sleep 0.1; done
for i in 1 2 3 4 5 6 7 8; do ask "GEN prompt number $i" >/dev/null; done
before=$(ask STATE)
"$g" --json dump --pid "$pid" -o "$ckpt" >"$dir/dump.json"
# The restore needs its pid: wait until the zombie is reaped (bash reaps disowned jobs too).
for _ in $(seq 100); do [ -e "/proc/$pid" ] || break; sleep 0.1; done
pid=""

echo "== restore: $runs run(s)"
drop_caches
"$g" --json bench restore "$ckpt" --runs "$runs" --probe "unix:$sock" --request STATE \
  --probe-timeout 600 --keep >"$dir/restore.json"
pid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$dir/restore.json")
after=$(ask STATE)
[ "$before" = "$after" ] || { echo "$0: state changed across the restore: $before / $after" >&2; exit 1; }

python3 - "$dir" "$size" "$init" <<'PY'
import json, sys
d, size, init = sys.argv[1:]
cold = json.load(open(f"{d}/coldstart.json"))
rest = json.load(open(f"{d}/restore.json"))
dump = json.load(open(f"{d}/dump.json"))
c, r = cold["summary"], rest["summary"]
print(f"cold start  median {c['median_seconds']:.2f} s  (min {c['min_seconds']:.2f}, max {c['max_seconds']:.2f}, {c['runs']} runs)")
print(f"restore     median {r['median_seconds']:.2f} s  (min {r['min_seconds']:.2f}, max {r['max_seconds']:.2f}, {r['runs']} runs)")
print(f"ratio       cold start / restore = {c['median_seconds'] / r['median_seconds']:.1f}x")
print(f"checkpoint  {dump['image_bytes'] / 2**30:.2f} GiB of images -> {dump['checkpoint_bytes'] / 2**30:.2f} GiB on disk, dump {dump['timeline']['total_seconds']:.2f} s")
print("restore stages (median run):")
for s in rest["timeline"]["stages"]:
    gb = f"  {s['bytes'] / s['seconds'] / 1e9:.2f} GB/s" if s.get("bytes") and s["seconds"] > 0 else ""
    print(f"  {s['name']:<20} {s['seconds']:8.3f} s{gb}")
print("dump stages:")
for s in dump["timeline"]["stages"]:
    gb = f"  {s['bytes'] / s['seconds'] / 1e9:.2f} GB/s" if s.get("bytes") and s["seconds"] > 0 else ""
    print(f"  {s['name']:<20} {s['seconds']:8.3f} s{gb}")
PY
echo "state after restore: $after (identical to before the dump)"
