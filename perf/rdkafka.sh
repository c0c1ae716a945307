#!/usr/bin/env bash
# Is `shardlog bench` the bottleneck? The same produce load (1 topic, 100
# partitions, 1 KiB messages, acks=1) from rdkafka-based clients (kcat and
# confluent-kafka, both librdkafka with its default batching) and from
# `shardlog bench`, one after another against one shardlog broker
# (1 core, flush never) in the same run. Writes perf/results/rdkafka-DATETIME.json.
#
#   perf/rdkafka.sh                 needs kcat and python3 with confluent-kafka
#
# Environment: SHARDLOG_PERF_MESSAGES (per run, default 1000000), SHARDLOG_BIN.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in kcat python3; do
  command -v "$tool" >/dev/null || { echo "$tool is missing (apt-get install kcat; pip install confluent-kafka)" >&2; exit 1; }
done
python3 -c 'import confluent_kafka' 2>/dev/null || { echo "pip install confluent-kafka" >&2; exit 1; }
if [ -z "${SHARDLOG_BIN:-}" ]; then
  cargo build --release --quiet
  SHARDLOG_BIN="${CARGO_TARGET_DIR:-target}/release/shardlog"
fi
messages="${SHARDLOG_PERF_MESSAGES:-1000000}"
work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$SHARDLOG_BIN" serve --data "$work/data" --cores 1 --flush never --port "$port" --metrics-port 0 \
  --log-level warn &
broker=$!
trap 'kill $broker 2>/dev/null; wait $broker 2>/dev/null; rm -rf "$work"' EXIT
bootstrap="127.0.0.1:$port"
for _ in $(seq 100); do
  "$SHARDLOG_BIN" topic list --brokers "$bootstrap" >/dev/null 2>&1 && break
  sleep 0.1
done
mkdir -p perf/results

# One line per message: 1023 bytes + newline = 1 KiB messages for kcat.
python3 -c 'import sys; sys.stdout.buffer.write((b"x" * 1023 + b"\n") * int(sys.argv[1]))' "$messages" >"$work/messages"

run_kcat() {
  "$SHARDLOG_BIN" topic create --brokers "$bootstrap" --partitions 100 kcat >/dev/null
  local start end
  start=$(date +%s.%N)
  kcat -P -b "$bootstrap" -t kcat -X acks=1 -l "$work/messages"
  end=$(date +%s.%N)
  python3 -c 'import sys; n, s, e = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]); print(n * 1023 / (e - s) / 1e6)' \
    "$messages" "$start" "$end"
}

run_confluent() {
  "$SHARDLOG_BIN" topic create --brokers "$bootstrap" --partitions 100 confluent >/dev/null
  python3 - "$bootstrap" "$messages" <<'PY'
import sys, time
from confluent_kafka import Producer
bootstrap, count = sys.argv[1], int(sys.argv[2])
producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 5})
value = b"x" * 1024
start = time.monotonic()
for _ in range(count):
    while True:
        try:
            producer.produce("confluent", value)
            break
        except BufferError:
            producer.poll(0.001)
producer.flush()
print(count * len(value) / (time.monotonic() - start) / 1e6)
PY
}

run_bench() { # name [flags]
  local name="$1"
  shift
  "$SHARDLOG_BIN" bench produce --brokers "$bootstrap" --topic "$name" --partitions 100 --message-bytes 1024 \
    --acks 1 --messages "$messages" --warmup 0s "$@" --json "$work/$name.json" >/dev/null
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["produce"]["mb_per_s"])' "$work/$name.json"
}

kcat_mbps=$(run_kcat)
confluent_mbps=$(run_confluent)
bench_default_mbps=$(run_bench bench-default)
bench_rdkafka_like_mbps=$(run_bench bench-rdkafka-like --batch-bytes 1MiB --in-flight 20)

python3 - "$messages" "$kcat_mbps" "$confluent_mbps" "$bench_default_mbps" "$bench_rdkafka_like_mbps" <<'PY'
import datetime, json, os, platform, sys
messages, kcat, confluent, default, rdlike = int(sys.argv[1]), *map(float, sys.argv[2:])
out = {
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
    "machine": {"cores": os.cpu_count(), "kernel": platform.release()},
    "broker": "shardlog serve --cores 1 --flush never",
    "workload": "1 topic, 100 partitions, 1 KiB messages, acks=1, produce as fast as possible",
    "messages_per_run": messages,
    "produce_mb_per_s": {
        "kcat (librdkafka defaults)": kcat,
        "confluent-kafka python (librdkafka, linger.ms=5)": confluent,
        "shardlog bench (defaults: 16 KiB batches, 5 in flight)": default,
        "shardlog bench --batch-bytes 1MiB --in-flight 20": rdlike,
    },
}
stamp = datetime.datetime.now().strftime("%Y-%m-%dT%H%M%S")
path = f"perf/results/rdkafka-{stamp}.json"
json.dump(out, open(path, "w"), indent=2)
for name, value in out["produce_mb_per_s"].items():
    print(f"{name:<58}{value:>9.1f} MB/s")
print(f"wrote {path}", file=sys.stderr)
PY
