#!/usr/bin/env bash
# The long fault-injection run of issue 30: tests/compat/test_faults.py
# (three machines in network namespaces, a replicated topic, confluent-kafka
# producing with acks=all and idempotence, a group consumer and an assigned
# one, kill -9, kill -9 with torn log tails, SIGSTOP past the lease, an
# isolated leader and a bridge made with nftables; then a drain,
# `shardlog history check`, and the replicas' logs compared byte for byte)
# with many more fault cycles than CI runs.
#
#   perf/faults.sh [CYCLES] [SEED]        (defaults: 100 cycles, a random seed)
#
# The history is kept in perf/results/faults-history-SEED.jsonl; the seed
# replays the same choice of faults (timing still varies).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
cycles="${1:-100}"
seed="${2:-$RANDOM$RANDOM}"
mkdir -p perf/results
out="$PWD/perf/results/faults-history-$seed.jsonl"
cd tests/compat
SHARDLOG_FAULT_CYCLES="$cycles" SHARDLOG_FAULT_SEED="$seed" SHARDLOG_HISTORY_OUT="$out" \
  python3 -m pytest -q -s -p no:cacheprovider test_faults.py
echo "history: $out"
"$OLDPWD/target/release/shardlog" history check "$out"
