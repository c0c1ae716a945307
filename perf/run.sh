#!/usr/bin/env bash
# Whole-system workloads with `shardlog bench`; each writes one JSON file
# under perf/results/ holding every run's full bench report plus the machine
# (and the latest perf/limits.sh result, when there is one). A failed run
# does not stop the others; the script then exits non-zero.
#
#   perf/run.sh WORKLOAD [extra shardlog bench flags...]
#
# Workloads:
#   max-throughput      1 topic, 100 partitions, 1 KiB messages, acks=1, flush never, 1 MiB batches,
#                       20 requests in flight, produce as fast as possible; then a catch-up consume
#                       of a filled topic from the beginning
#   latency-at-rate     flush never, acks=1: e2e flat out briefly, then e2e at 10%, 50% and 80% of its rate
#                       of the rate it measured
#   partitions-scaling  e2e at one fixed total rate over 16, 256, 4096 and 10000 partitions;
#                       broker RSS per partition
#   listener-modes      the same load on a per-core and on a shared-port broker
#   durability          acks=all with flush always against acks=1 with flush never
#   peers               max-throughput and latency-at-rate against PEER_BROKERS=host:port
#                       (any Kafka-compatible broker)
#   all                 every workload above except peers
#
# Environment:
#   SHARDLOG_PERF_DURATION    measured time of each run (default 60s for max-throughput, 30s otherwise)
#   SHARDLOG_PERF_WARMUP      warmup of each run (default 5s)
#   SHARDLOG_PERF_RATE        total msgs/s for partitions-scaling, listener-modes, durability (default 20000)
#   SHARDLOG_PERF_CATCH_UP_MESSAGES  messages the catch-up consume reads (default 2000000)
#   SHARDLOG_PERF_PARTITIONS  partition counts for partitions-scaling (default "16 256 4096 10000")
#   SHARDLOG_PERF_BROKER_CORES / SHARDLOG_PERF_BENCH_CORES  cores of the spawned broker / of the load generator
#   PEER_BROKERS              bootstrap of the peer broker for `peers`
#   SHARDLOG_BIN              shardlog binary (default: cargo build --release)
#
# Quick smoke run: SHARDLOG_PERF_DURATION=3s SHARDLOG_PERF_WARMUP=1s perf/run.sh all
set -euo pipefail
cd "$(dirname "$0")/.."
workload="${1:-}"
[ -n "$workload" ] || { sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
shift
extra=("$@")

if [ -z "${SHARDLOG_BIN:-}" ]; then
  cargo build --release --quiet
  SHARDLOG_BIN="${CARGO_TARGET_DIR:-target}/release/shardlog"
fi
warmup="${SHARDLOG_PERF_WARMUP:-5s}"
rate="${SHARDLOG_PERF_RATE:-20000}"
cores=()
[ -n "${SHARDLOG_PERF_BROKER_CORES:-}" ] && cores+=(--broker-cores "$SHARDLOG_PERF_BROKER_CORES")
[ -n "${SHARDLOG_PERF_BENCH_CORES:-}" ] && cores+=(--cores "$SHARDLOG_PERF_BENCH_CORES")
runs=$(mktemp -d)
trap 'rm -rf "$runs"' EXIT
mkdir -p perf/results

# Runs that failed: the others still run and are reported, then the script
# exits non-zero.
failed=()

# bench NAME ARGS...: one run, its report kept as $runs/NAME.json.
bench() {
  local name="$1"
  shift
  echo "== $name: shardlog bench $*" >&2
  if ! "$SHARDLOG_BIN" bench "$@" "${extra[@]}" --json "$runs/$name.json"; then
    echo "$name failed" >&2
    failed+=("$name")
  fi
}

duration() { echo "${SHARDLOG_PERF_DURATION:-$1}"; }

max_msgs_per_s() {
  python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["produce"]["msgs_per_s"]))' "$1"
}

# Prints `--flush never` unless the arguments name a peer broker (--brokers),
# which its owner configures: the flush policy of a spawned shardlog.
flush_never_when_spawned() {
  [[ " $* " == *" --brokers "* ]] || echo "--flush never"
}

max_throughput() { # name [--brokers B ...]
  local name="$1"
  shift
  # The issue's workload is flush never.
  set -- "$@" $(flush_never_when_spawned "$@")
  # librdkafka's batch size (1 MB) and enough requests in flight that the
  # generator is not what limits the rate.
  bench "$name" produce "$@" "${cores[@]}" --partitions 100 --message-bytes 1024 --acks 1 \
    --batch-bytes 1MiB --in-flight 20 --duration "$(duration 60s)" --warmup "$warmup" --topic "bench-$name"
  # Catch-up read: fill the topic, then read it back from the beginning (mostly from disk).
  bench "$name-catch-up-consume" consume --from beginning "$@" "${cores[@]}" --partitions 100 \
    --message-bytes 1024 --messages "${SHARDLOG_PERF_CATCH_UP_MESSAGES:-2000000}" --topic "bench-$name-catch-up"
}

latency_at_rate() { # prefix [--brokers B]
  local prefix="$1"
  shift
  # acks=1 on the max-throughput durability setting (flush never); the
  # durability workload measures flush always.
  set -- "$@" $(flush_never_when_spawned "$@")
  # The max of the same workload: producing and consuming flat out, so
  # the rate that 50% is taken of is one this broker and generator sustain
  # with the consumers' load on them too.
  bench "$prefix-max" e2e "$@" "${cores[@]}" --partitions 100 --message-bytes 1024 --acks 1 \
    --duration "$(duration 10s)" --warmup "$warmup" --topic "bench-$prefix-max"
  if [ ! -f "$runs/$prefix-max.json" ]; then
    echo "$prefix: no max rate to take percentages of; its rate runs skipped" >&2
    failed+=("$prefix-10" "$prefix-50" "$prefix-80")
    return
  fi
  local max
  max=$(max_msgs_per_s "$runs/$prefix-max.json")
  for percent in 10 50 80; do
    bench "$prefix-$percent" e2e "$@" "${cores[@]}" --partitions 100 --message-bytes 1024 --acks 1 \
      --rate $((max * percent / 100)) --duration "$(duration 30s)" --warmup "$warmup" --topic "bench-$prefix-$percent"
  done
}

partitions_scaling() {
  for partitions in ${SHARDLOG_PERF_PARTITIONS:-16 256 4096 10000}; do
    bench "partitions-$partitions" e2e "${cores[@]}" --partitions "$partitions" --message-bytes 1024 --acks 1 \
      --rate "$rate" --duration "$(duration 30s)" --warmup "$warmup"
  done
}

listener_modes() {
  local broker_cores="${SHARDLOG_PERF_BROKER_CORES:-2}"
  for mode in per-core shared; do
    bench "listener-$mode" e2e --listener "$mode" --broker-cores "$broker_cores" --partitions 100 --message-bytes 1024 \
      --rate "$rate" --duration "$(duration 30s)" --warmup "$warmup"
  done
}

durability() {
  bench acks-all-flush-always e2e "${cores[@]}" --acks all --flush always --partitions 100 --message-bytes 1024 \
    --rate "$rate" --duration "$(duration 30s)" --warmup "$warmup"
  bench acks-1-flush-never e2e "${cores[@]}" --acks 1 --flush never --partitions 100 --message-bytes 1024 \
    --rate "$rate" --duration "$(duration 30s)" --warmup "$warmup"
}

case "$workload" in
  max-throughput) max_throughput max-throughput ;;
  latency-at-rate) latency_at_rate latency ;;
  partitions-scaling) partitions_scaling ;;
  listener-modes) listener_modes ;;
  durability) durability ;;
  peers)
    [ -n "${PEER_BROKERS:-}" ] || { echo "peers needs PEER_BROKERS=host:port" >&2; exit 2; }
    max_throughput peer-max-throughput --brokers "$PEER_BROKERS"
    latency_at_rate peer-latency --brokers "$PEER_BROKERS"
    ;;
  all)
    max_throughput max-throughput
    latency_at_rate latency
    partitions_scaling
    listener_modes
    durability
    ;;
  *) echo "unknown workload $workload (see perf/run.sh without arguments)" >&2; exit 2 ;;
esac

python3 - "$runs" "$workload" "${PEER_BROKERS:-}" <<'PY'
import datetime, glob, json, os, platform, sys
runs_dir, workload, peer = sys.argv[1], sys.argv[2], sys.argv[3]
runs = []
for path in sorted(glob.glob(os.path.join(runs_dir, '*.json')), key=os.path.getmtime):
    report = json.load(open(path))
    report['name'] = os.path.basename(path)[:-5]
    runs.append(report)
limits = sorted(glob.glob('perf/results/limits-*.json'))
machine = runs[0]['machine'] if runs else {'cores': os.cpu_count(), 'kernel': platform.release()}
out = {
    'workload': workload,
    'date': datetime.datetime.now(datetime.timezone.utc).isoformat(),
    'machine': machine,
    'peer_brokers': peer or None,
    'limits': json.load(open(limits[-1])) if limits else None,
    'runs': runs,
}
stamp = datetime.datetime.now().strftime('%Y-%m-%dT%H%M%S')
path = f'perf/results/{workload}-{stamp}.json'
json.dump(out, open(path, 'w'), indent=2)

def ms(report, name, key):
    value = report.get('latency_us', {}).get(name, {}).get(key)
    return f'{value / 1000:.2f}' if value is not None else '-'
print(f"{'run':<26}{'msgs/s':>12}{'MB/s':>9}{'produce p99':>13}{'e2e p50':>10}{'e2e p99':>10}{'e2e p99.9':>11}"
      f"{'broker CPU s':>14}{'MB/CPU-s':>10}{'RSS/partition':>15}{'gen busy':>10}")
for r in runs:
    t = r.get('produce') or r.get('consume') or {}
    broker = r.get('broker') or {}
    rss = broker.get('rss_bytes')
    per_partition = f"{rss / r['workload']['partitions'] / 1024:.1f} KiB" if rss else '-'
    per_cpu = broker.get('bytes_per_cpu_s')
    busy = (r.get('generator') or {}).get('busy')
    gen_busy = f"{busy * 100:.0f}%" if busy is not None else '-'
    print(f"{r['name']:<26}{t.get('msgs_per_s', 0):>12.0f}{t.get('mb_per_s', 0):>9.1f}{ms(r, 'produce', 'p99_us'):>13}"
          f"{ms(r, 'e2e', 'p50_us'):>10}{ms(r, 'e2e', 'p99_us'):>10}{ms(r, 'e2e', 'p999_us'):>11}"
          f"{broker.get('cpu_s', 0):>14.2f}{(per_cpu or 0) / 1e6:>10.1f}{per_partition:>15}{gen_busy:>10}")
# Throughput against the machine's limits of the latest perf/limits.sh run.
limit = out['limits'] or {}
loopback = limit.get('loopback_tcp_one_stream_1MiB_writes_MB_per_s')
new_file = limit.get('fio_seq_write_new_file_O_DIRECT_1MiB_io_uring_MB_per_s')
disk_read = limit.get('fio_seq_read_O_DIRECT_1MiB_io_uring_MB_per_s')
for r in runs:
    t = r.get('produce') or r.get('consume') or {}
    mb = t.get('mb_per_s')
    if not mb or not (loopback or new_file or disk_read):
        continue
    parts = [f"{mb / loopback:.2f} x loopback iperf3 ({loopback:.0f} MB/s)"] if loopback else []
    if new_file and r.get('produce'):
        parts.append(f"{mb / new_file:.2f} x the disk's new-file writes ({new_file:.0f} MB/s)")
    if disk_read and r.get('consume') and r['workload'].get('from') == 'beginning':
        parts.append(f"{mb / disk_read:.2f} x the disk's O_DIRECT reads ({disk_read:.0f} MB/s)")
    print(f"{r['name']}: {mb:.0f} MB/s = " + ', '.join(parts) + f" (limits of {limit.get('date', '?')[:16]})")
print(f'wrote {path}', file=sys.stderr)
PY

if [ "${#failed[@]}" -gt 0 ]; then
  echo "perf/run.sh $workload: ${#failed[@]} run(s) failed: ${failed[*]}" >&2
  exit 1
fi
