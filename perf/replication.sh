#!/usr/bin/env bash
# Replication's cost (issue 30): `shardlog bench produce` against three
# machines on this host, to a topic with one replica and to one with three
# (min.insync.replicas=2), acks=all both, in one run on the same processes,
# so the ratio holds whatever else the host does. Reports MB/s, p50/p99 and
# the brokers' CPU seconds (all three machines, from /proc) per GB produced.
# On a 2-core host the three machines and the load generator share the
# cores: the ratios are the result, not the absolute numbers.
#
#   perf/replication.sh
#
# SHARDLOG_PERF_SECONDS=N   bench duration (default 20)
# SHARDLOG_PERF_CORES=N     cores of each machine (default 1)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
bin="${CARGO_TARGET_DIR:-$PWD/target}/release/shardlog"

seconds="${SHARDLOG_PERF_SECONDS:-20}"
cores="${SHARDLOG_PERF_CORES:-1}"
source perf/lib.sh

cpu_ticks() {
  local total=0
  for pid in "${pids[@]}"; do
    read -r -a stat <"/proc/$pid/stat"
    total=$((total + stat[13] + stat[14]))
  done
  echo "$total"
}

voters="1@127.0.0.1:19711,2@127.0.0.1:19721,3@127.0.0.1:19731"
for i in 1 2 3; do
  "$bin" serve --data "$work/m$i" --cores "$cores" --port "197${i}0" --metrics-port 0 --pin false \
    --machine-id "$i" --controller-voters "$voters" --gossip-port "197${i}1" --seeds 127.0.0.1:19711 \
    --log-level warn & pids+=($!)
done
for i in 1 2 3; do wait_port "197${i}0"; done
"$bin" topic create bench-rf1 --partitions 12 --replication-factor 1 -b 127.0.0.1:19710 >/dev/null
"$bin" topic create bench-rf3 --partitions 12 --replication-factor 3 --config min.insync.replicas=2 \
  -b 127.0.0.1:19710 >/dev/null
sleep 2
hz=$(getconf CLK_TCK)
for topic in bench-rf1 bench-rf3; do
  before=$(cpu_ticks)
  "$bin" bench produce --brokers 127.0.0.1:19710 --partitions 12 --message-bytes 1024 --acks all \
    --duration "${seconds}s" --warmup 3s --topic "$topic" --json "$work/$topic.json" >"$work/$topic.txt" 2>&1
  after=$(cpu_ticks)
  python3 - "$work/$topic.json" "$topic" "$((after - before))" "$hz" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
p, l = r["produce"], r["latency_us"]["produce"]
cpu_s = int(sys.argv[3]) / int(sys.argv[4])
gb = p["bytes"] / 1e9 if "bytes" in p else p["mb_per_s"] * r.get("duration_s", 0) / 1000
print(f"{sys.argv[2]}: {p['mb_per_s']:8.1f} MB/s  {p['msgs_per_s']:10.0f} msg/s  "
      f"p50 {l['p50_us'] / 1000:.2f} ms  p99 {l['p99_us'] / 1000:.2f} ms  "
      f"broker CPU {cpu_s:.1f} s over the run" + (f", {cpu_s / gb:.1f} CPU s per GB produced" if gb else ""))
PY
done
