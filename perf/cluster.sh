#!/usr/bin/env bash
# `shardlog bench` against one machine and against a cluster of three, on
# this host in one run, so the two figures share whatever else the host is
# doing. Each machine is a `shardlog serve` on 127.0.0.1 with its own ports
# and data directory; the three are voters of one controller quorum and
# gossip with each other. Then the controller failover distribution:
# kill -9 of the controller's machine, to the first metadata commit through
# a survivor, over SHARDLOG_FAILOVER_TRIALS trials (tests/cluster.rs).
#
#   perf/cluster.sh
#
# SHARDLOG_PERF_SECONDS=N   bench duration (default 20)
# SHARDLOG_PERF_CORES=N     cores of each machine (default 1)
# SHARDLOG_FAILOVER_TRIALS  (default 20)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
bin="$PWD/target/release/shardlog"
seconds="${SHARDLOG_PERF_SECONDS:-20}"
cores="${SHARDLOG_PERF_CORES:-1}"
trials="${SHARDLOG_FAILOVER_TRIALS:-20}"
source perf/lib.sh

bench() {
  "$bin" bench produce --brokers "$1" --partitions 12 --message-bytes 1024 --acks all \
    --duration "${seconds}s" --warmup 3s --topic "bench-$2" --json "$work/$2.json" >"$work/$2.txt" 2>&1
  python3 - "$work/$2.json" "$2" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
p, l = r["produce"], r["latency_us"]["produce"]
print(f"{sys.argv[2]:>6} machine(s): {p['mb_per_s']:8.1f} MB/s  {p['msgs_per_s']:10.0f} msg/s  "
      f"p50 {l['p50_us'] / 1000:.2f} ms  p99 {l['p99_us'] / 1000:.2f} ms  p99.9 {l['p999_us'] / 1000:.2f} ms")
EOF
}

# One machine.
"$bin" serve --data "$work/one" --cores "$cores" --port 19500 --metrics-port 0 --pin false \
  --log-level warn & pids+=($!)
wait_port 19500
bench 127.0.0.1:19500 one
kill -TERM "${pids[0]}"; wait "${pids[0]}" || true; pids=()

# Three machines.
voters="1@127.0.0.1:19611,2@127.0.0.1:19621,3@127.0.0.1:19631"
for i in 1 2 3; do
  "$bin" serve --data "$work/m$i" --cores "$cores" --port "196${i}0" --metrics-port 0 --pin false \
    --machine-id "$i" --controller-voters "$voters" --gossip-port "196${i}1" --seeds 127.0.0.1:19611 \
    --log-level warn & pids+=($!)
done
for i in 1 2 3; do wait_port "196${i}0"; done
bench 127.0.0.1:19610 three

SHARDLOG_FAILOVER_TRIALS="$trials" cargo test --release -q --test cluster killing -- --nocapture 2>&1 \
  | grep "controller failover"
