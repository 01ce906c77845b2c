#!/usr/bin/env bash
# beyond-dram.sh: a dataset larger than the application host's free DRAM.
#
# One machine plays two hosts. The application (spillcache, then otter) runs
# in a memory cgroup whose limit is its host's DRAM; a second poold outside
# that cgroup is the peer that lends its memory as the rdma tier, reached
# over the TCP transport on 127.0.0.1 exactly as a peer on another host would
# be. The dataset is larger than the limit, so a cache holding it on the Go
# heap cannot be built, while spillcache keeps its hot set on the heap and the
# rest on the peer, and serves every key.
#
# Needs root (cgroups), cgroup v2 with the memory controller or cgroup v1's
# memory hierarchy, and Go. Sizes are environment variables:
#   LIMIT (MiB, default 1024)  the application host's DRAM (the cgroup limit)
#   KEYS  (default 3000000)    1 KiB values: about 2.9 GiB of data
#   HOT   (MiB, default 64)    spillcache's heap budget
#   DURATION (default 5s)      measured mix per cache
# Prints one "RESULT name ..." line per cache; exits non-zero if spillcache
# did not serve every key or the limit was not below the dataset.
set -euo pipefail
cd "$(dirname "$0")/../.."

LIMIT=${LIMIT:-1024}
KEYS=${KEYS:-3000000}
HOT=${HOT:-64}
DURATION=${DURATION:-5s}
dataset_mib=$(( KEYS * (1024 + 16) / 1048576 ))
export_mib=$(( dataset_mib * 3 / 2 + 512 ))

if [ "$(id -u)" != 0 ]; then
  echo "SKIP: beyond-dram.sh needs root for a memory cgroup"; exit 0
fi
if [ "$dataset_mib" -le "$LIMIT" ]; then
  echo "FAIL: the dataset ($dataset_mib MiB) must be larger than LIMIT ($LIMIT MiB)"; exit 1
fi

work=$(mktemp -d /tmp/farmem-beyond.XXXXXX)
shm=$(mktemp -d /dev/shm/farmem-beyond.XXXXXX) # segment files: memory, as on a real host
cg=""
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  [ -n "$cg" ] && rmdir "$cg" 2>/dev/null || true
  rm -rf "$work" "$shm"
}
trap cleanup EXIT

# The application host's DRAM: a memory cgroup, v2 or v1.
if grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
  cg=/sys/fs/cgroup/farmem-beyond-$$
  mkdir "$cg"
  echo $(( LIMIT << 20 )) > "$cg/memory.max"
  echo 0 > "$cg/memory.swap.max" 2>/dev/null || true
elif [ -d /sys/fs/cgroup/memory ]; then
  cg=/sys/fs/cgroup/memory/farmem-beyond-$$
  mkdir "$cg"
  echo $(( LIMIT << 20 )) > "$cg/memory.limit_in_bytes"
else
  echo "SKIP: no memory cgroup controller (neither cgroup v2 'memory' nor /sys/fs/cgroup/memory)"; exit 0
fi

go build -o "$work/poold" ./cmd/poold
go build -o "$work/spillcache" ./examples/spillcache
go build -o "$work/memctl" ./cmd/memctl

# Plaintext control planes on loopback (no TLS material in this demo).
insecure=()
if "$work/poold" --help 2>&1 | grep -q -- '--insecure'; then insecure=(--insecure); fi

# Free loopback ports for gossip and control planes.
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ga=$(port); gb=$(port); ca=$(port); cb=$(port)

# Host A: the application's host. A small local tier holds spillcache's far
# indexes; no emulated CXL (on this machine it would be the same DRAM the
# limit stands for) and nothing lent to peers.
mkdir "$work/a" "$work/b"
"$work/poold" --node app --data-dir "$work/a" --socket "$work/a/poold.sock" --shm-dir "$shm/a" \
  --gossip "127.0.0.1:$ga" --listen "127.0.0.1:$ca" "${insecure[@]}" \
  --emulate-cxl 0 --local-size 256MiB --export-size 0 --measure-tiers=false >"$work/a.log" 2>&1 &
pids+=($!)
# Host B: the peer, outside the cgroup, lending its memory as the rdma tier.
"$work/poold" --node peer --data-dir "$work/b" --socket "$work/b/poold.sock" --shm-dir "$shm/b" \
  --gossip "127.0.0.1:$gb" --listen "127.0.0.1:$cb" "${insecure[@]}" --join "127.0.0.1:$ga" \
  --emulate-cxl 0 --local-size 0 --export-size "${export_mib}MiB" --measure-tiers=false >"$work/b.log" 2>&1 &
pids+=($!)

for _ in $(seq 100); do
  if "$work/memctl" --socket "$work/a/poold.sock" nodes 2>/dev/null | grep -q '^peer .*alive'; then break; fi
  sleep 0.2
done
"$work/memctl" --socket "$work/a/poold.sock" nodes | grep -q '^peer .*alive' || { echo "FAIL: the two poolds did not form a cluster"; cat "$work"/*.log; exit 1; }

echo "application host: ${LIMIT} MiB of DRAM (memory cgroup $cg); dataset ${dataset_mib} MiB; peer lends ${export_mib} MiB"

# run NAME ARGS...: one cache in the cgroup; prints its RESULT line.
run() {
  local name=$1; shift
  local rc=0
  # sh stays as the parent so that a kill by the OOM killer is its exit
  # status 137, not a "Killed" message from this script.
  sh -c 'echo $$ > "$1/cgroup.procs"; shift; "$@"' sh "$cg" \
    "$work/spillcache" -socket "$work/a/poold.sock" -keys "$KEYS" -hot "${HOT}MiB" -cxl 0 \
    -rdma "$(( dataset_mib * 6 / 5 ))MiB" -duration "$DURATION" -warmup 1s -verify 0 -progress=false -json "$@" \
    >"$work/$name.json" 2>"$work/$name.err" || rc=$?
  if [ "$rc" = 0 ]; then
    python3 - "$name" "$work/$name.json" <<'EOF'
import json, sys
r = json.loads(open(sys.argv[2]).read().splitlines()[-1])
print(f"RESULT {sys.argv[1]} built: served {r['served_fraction']*100:.1f}% of {r['entries']} entries, "
      f"Go heap in use {r['heap_inuse_bytes']/2**20:.0f} MiB, {r['gets_per_sec']/1e3:.0f}k Gets/s, "
      f"Get p50 {r['get_p50_ns']/1e3:.1f}us p99 {r['get_p99_ns']/1e3:.1f}us")
EOF
  elif [ "$rc" = 137 ]; then
    echo "RESULT $name not built: killed by the kernel's OOM killer (exit 137): its dataset on the Go heap does not fit the host's ${LIMIT} MiB"
  else
    echo "RESULT $name failed: exit $rc"; tail -5 "$work/$name.err"
  fi
  return 0
}

run spillcache -compare ''
run otter -spill=false -compare otter

python3 - "$work/spillcache.json" <<'EOF' || { echo "FAIL: spillcache did not serve every key"; exit 1; }
import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
sys.exit(0 if r["served_fraction"] == 1.0 and r["wrong_values"] == 0 else 1)
EOF
echo "PASS: spillcache served every key of a dataset larger than its host's DRAM"
