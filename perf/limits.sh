#!/usr/bin/env bash
# What this machine can do at best, to read the broker's numbers against:
# loopback TCP (iperf3, one stream, 1 MiB writes), sequential O_DIRECT
# writes and reads (fio, 1 MiB blocks, io_uring) and the fdatasync rate
# (fio, 4 KiB writes, fdatasync after each). Writes
# perf/results/limits-<date>.json.
#
# Two sequential write figures: `fio_seq_write_O_DIRECT_1MiB_io_uring`
# writes a 4 GiB file for the whole time, so once the file is written it
# overwrites blocks already allocated; `..._new_file` writes one new 4 GiB
# file once, every block allocated as it goes, which is what a log does
# (it only ever appends to new segments). On disks where allocating writes
# cost more (thin-provisioned virtual disks, for one) the two differ, and
# the second is the ceiling for produce throughput. The read figure
# (`fio_seq_read_O_DIRECT_1MiB_io_uring`, 16 reads in flight over the
# new file, every block of it written) is the ceiling for a consumer
# catching up from disk.
#
# `host_stalls`: a busy loop on each CPU of the idle machine, timing the
# gaps in its own progress over 1 ms: time the CPU was taken from it
# (by the hypervisor on a VM, or by interrupts and kernel threads). Gaps
# seen on every CPU at once are the whole machine stopping. No broker
# answers faster than these gaps, so they are the floor of the latency
# tails (p99.9, p99.99) measured on this machine.
#
#   perf/limits.sh [DIR]     DIR: a directory on the disk the broker writes to (default: a temp dir)
#
# SHARDLOG_PERF_SECONDS=N shortens each measurement (default 10).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${SHARDLOG_PERF_SECONDS:-10}"
dir="${1:-$(mktemp -d)}"
mkdir -p perf/results "$dir"
for tool in iperf3 fio python3; do
  command -v "$tool" >/dev/null || { echo "$tool is missing: apt-get install $tool" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; rm -f "$dir"/limits-*.0.0' EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
iperf3 -s -1 -B 127.0.0.1 -p "$port" >/dev/null 2>&1 &
server=$!
sleep 0.5
iperf3 -c 127.0.0.1 -p "$port" -P 1 -l 1M -t "$seconds" -J >"$tmp/iperf.json" || true
wait "$server" 2>/dev/null || true

fio --name=limits-new --directory="$dir" --rw=write --bs=1m --size=4g --direct=1 --ioengine=io_uring \
    --iodepth=4 --output-format=json >"$tmp/new.json"
fio --name=limits-seq --directory="$dir" --rw=write --bs=1m --size=4g --direct=1 --ioengine=io_uring \
    --iodepth=4 --time_based --runtime="$seconds" --output-format=json >"$tmp/seq.json"
fio --name=limits-new --directory="$dir" --rw=read --bs=1m --size=4g --direct=1 --ioengine=io_uring \
    --iodepth=16 --time_based --runtime="$seconds" --output-format=json >"$tmp/read.json"
fio --name=limits-sync --directory="$dir" --rw=write --bs=4k --size=256m --ioengine=sync --fdatasync=1 \
    --time_based --runtime="$seconds" --output-format=json >"$tmp/sync.json"

# Stalls of the idle machine: one busy loop per CPU, all at once.
for cpu in $(seq 0 $(( $(nproc) - 1 ))); do
  taskset -c "$cpu" python3 - "$seconds" >"$tmp/stalls-$cpu.json" <<'PY' &
import json, sys, time
end = time.monotonic() + float(sys.argv[1])
gaps, last = [], time.monotonic()
while last < end:
    now = time.monotonic()
    if now - last > 0.001:
        gaps.append((last, now))
    last = now
json.dump(gaps, sys.stdout)
PY
done
wait

python3 - "$tmp" "$seconds" <<'PY'
import datetime, glob, json, os, platform, sys
tmp, seconds = sys.argv[1], float(sys.argv[2])
def load(name):
    try:
        return json.load(open(os.path.join(tmp, name)))
    except (OSError, ValueError):
        return None
iperf, seq, new, read, sync = (load(f'{name}.json') for name in ('iperf', 'seq', 'new', 'read', 'sync'))
def cpu_model():
    for line in open('/proc/cpuinfo'):
        if line.startswith('model name'):
            return line.split(':', 1)[1].strip()
    return platform.machine()
loopback = None
if iperf and 'end' in iperf and 'sum_received' in iperf['end']:
    loopback = iperf['end']['sum_received']['bits_per_second'] / 8 / 1e6
seq_write = seq['jobs'][0]['write']['bw_bytes'] / 1e6 if seq else None
new_file_write = new['jobs'][0]['write']['bw_bytes'] / 1e6 if new else None
seq_read = read['jobs'][0]['read']['bw_bytes'] / 1e6 if read else None
sync_job = sync['jobs'][0] if sync else None
sync_rate = sync_job['write']['iops'] if sync_job else None
sync_lat = None
if sync_job and 'sync' in sync_job and 'lat_ns' in sync_job['sync']:
    lat = sync_job['sync']['lat_ns']
    pct = lat.get('percentile', {})
    sync_lat = {'mean_us': lat.get('mean', 0) / 1000,
                'p50_us': pct.get('50.000000', 0) / 1000,
                'p99_us': pct.get('99.000000', 0) / 1000}
def host_stalls():
    per_cpu = []
    for path in sorted(glob.glob(os.path.join(tmp, 'stalls-*.json'))):
        try:
            per_cpu.append(json.load(open(path)))
        except (OSError, ValueError):
            return None
    if not per_cpu:
        return None
    def summary(gaps):
        lengths = [(b - a) * 1000 for a, b in gaps]
        return {'over_1ms': len(lengths), 'over_5ms': sum(1 for g in lengths if g > 5),
                'max_ms': round(max(lengths, default=0), 2), 'lost_ms': round(sum(lengths), 1)}
    # A gap of the first CPU that overlaps a gap on every other CPU.
    together = [g for g in per_cpu[0]
                if all(any(a < g[1] and g[0] < b for a, b in other) for other in per_cpu[1:])]
    return {'seconds': seconds, 'per_cpu': [summary(g) for g in per_cpu], 'all_cpus_at_once': summary(together)}
out = {
    'date': datetime.datetime.now(datetime.timezone.utc).isoformat(),
    'machine': {'cores': os.cpu_count(), 'kernel': platform.release(), 'cpu_model': cpu_model()},
    'seconds_each': seconds,
    'loopback_tcp_one_stream_1MiB_writes_MB_per_s': loopback,
    'fio_seq_write_O_DIRECT_1MiB_io_uring_MB_per_s': seq_write,
    'fio_seq_write_new_file_O_DIRECT_1MiB_io_uring_MB_per_s': new_file_write,
    'fio_seq_read_O_DIRECT_1MiB_io_uring_MB_per_s': seq_read,
    'fio_fdatasync_4KiB_writes_per_s': sync_rate,
    'fio_fdatasync_latency': sync_lat,
    'host_stalls': host_stalls(),
}
path = f"perf/results/limits-{datetime.date.today()}.json"
json.dump(out, open(path, 'w'), indent=2)
print(json.dumps(out, indent=2))
print(f"wrote {path}", file=sys.stderr)
PY
