#!/usr/bin/env bash
# Startup and shutdown with many partitions (issue 6, target 5): fills one
# topic of PARTITIONS partitions with MESSAGES 1 KiB messages (1 GiB by
# default) on a 1-core broker, then times, until /v1/ready answers 200:
# a reopen after a clean shutdown with the page cache dropped (cold) and
# again (warm), and a start after kill -9 (recovery scans the last segment
# of every partition); and each clean shutdown. Writes
# perf/results/startup-DATETIME.json.
#
#   perf/startup.sh [DIR]     DIR: data directory on the disk to measure (default: a temp dir)
#
# Environment: SHARDLOG_PERF_PARTITIONS (default 10000), SHARDLOG_PERF_MESSAGES
# (default 1000000), SHARDLOG_BIN. Dropping the page cache needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${SHARDLOG_BIN:-}" ]; then
  cargo build --release --quiet
  SHARDLOG_BIN="${CARGO_TARGET_DIR:-target}/release/shardlog"
fi
partitions="${SHARDLOG_PERF_PARTITIONS:-10000}"
messages="${SHARDLOG_PERF_MESSAGES:-1000000}"
work="${1:-$(mktemp -d)}"
data="$work/startup-data"
rm -rf "$data"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
metrics_port=$(free_port)
pid=""
trap '[ -n "$pid" ] && kill -9 $pid 2>/dev/null; rm -rf "$data"' EXIT
now() { date +%s.%N; }
since() { python3 -c 'import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 3))' "$1" "$(now)"; }

start_broker() { # sets pid and started_s
  local start
  start=$(now)
  "$SHARDLOG_BIN" serve --data "$data" --cores 1 --flush never --port "$port" --metrics-port "$metrics_port" \
    --log-level warn >/dev/null 2>&1 &
  pid=$!
  until curl -sf "127.0.0.1:$metrics_port/v1/ready" >/dev/null 2>&1; do
    kill -0 $pid 2>/dev/null || { echo "broker exited during start" >&2; exit 1; }
    sleep 0.02
  done
  started_s=$(since "$start")
}

stop_broker() { # sets stopped_s
  local start
  start=$(now)
  kill -TERM $pid
  wait $pid || true
  pid=""
  stopped_s=$(since "$start")
}

start_broker
"$SHARDLOG_BIN" topic create --brokers "127.0.0.1:$port" --partitions "$partitions" startup >/dev/null
"$SHARDLOG_BIN" bench produce --brokers "127.0.0.1:$port" --topic startup --partitions "$partitions" \
  --message-bytes 1024 --batch-bytes 64KiB --in-flight 20 --messages "$messages" --warmup 0s >/dev/null 2>&1
stop_broker
fill_shutdown_s=$stopped_s
data_bytes=$(du -sb "$data" | cut -f1)

sync
echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || echo "cannot drop the page cache (not root): cold = warm" >&2
start_broker
cold_s=$started_s
stop_broker
clean_shutdown_s=$stopped_s
start_broker
warm_s=$started_s
kill -9 $pid
wait $pid 2>/dev/null || true
pid=""
start_broker
after_kill_s=$started_s
stop_broker

python3 - "$partitions" "$data_bytes" "$cold_s" "$warm_s" "$after_kill_s" "$fill_shutdown_s" "$clean_shutdown_s" <<'PY'
import datetime, json, os, platform, sys
partitions, data_bytes = int(sys.argv[1]), int(sys.argv[2])
cold, warm, after_kill, fill_shutdown, clean_shutdown = map(float, sys.argv[3:])
out = {
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
    "machine": {"cores": os.cpu_count(), "kernel": platform.release()},
    "partitions": partitions,
    "data_bytes": data_bytes,
    "seconds_to_ready": {"clean_reopen_cold_cache": cold, "clean_reopen_warm_cache": warm, "after_kill_9": after_kill},
    "seconds_to_stop": {"after_fill": fill_shutdown, "after_reopen": clean_shutdown},
}
os.makedirs("perf/results", exist_ok=True)
path = f"perf/results/startup-{datetime.datetime.now().strftime('%Y-%m-%dT%H%M%S')}.json"
json.dump(out, open(path, "w"), indent=2)
print(f"{partitions} partitions, {data_bytes / 2**30:.2f} GiB on disk")
print(f"ready after clean shutdown: {cold:.2f} s cold cache, {warm:.2f} s warm; after kill -9: {after_kill:.2f} s")
print(f"clean shutdown: {fill_shutdown:.2f} s after the fill, {clean_shutdown:.2f} s after a reopen")
print(f"wrote {path}", file=sys.stderr)
PY
