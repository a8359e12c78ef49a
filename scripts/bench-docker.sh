#!/usr/bin/env bash
# bench-docker.sh [KEYS]: one redis container in Docker, checkpointed and started again by
# Docker itself (`docker checkpoint create`, `docker start --checkpoint`) and by gpuckpt
# (`dump --container`, `restore --container`), side by side, twice each; the data compared by
# DEBUG DIGEST after every restore. It starts a containerd and a dockerd of its own (on
# sockets and roots under /var/tmp/gpuckpt-bench-docker) and removes them at the end.
# Figures: docs/PERFORMANCE.md, "Docker".
set -euo pipefail
keys=${1:-3000000}
here=$(cd "$(dirname "$0")/.." && pwd)
gpuckpt=${GPUCKPT:-$here/build/bin/gpuckpt}
docker=/usr/bin/docker
w=/var/tmp/gpuckpt-bench-docker
rm -rf "$w"
mkdir -p "$w"/layer/{usr,proc,dev,sys,tmp,etc}
for l in bin lib lib64 sbin; do ln -s "usr/$l" "$w/layer/$l"; done
tar -C "$w/layer" -cf "$w/layer.tar" .

cleanup() {
  "$docker" -H "unix://$w/d.sock" rm -f c1 >/dev/null 2>&1 || true
  [ -f "$w/d.pid" ] && kill "$(cat "$w/d.pid")" 2>/dev/null || true
  sleep 2
  pkill -f "containerd --config $w/ctd.toml" || true
  sleep 1
  rm -rf "$w"
}
trap cleanup EXIT

cat > "$w/ctd.toml" <<T
version = 2
root = "$w/ctd-root"
state = "$w/ctd-state"
[grpc]
  address = "$w/ctd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$w/opt"
T
# The shims find gpuckpt's CRIU first, as docs/OPERATORS.md has an operator set up. containerd
# unpacks each restore's checkpoint under its TMPDIR and never removes it (Docker's own restore
# leaves a full copy of the images there): under $w, which goes at the end.
mkdir -p "$w/ctd-tmp"
TMPDIR=$w/ctd-tmp PATH=/opt/gpuckpt-criu/bin:$PATH setsid containerd --config "$w/ctd.toml" > "$w/ctd.log" 2>&1 &
for _ in $(seq 100); do [ -S "$w/ctd.sock" ] && break; sleep 0.1; done
echo '{}' > "$w/daemon.json"
setsid dockerd --config-file "$w/daemon.json" --data-root "$w/docker" --exec-root "$w/dexec" \
  --pidfile "$w/d.pid" -H "unix://$w/d.sock" --containerd "$w/ctd.sock" --bridge none \
  --iptables=false --ip-masq=false --ip-forward=false --experimental > "$w/d.log" 2>&1 &
for _ in $(seq 100); do "$docker" -H "unix://$w/d.sock" version >/dev/null 2>&1 && break; sleep 0.1; done
export DOCKER_HOST=unix://$w/d.sock
"$docker" import -c 'CMD ["/usr/bin/redis-server","--save","","--appendonly","no","--enable-debug-command","yes"]' \
  "$w/layer.tar" gpuckpt-bench:redis >/dev/null
"$docker" run -d --name c1 --network none -v /usr:/usr:ro gpuckpt-bench:redis >/dev/null
cli() {
  local p
  p=$("$docker" inspect -f '{{.State.Pid}}' c1)
  nsenter --net="/proc/$p/ns/net" redis-cli "$@"
}
for _ in $(seq 100); do [ "$(cli PING 2>/dev/null)" = PONG ] && break; sleep 0.1; done
cli DEBUG POPULATE "$keys" key 200 >/dev/null
want=$(cli DEBUG DIGEST)
echo "redis: $(grep VmRSS "/proc/$("$docker" inspect -f '{{.State.Pid}}' c1)/status")"
now() { date +%s.%N; }
for run in 1 2; do
  sync
  t0=$(now); "$docker" checkpoint create c1 "cp$run" >/dev/null; t1=$(now)
  "$docker" start --checkpoint "cp$run" c1; t2=$(now)
  [ "$(cli DEBUG DIGEST)" = "$want" ] || { echo "docker: data differs" >&2; exit 1; }
  echo "docker  run $run: checkpoint $(echo "$t1 - $t0" | bc) s, start --checkpoint $(echo "$t2 - $t1" | bc) s"
  sync
  t0=$(now); "$gpuckpt" dump --container c1 -o "$w/g$run.ckpt" >/dev/null 2>&1; t1=$(now)
  "$gpuckpt" restore "$w/g$run.ckpt" --container >/dev/null 2>&1; t2=$(now)
  [ "$(cli DEBUG DIGEST)" = "$want" ] || { echo "gpuckpt: data differs" >&2; exit 1; }
  echo "gpuckpt run $run: dump $(echo "$t1 - $t0" | bc) s, restore $(echo "$t2 - $t1" | bc) s"
done
echo "sizes: gpuckpt $(du -sh "$w/g1.ckpt" | cut -f1), docker $(du -sh "$w"/docker/containers/*/checkpoints/cp1 | cut -f1)"
