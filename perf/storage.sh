#!/usr/bin/env bash
# The storage engine against the device it runs on, in one run: raw
# sequential O_DIRECT write speed measured by fio (1 MiB and 16 KiB blocks,
# io_uring, with and without fdatasync per write) before and after the
# criterion append benchmark, then the ratios to the mean fio speed.
# Writes perf/results/storage-<date>.json.
#
#   perf/storage.sh [DIR]      DIR: a directory on the disk to measure (default: a temp dir)
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-$(mktemp -d)}"
mkdir -p perf/results "$dir"
command -v fio >/dev/null || { echo "fio is missing: apt-get install fio" >&2; exit 1; }

fio_mbps() { # block-size fsync-every
  fio --name=seq --directory="$dir" --rw=write --bs="$1" --size=512m --direct=1 \
      --ioengine=io_uring --iodepth=4 --fdatasync="$2" --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["write"]["bw_bytes"]/1e6)'
  rm -f "$dir"/seq.*
}

# The disk's speed drifts on a shared host: fio runs before and after the
# benchmark, and the ratios use the mean of the two.
fio_all() {
  echo "$(fio_mbps 1m 0) $(fio_mbps 1m 1) $(fio_mbps 16k 0)"
}
cargo bench --no-run --bench log
before=$(fio_all)
echo "fio O_DIRECT sequential write before (1MiB, 1MiB+fdatasync, 16KiB; MB/s): $before"
SHARDLOG_BENCH_DIR="$dir" cargo bench --bench log -- append 2>&1 | tee /tmp/shardlog-append.txt |
  grep -E '^append|thrpt' || true
after=$(fio_all)
echo "fio O_DIRECT sequential write after: $after"

python3 - $before $after <<'PY'
import json, re, sys, platform, os, datetime
runs = list(map(float, sys.argv[1:7]))
fio_before, fio_after = runs[:3], runs[3:]
fio_1m, fio_1m_sync, fio_16k = [(a + b) / 2 for a, b in zip(fio_before, fio_after)]
text = open('/tmp/shardlog-append.txt').read()
unit = {'KiB/s': 1024/1e6, 'MiB/s': 1024**2/1e6, 'GiB/s': 1024**3/1e6, 'B/s': 1/1e6}
results = {}
for name, value, u in re.findall(r'append/(\S+)\s+time:.*?\n\s+thrpt:\s+\[\S+ \S+ (\S+) (\S+)', text):
    results[name] = float(value) * unit[u]
ratios = {}
for name, mbps in results.items():
    raw = fio_1m if name.endswith('1048576') else fio_16k
    if 'always' in name:
        raw = fio_1m_sync if name.endswith('1048576') else raw
    ratios[name] = round(mbps / raw, 3) if raw else None
out = {
    'date': datetime.datetime.utcnow().isoformat() + 'Z',
    'machine': {'cpus': os.cpu_count(), 'kernel': platform.release(), 'cpu': platform.processor() or platform.machine()},
    'fio_mbps': {'seq_write_1MiB': fio_1m, 'seq_write_1MiB_fdatasync_each': fio_1m_sync, 'seq_write_16KiB': fio_16k},
    'fio_mbps_before_and_after': {'before': fio_before, 'after': fio_after},
    'append_mbps': results,
    'append_over_fio': ratios,
}
path = f"perf/results/storage-{datetime.date.today()}.json"
json.dump(out, open(path, 'w'), indent=2)
print(json.dumps(out, indent=2))
print('written', path)
PY
