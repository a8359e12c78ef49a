#!/usr/bin/env bash
# Leaving the node, measured (docs/PERFORMANCE.md, "Leaving the node"): the vLLM-shaped demo
# with SIZE_MIB of weights (2 workers) is
#   1. migrated over SSH to a second "host" (a network namespace whose sshd runs as sshd -i
#      through ProxyCommand), and
#   2. dumped to and restored from an S3-compatible store (s3rver on loopback),
# beside the ceilings of the same paths measured in the same run: ssh carrying the same bytes
# (cat > /dev/null on the target), one plain `curl --aws-sigv4` PUT and GET of the checkpoint's
# blob to the same store, and O_DIRECT disk writes and reads of the same size.
#   scripts/bench-remote.sh [SIZE_MIB]   (default 2048; run as root)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${GPUCKPT_BUILD_DIR:-$here/build}/bin
mib=${1:-2048}
s3rver=${GPUCKPT_S3RVER:-/opt/gpuckpt-s3rver/node_modules/.bin/s3rver}
work=$(mktemp -d /var/tmp/gpuckpt-bench-remote.XXXXXX)
ns=gpuckpt-bench-$$
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
secs() { python3 -c "import time; print(time.time())"; }
rate() { python3 -c "b=$1; t=$2; print(f'{t:.2f} s, {b/t/1e9:.3f} GB/s')"; }
stage() { jq -r --arg n "$2" '[.timeline.stages[] | select(.name == $n)][0] | "\(.seconds) \(.bytes)"' "$1"; }

# The other host: a network namespace, and sshd for it.
ip netns add "$ns"
ip netns exec "$ns" ip link set lo up
mkdir -p "$work/ssh" /run/sshd
chmod 700 "$work/ssh"
ssh-keygen -q -t ed25519 -N '' -f "$work/ssh/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$work/ssh/client_key"
cp "$work/ssh/client_key.pub" "$work/ssh/authorized_keys"
cat > "$work/ssh/sshd_config" <<EOF
HostKey $work/ssh/host_key
AuthorizedKeysFile $work/ssh/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
UsePAM no
StrictModes no
PidFile none
LogLevel ERROR
SetEnv PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
EOF
echo "spare $(cut -d' ' -f1,2 "$work/ssh/host_key.pub")" > "$work/ssh/known_hosts"
cat > "$work/ssh/config" <<EOF
Host spare
  User root
  ProxyCommand nsenter --net=/run/netns/$ns -- /usr/sbin/sshd -i -f $work/ssh/sshd_config
  IdentityFile $work/ssh/client_key
  IdentitiesOnly yes
  UserKnownHostsFile $work/ssh/known_hosts
  StrictHostKeyChecking yes
  BatchMode yes
EOF

# The store.
mkdir -p "$work/s3"
"$s3rver" -d "$work/s3" -a 127.0.0.1 -p 0 --configure-bucket bench -s > "$work/s3.out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q "listening on" "$work/s3.out" && break; sleep 0.1; done
port=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$work/s3.out")
export AWS_ENDPOINT_URL=http://127.0.0.1:$port AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER
export AWS_REGION=us-east-1

start_demo() {  # prints "PID PORT"
  rm -f "$work/demo.port"
  setsid "$bin/gpuckpt-vllm-demo" --port 0 --port-file "$work/demo.port" --workers 2 \
      --weights-mib $((mib / 2)) < /dev/null >> "$work/demo.log" 2>&1 &
  local p=$!
  for _ in $(seq 600); do [ -s "$work/demo.port" ] && break; sleep 0.1; done
  local tcp; tcp=$(cat "$work/demo.port")
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$tcp/health" > /dev/null && break; sleep 0.1; done
  echo "$p $tcp"
}

echo "== gpuckpt bench-remote: vLLM demo, $mib MiB of weights, $(nproc) cores"
read -r pid tcp < <(start_demo)
"$bin/gpuckpt" --json migrate --pid "$pid" --to ssh://spare --ssh-config "$work/ssh/config" \
    --remote-gpuckpt "$bin/gpuckpt" --spool "$work" --remote-spool "$work" \
    --probe "http://127.0.0.1:$tcp/health" > "$work/migrate.json"
for p in $(ip netns pids "$ns"); do kill -9 "$p"; done
read -r t_transfer b_transfer <<< "$(stage "$work/migrate.json" transfer)"
echo "migrate over ssh (decision -> answering on the other host): $(jq .timeline.total_seconds "$work/migrate.json") s"
for s in criu_dump compress_write transfer target:receive target:read_decompress target:criu_restore target:first_answer end_original; do
  printf '  %-24s %s\n' "$s" "$(stage "$work/migrate.json" "$s")"
done
t0=$(secs); head -c "$b_transfer" /dev/zero | ssh -F "$work/ssh/config" spare 'cat > /dev/null'; t1=$(secs)
echo "  ceiling: ssh carrying the same $b_transfer bytes: $(rate "$b_transfer" "$(python3 -c "print($t1-$t0)")")"
# What a user would run instead: the same bytes from this disk, cold, through ssh into a file on
# the target's disk (cat > file, as scp does), sharing this one disk as the migration did.
head -c "$b_transfer" /dev/urandom > "$work/same.bin"
sync; echo 3 > /proc/sys/vm/drop_caches
t0=$(secs); ssh -F "$work/ssh/config" spare "cat > $work/same.copy" < "$work/same.bin"; sync; t1=$(secs)
echo "  baseline: ssh cat > file of the same bytes, disk to disk: $(rate "$b_transfer" "$(python3 -c "print($t1-$t0)")")"
rm -f "$work/same.bin" "$work/same.copy"
echo "  transfer stage: $(rate "$b_transfer" "$t_transfer")"

read -r pid tcp < <(start_demo)
"$bin/gpuckpt" --json dump --pid "$pid" -o s3://bench/demo --spool "$work" > "$work/dump.json"
read -r t_up b_up <<< "$(stage "$work/dump.json" upload)"
echo "dump to s3 (decision -> in the store): $(jq .timeline.total_seconds "$work/dump.json") s; upload $(rate "$b_up" "$t_up")"
"$bin/gpuckpt" --json restore s3://bench/demo --spool "$work" --probe "http://127.0.0.1:$tcp/health" > "$work/restore.json"
read -r t_down b_down <<< "$(stage "$work/restore.json" download)"
echo "restore from s3 (-> first answer): $(jq .timeline.total_seconds "$work/restore.json") s; download $(rate "$b_down" "$t_down")"
mapfile -t restored < <(jq -r '.pid, .tree[]?' "$work/restore.json")
kill -9 "${restored[@]}" 2>/dev/null || true

# Ceilings of the store and the disk for the same bytes.
head -c "$b_up" /dev/urandom > "$work/blob.bin"
sig=(--aws-sigv4 aws:amz:us-east-1:s3 --user S3RVER:S3RVER -H x-amz-content-sha256:UNSIGNED-PAYLOAD)
t0=$(secs); curl -sf "${sig[@]}" -T "$work/blob.bin" "$AWS_ENDPOINT_URL/bench/ceiling.bin"; t1=$(secs)
echo "  ceiling: one curl PUT of $b_up bytes: $(rate "$b_up" "$(python3 -c "print($t1-$t0)")")"
t0=$(secs); curl -sf "${sig[@]}" -o /dev/null "$AWS_ENDPOINT_URL/bench/ceiling.bin"; t1=$(secs)
echo "  ceiling: one curl GET of $b_up bytes: $(rate "$b_up" "$(python3 -c "print($t1-$t0)")")"
sync
t0=$(secs); dd if="$work/blob.bin" of="$work/dd.bin" bs=4M oflag=direct status=none; t1=$(secs)
echo "  disk: O_DIRECT write of $b_up bytes: $(rate "$b_up" "$(python3 -c "print($t1-$t0)")")"
echo 3 > /proc/sys/vm/drop_caches
t0=$(secs); dd if="$work/dd.bin" of=/dev/null bs=4M iflag=direct status=none; t1=$(secs)
echo "  disk: O_DIRECT read of $b_up bytes: $(rate "$b_up" "$(python3 -c "print($t1-$t0)")")"
