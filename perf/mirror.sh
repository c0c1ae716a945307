#!/usr/bin/env bash
# `shardlog mirror` (issue 31) on this host: two one-core shardlog clusters
# (a source and a target), in one run on the same processes:
#
#   1. fill: `bench produce` writes N 1 KiB messages to 8 partitions of the source;
#   2. catch-up consume: `bench consume --from beginning` reads them back;
#   3. target ceiling: `bench produce` of the same volume to the target,
#      acks=all, 512 KiB batches (what the mirror writes);
#   4. mirror: a fresh `shardlog mirror` copies the topic; timed from the
#      moment it has joined its group (its start-up, topic creation and the
#      group's initial rebalance delay are reported apart) to every record
#      on the target;
#   5. latency: `bench produce --rate R` to another topic for S seconds
#      while a second mirror copies it; the mirror prints its replication
#      latency (source record time -> target acknowledgement) on SIGTERM.
#
# Reports mirror / catch-up consume and mirror / target ceiling. On a 2-core
# host the brokers, the mirror and the load generator share the cores: the
# ratios are the result.
#
#   perf/mirror.sh [MESSAGES] [RATE] [SECONDS]     defaults 500000 20000 20
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
bin="${CARGO_TARGET_DIR:-$PWD/target}/release/shardlog"
messages="${1:-500000}"
rate="${2:-20000}"
seconds="${3:-20}"
source perf/lib.sh

src=39092
dst=39192
for side in "$src" "$dst"; do
  mkdir -p "$work/$side"
  "$bin" serve --data "$work/$side" --port "$side" --cores 1 --listener shared --metrics-port 0 \
    >"$work/$side.log" 2>&1 &
  pids+=($!)
  wait_port "$side"
done

mbps() { grep -A1 "msgs/s" | tail -1 | awk '{print $5}'; }
echo "fill: $messages x 1 KiB to 8 partitions of the source"
"$bin" bench produce -b "127.0.0.1:$src" --topic fill --partitions 8 --messages "$messages" \
  --message-bytes 1024 --acks 1 --cores 1 >/dev/null
consume=$("$bin" bench consume -b "127.0.0.1:$src" --topic fill --from beginning --messages "$messages" \
  --cores 1 | mbps)
ceiling=$("$bin" bench produce -b "127.0.0.1:$dst" --topic ceiling --partitions 8 --messages "$messages" \
  --message-bytes 1024 --acks all --batch-bytes 512KiB --cores 1 | mbps)

started=$(date +%s.%N)
"$bin" mirror --source "127.0.0.1:$src" --target "127.0.0.1:$dst" --topics fill --report-s 1 \
  >"$work/mirror.log" 2>&1 &
mirror=$!
pids+=("$mirror")
until grep -q "joined the mirror group" "$work/mirror.log"; do
  sleep 0.05
  kill -0 "$mirror" || { cat "$work/mirror.log"; exit 1; }
done
joined=$(date +%s.%N)
until grep -q " $messages records and" "$work/mirror.log"; do
  sleep 0.05
  kill -0 "$mirror" || { cat "$work/mirror.log"; exit 1; }
done
took=$(echo "$(date +%s.%N) - $joined" | bc -l)
startup=$(echo "$joined - $started" | bc -l)
bytes=$(grep -o "[0-9]* bytes copied" "$work/mirror.log" | tail -1 | awk '{print $1}')
kill "$mirror"; wait "$mirror" || true
copy=$(echo "$bytes / $took / 1000000" | bc -l)

"$bin" mirror --source "127.0.0.1:$src" --target "127.0.0.1:$dst" --topics paced --report-s 60 \
  >"$work/latency.log" 2>&1 &
mirror=$!
pids+=("$mirror")
"$bin" topic create paced --partitions 8 -b "127.0.0.1:$src" >/dev/null
sleep 2
"$bin" bench produce -b "127.0.0.1:$src" --topic paced --rate "$rate" --duration "${seconds}s" \
  --message-bytes 1024 --acks 1 --cores 1 >/dev/null
sleep 2
kill "$mirror"; wait "$mirror" || true

printf 'catch-up consume  %8.1f MB/s\n' "$consume"
printf 'target ceiling    %8.1f MB/s (bench produce, acks=all, 512 KiB batches)\n' "$ceiling"
printf 'mirror            %8.1f MB/s (%d records in %.2f s after a start-up of %.2f s)\n' "$copy" "$messages" "$took" "$startup"
printf 'mirror / consume  %8.2f\n' "$(echo "$copy / $consume" | bc -l)"
printf 'mirror / ceiling  %8.2f\n' "$(echo "$copy / $ceiling" | bc -l)"
echo "at $rate msg/s: $(grep "mirror stopped" "$work/latency.log" | sed 's/.*replication latency/replication latency/')"
