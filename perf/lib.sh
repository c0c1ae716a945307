# Shared by the perf scripts that run several `shardlog serve` machines:
# `source perf/lib.sh` after `cd` to the repository root. Gives $work (a
# scratch directory), $pids (started brokers, killed and the directory
# removed on exit) and wait_port PORT.
work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

wait_port() {
  for _ in $(seq 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "port $1 never opened" >&2
  exit 1
}
