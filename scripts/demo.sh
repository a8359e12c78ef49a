#!/usr/bin/env bash
# The main job on an embedded default: cold-start the demo serving process, give it session
# state, dump it, restore it (the session state must survive), migrate it, and print the
# transient report beside the measured roofline. Outputs land in build/demo/.
#   GPUCKPT_DEMO_WEIGHTS=1G GPUCKPT_DEMO_INIT=5 scripts/demo.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${GPUCKPT_BUILD_DIR:-$here/build}
bin=$build/bin
out=$build/demo
weights_size=${GPUCKPT_DEMO_WEIGHTS:-256M}
init_s=${GPUCKPT_DEMO_INIT:-3}
g="$bin/gpuckpt"
server="$bin/gpuckpt-demo-server"
[ -x "$g" ] && [ -x "$server" ] || { echo "demo.sh: build first (scripts/setup.sh)" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out"
sock=$out/demo.sock
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid" 2>/dev/null || true; fi
}
trap cleanup EXIT

# One request on the demo server's socket; prints the reply line.
ask() {
  python3 - "$sock" "$1" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(30)
s.connect(sys.argv[1])
s.sendall((sys.argv[2] + "\n").encode())
print(s.makefile().readline().strip())
PY
}

echo "== weights: $weights_size, runtime init: ${init_s}s"
"$server" --generate-weights "$out/weights.bin" --size "$weights_size"
serve=("$server" --socket "$sock" --weights "$out/weights.bin" --init-seconds "$init_s")

echo "== cold start (decision -> first answer)"
"$g" --json bench coldstart --probe "unix:$sock" --request PING --runs 1 -- "${serve[@]}" \
  >"$out/coldstart.json"

echo "== serving: start, and build session state (KV cache)"
setsid "${serve[@]}" </dev/null >>"$out/server.log" 2>&1 &
pid=$!
# Not a job of this shell: the dump ends it with SIGKILL, which bash would report as "Killed",
# and a new user reads that as a failure. bash still reaps it.
disown "$pid"
for _ in $(seq 600); do [ -S "$sock" ] && ask PING >/dev/null 2>&1 && break; sleep 0.1; done
for i in 1 2 3 4 5 6 7 8; do ask "GEN prompt number $i" >/dev/null; done
before=$(ask STATE)
echo "   state before: $before"

echo "== dump (the process stops)"
"$g" dump --pid "$pid" -o "$out/ckpt"
# The dumped process ended; bash reaps it, and the restore needs its pid free.
for _ in $(seq 100); do [ -e "/proc/$pid" ] || break; sleep 0.1; done
pid=""

echo "== restore (interruption -> serving)"
"$g" --json bench restore "$out/ckpt" --probe "unix:$sock" --request STATE --keep \
  >"$out/restore.json"
pid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$out/restore.json")
after=$(ask STATE)
echo "   state after:  $after"
if [ "$before" != "$after" ]; then
  echo "demo.sh: session state did not survive the restore" >&2
  exit 1
fi

echo "== migrate (decision -> answering elsewhere)"
"$g" --json bench migrate --pid "$pid" --to "$out/migration" --probe "unix:$sock" \
  --request STATE >"$out/migrate.json"
pid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["new_pid"])' "$out/migrate.json")
[ "$(ask STATE)" = "$before" ] || { echo "demo.sh: state lost in migration" >&2; exit 1; }

echo "== roofline ceilings (measured on this machine)"
"$g" --json roofline --quick >"$out/roofline.json"

echo "== transient report"
"$g" report --coldstart "$out/coldstart.json" --restore "$out/restore.json" \
  --migrate "$out/migrate.json" --roofline "$out/roofline.json" \
  --svg "$out/report.svg" --html "$out/report.html"
ask QUIT >/dev/null || true
pid=""
echo "report: $out/report.html"
