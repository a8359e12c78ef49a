#!/usr/bin/env bash
# bench-rootfs.sh [TREE...]: the cost of carrying a runc bundle's rootfs (dump --with-rootfs,
# and its restore on a host without the bundle) against what an operator would do instead to
# move the bundle: `tar | zstd -1 -T0` into a file that is synced, and `zstd -d | tar -x` back.
# The rootfs holds a copy of TREEs (default /usr/lib/x86_64-linux-gnu: about 1 GiB of real
# libraries) beside the empty mount points; redis runs in it from the host's /usr, bound
# read-only as in the tests. Two runs each, under /var/tmp/gpuckpt-bench-rootfs, removed at the
# end. Figures: docs/PERFORMANCE.md, "Containers".
set -euo pipefail
trees=("$@")
[ ${#trees[@]} -gt 0 ] || trees=(/usr/lib/x86_64-linux-gnu)
here=$(cd "$(dirname "$0")/.." && pwd)
gpuckpt=${GPUCKPT:-$here/build/bin/gpuckpt}
runc=$(command -v runc)
w=/var/tmp/gpuckpt-bench-rootfs
root=$w/runc-root
id=gk-bench-rootfs
export GPUCKPT_RUNC_ROOTS=$root

cleanup() {
  "$runc" --root "$root" kill "$id" KILL >/dev/null 2>&1 || true
  sleep 1
  "$runc" --root "$root" delete --force "$id" >/dev/null 2>&1 || true
  rm -rf "$w" "/run/gpuckpt/containers/"*"/$id" "/var/log/gpuckpt/containers/$id.log"
}
trap cleanup EXIT
cleanup
mkdir -p "$w/bundle/rootfs"/{usr,proc,dev,sys,tmp,etc,data}
for l in bin lib lib64 sbin; do ln -s "usr/$l" "$w/bundle/rootfs/$l"; done
for t in "${trees[@]}"; do cp -a "$t" "$w/bundle/rootfs/data/"; done
(cd "$w/bundle" && "$runc" spec)
python3 - "$w/bundle/config.json" <<'PY'
import json, sys
p = sys.argv[1]
s = json.load(open(p))
s["process"]["terminal"] = False
s["process"]["args"] = ["/usr/bin/redis-server", "--save", "", "--appendonly", "no"]
s["process"].pop("rlimits", None)
s["root"]["readonly"] = False
s["mounts"].append({"destination": "/usr", "type": "bind", "source": "/usr",
                    "options": ["rbind", "ro"]})
json.dump(s, open(p, "w"), indent=1)
PY
start() {
  (cd "$w/bundle" && setsid "$runc" --root "$root" run --detach "$id" </dev/null 2>&1 | cat >/dev/null &)
  for _ in $(seq 100); do
    "$runc" --root "$root" state "$id" 2>/dev/null | grep -q '"running"' && return 0
    sleep 0.1
  done
  echo "the container did not start" >&2
  exit 1
}
stage() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
s=[x for x in d['timeline']['stages'] if x['name']==sys.argv[2]]; \
print('%.2f s, %d MiB' % (s[0]['seconds'], s[0]['bytes']>>20))" "$1" "$2"; }
now() { date +%s.%N; }
secs() { python3 -c "print('%.2f' % ($2 - $1))"; }
rootfs_bytes=$(du -sb "$w/bundle/rootfs" | cut -f1)
echo "rootfs: $((rootfs_bytes >> 20)) MiB ($(find "$w/bundle/rootfs" | wc -l) entries)"
start
drop() { sync; echo 3 > /proc/sys/vm/drop_caches || true; }
total() { python3 -c "import json,sys; print('%.2f' % json.load(open(sys.argv[1]))['timeline']['total_seconds'])" "$1"; }
for run in 1 2; do
  rm -rf "$w/ckpt" "$w/ckpt-plain" "$w/rootfs.tar.zst" "$w/back"
  drop
  t0=$(now)
  tar -C "$w/bundle/rootfs" --one-file-system --numeric-owner --xattrs -cf - . |
    zstd -1 -T0 -q -o "$w/rootfs.tar.zst"
  sync "$w/rootfs.tar.zst"
  t1=$(now)
  echo "run $run: tar | zstd -1 -T0 > file, synced: $(secs "$t0" "$t1") s, $(($(stat -c %s "$w/rootfs.tar.zst") >> 20)) MiB"
  drop
  "$gpuckpt" --json dump --container "$id" -o "$w/ckpt-plain" > "$w/plain.json"
  "$gpuckpt" --json restore "$w/ckpt-plain" --container > "$w/restore-plain.json"
  echo "run $run: gpuckpt dump without the rootfs: $(total "$w/plain.json") s; its restore: $(total "$w/restore-plain.json") s"
  drop
  "$gpuckpt" --json dump --container "$id" -o "$w/ckpt" --with-rootfs > "$w/dump.json"
  echo "run $run: gpuckpt dump --with-rootfs: $(total "$w/dump.json") s (its rootfs_diff stage: $(stage "$w/dump.json" rootfs_diff)), $(($(du -sb "$w/ckpt" | cut -f1) >> 20)) MiB on disk"
  mv "$w/bundle/rootfs" "$w/rootfs.away"
  drop
  t0=$(now)
  mkdir "$w/back"
  zstd -d -T0 -q -c "$w/rootfs.tar.zst" | tar -C "$w/back" --numeric-owner --xattrs -xf -
  t1=$(now)
  echo "run $run: zstd -d | tar -x: $(secs "$t0" "$t1") s"
  rm -rf "$w/back"
  drop
  "$gpuckpt" --json restore "$w/ckpt" --container > "$w/restore.json"
  echo "run $run: gpuckpt restore --container, the rootfs unpacked: $(total "$w/restore.json") s (its rootfs_apply stage: $(stage "$w/restore.json" rootfs_apply))"
  rm -rf "$w/rootfs.away"
done
