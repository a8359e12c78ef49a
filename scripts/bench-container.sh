#!/bin/bash
# Side by side, in one run: runc checkpoint/restore (with gpuckpt's CRIU) against gpuckpt
# dump/restore --container, for one runc container holding SIZE_MB of memory (half random,
# half a repeated pattern). Prints seconds and bytes of each. An interim measurement until
# `gpuckpt bench dump` has a container method (issue 37); figures in docs/PERFORMANCE.md.
# Usage: scripts/bench-container.sh [SIZE_MB]   (root; runc and python3 installed)
set -euo pipefail
SIZE_MB=${1:-1024}
G=${GPUCKPT:-$(cd "$(dirname "$0")/.." && pwd)/build/bin/gpuckpt}
CRIU=${GPUCKPT_CRIU:-/opt/gpuckpt-criu/bin/criu}
W=/var/tmp/cbench; rm -rf $W; mkdir -p $W/bundle/rootfs $W/root
cd $W/bundle
for d in usr proc dev sys tmp etc; do mkdir -p rootfs/$d; done
for l in bin lib lib64 sbin; do ln -s usr/$l rootfs/$l; done
runc spec
echo "network-lock skip" > $W/criu.conf
python3 - "$SIZE_MB" "$W" <<'PY'
import json, sys
size, w = int(sys.argv[1]), sys.argv[2]
s = json.load(open('config.json'))
s['process']['terminal'] = False
s['process']['args'] = ['/usr/bin/python3', '-c',
  "import os,time\nn=%d<<20\nb=bytearray(os.urandom(n//2))+bytearray(b'0123456789abcdef'*(n//32))\nprint('ready',flush=True)\ntime.sleep(100000)" % size]
s['process'].pop('rlimits', None)
s['root']['readonly'] = False
s['mounts'].append({'destination': '/usr', 'type': 'bind', 'source': '/usr', 'options': ['rbind', 'ro']})
s.setdefault('annotations', {})['org.criu.config'] = w + '/criu.conf'
json.dump(s, open('config.json', 'w'), indent=1)
PY
export GPUCKPT_RUNC_ROOTS=$W/root
start() {  # $1 id
  ( cd $W/bundle && runc --root $W/root run -d "$1" </dev/null 2>&1 | cat >> $W/$1.log & )
  until grep -q ready $W/$1.log 2>/dev/null; do sleep 0.2; done
}
t() {
  local s
  s=$(date +%s.%N)
  "$@" >/dev/null
  echo "$(date +%s.%N) - $s" | bc
}
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
start a
echo "runc_dump_s $(t runc --root $W/root --criu $CRIU checkpoint --image-path $W/img a)"
echo "runc_bytes $(du -sb $W/img | cut -f1)"
echo "runc_restore_s $(t sh -c "cd $W/bundle && runc --root $W/root --criu $CRIU restore -d --image-path $W/img a </dev/null >>$W/a.log 2>&1")"
runc --root $W/root kill a KILL; sleep 0.5; runc --root $W/root delete -f a
rm -rf $W/img $W/a.log
start b
echo "gpuckpt_dump_s $(t $G dump --container b -o $W/ck)"
echo "gpuckpt_bytes $(du -sb $W/ck | cut -f1)"
echo "gpuckpt_restore_s $(t $G restore $W/ck --container --staging /var/tmp)"
echo "gpuckpt_restore_shm_s $( runc --root $W/root kill b KILL; sleep 0.5; runc --root $W/root delete -f b; t $G restore $W/ck --container)"
runc --root $W/root kill b KILL; sleep 0.5; runc --root $W/root delete -f b
rm -rf "$W"
