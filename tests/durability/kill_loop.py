#!/usr/bin/env python3
"""The long kill -9 run of issue 33: many runs of many SIGKILLs.

    python3 tests/durability/kill_loop.py --runs 20 --kills 12 --seed S --load

Each run starts a fresh 2-core broker (flush=always, the default) on a new
data dir, creates a 4-partition topic and runs tests/compat/durability.py's
run_kill_loop on it, the same code as the pytest test: an idempotent acks=all
confluent-kafka producer writes continuously while the broker is SIGKILLed
--kills times at moments drawn from the run's seed and restarted on the same
data; then every partition is read back from offset 0 and checked (every
acknowledged record at its offset exactly once, dense offsets, no duplicate,
send order, no fatal producer error, acknowledgements after every restart).

--load runs `shardlog bench produce --brokers 127.0.0.1:PORT` beside it
against the same broker (started again after every kill) to load the machine.

Prints a line per run (seed, records acknowledged, kills, OK or the first
discrepancy) and a summary line; exits 1 if any run failed. The data dir and
broker log of a failed run are kept and named. Not collected by pytest.
The default is quick: 2 runs of 10 kills.

Env: SHARDLOG_BIN (broker binary, default target/release/shardlog).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "compat"))

import pytest  # noqa: E402  (conftest's broker reports startup failures with pytest.fail)
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from conftest import BIN, Broker, pick_ports  # noqa: E402
from durability import KILL_LOOP_PRODUCER_CONFIG, KillLoopResult, run_kill_loop, stop_quietly, terminate  # noqa: E402

TOPIC = "kill-loop"
PARTITIONS = 4
BROKER_CORES = 2
LOAD_TOPIC = "kill-loop-load"


def main() -> int:
    args = parse_args()
    if not BIN.is_file():
        print(f"broker binary {BIN} is missing: cargo build --release, or set SHARDLOG_BIN", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    seeds = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="shardlog-kill-loop-", dir=args.work_dir))
    print(f"kill loop: {args.runs} runs x {args.kills} kills, seed {seed}, binary {BIN}, "
          f"rate {args.rate}/s, load {args.load_rate if args.load else 'off'}, work dir {work}", flush=True)
    # librdkafka logs every refused connection to stderr: keep them in a file.
    client_log = open(work / "client-stderr.log", "ab")
    os.dup2(client_log.fileno(), sys.stderr.fileno())
    failed: List[str] = []
    acked_total = 0
    kills_total = 0
    started = time.monotonic()
    for run in range(1, args.runs + 1):
        run_seed = seeds.randrange(1 << 32)
        if args.seed_run is not None:
            run_seed = args.seed_run
        run_dir = work / f"run-{run}"
        result, error = one_run(run_dir, run_seed, args)
        if result is not None:
            acked_total += result.acked
            kills_total += result.kills
        if error is None and result.ok:
            print(f"run {run}/{args.runs}: OK, seed {run_seed}, {result.kills} kills, {result.acked} acknowledged, "
                  f"{result.read} read back", flush=True)
            shutil.rmtree(run_dir, ignore_errors=True)
            continue
        first = error if error is not None else first_discrepancy(result.problems)
        detail = result.describe() if result is not None else first
        replay = f"--runs 1 --kills {args.kills} --seed-run {run_seed}" + (" --load" if args.load else "")
        print(f"run {run}/{args.runs}: FAILED, seed {run_seed} (replay: {replay}), first discrepancy: {first}\n"
              f"  {detail}\n  kept: {run_dir}", flush=True)
        failed.append(f"run {run} (seed {run_seed})")
    elapsed_s = time.monotonic() - started
    verdict = "OK" if not failed else f"FAILED: {', '.join(failed)}"
    print(f"SUMMARY: {args.runs - len(failed)}/{args.runs} runs OK, {kills_total} kills, "
          f"{acked_total} records acknowledged, {elapsed_s:.0f}s, seed {seed}: {verdict}", flush=True)
    if not failed:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"client logs: {work / 'client-stderr.log'}", flush=True)
    return 1 if failed else 0


def first_discrepancy(problems: List[str]) -> str:
    """The first problem with the data itself, else the first problem."""
    data_kinds = ("LOST", "REUSED", "GAP", "DUPLICATE", "REORDERED", "MISPLACED", "FOREIGN", "LOG-START")
    return next((p for p in problems if p.split(" ", 1)[0] in data_kinds), problems[0])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2, help="runs, each on a fresh broker [2]")
    parser.add_argument("--kills", type=int, default=10, help="SIGKILLs per run [10]")
    parser.add_argument("--seed", type=int, help="seed of the whole series [fresh]")
    parser.add_argument("--seed-run", type=int, help="replay one run: use this run seed for every run")
    parser.add_argument("--rate", type=int, default=10000, help="records/s of the checked producer [10000]")
    parser.add_argument("--load", action="store_true", help="run `shardlog bench produce` beside it")
    parser.add_argument("--load-rate", default="20MB/s",
                        help="bench --rate; 'max' for as fast as possible [20MB/s]")
    parser.add_argument("--work-dir", default=None, help="where run data dirs go [system temp dir]")
    args = parser.parse_args()
    if args.runs < 1 or args.kills < 1:
        parser.error("--runs and --kills must be at least 1")
    return args


def one_run(run_dir: Path, run_seed: int, args) -> "tuple[Optional[KillLoopResult], Optional[str]]":
    """One broker, one kill loop. Returns (result, None), or (None, error) when
    the run could not complete (the broker did not start, a crash before a kill)."""
    data = run_dir / "data"
    data.mkdir(parents=True)
    broker = Broker(listener="per-core", cores=BROKER_CORES, data_dir=data, log_path=run_dir / "broker.log",
                    port=pick_ports(BROKER_CORES))
    load: Optional[BenchLoad] = None
    try:
        broker.start()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1)],
                            operation_timeout=15)[TOPIC].result(30)
        if args.load:
            load = BenchLoad(broker, run_dir / "bench.log", args.load_rate)
            load.start()
        result = run_kill_loop(broker, TOPIC, PARTITIONS, args.kills, run_seed, rate_per_s=args.rate,
                               **KILL_LOOP_PRODUCER_CONFIG)
        if load is not None:
            load.stop()
            result.problems += load.problems()
        if "panicked" in broker.log_text():
            result.problems.append(f"PANIC the broker panicked; see {broker.log_path}")
        return result, None
    except AssertionError as exc:
        return None, str(exc)
    except pytest.fail.Exception as exc:
        return None, exc.msg
    finally:
        if load is not None:
            load.stop()
        stop_quietly(broker)


class BenchLoad:
    """`shardlog bench produce` against the broker on a thread, started again
    whenever it exits (it does when the broker is killed under it)."""

    def __init__(self, broker: Broker, log_path: Path, rate: str) -> None:
        self.broker = broker
        self.log_path = log_path
        self.rate = rate
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.proc: Optional[subprocess.Popen] = None
        self.starts = 0
        self.thread = threading.Thread(target=self._run, name="bench-load", daemon=True)

    def command(self) -> List[str]:
        cmd = [str(BIN), "bench", "produce", "--brokers", self.broker.bootstrap, "--topic", LOAD_TOPIC,
               "--partitions", "8", "--cores", "1", "--duration", "1h", "--warmup", "0s", "--acks", "all"]
        if self.rate != "max":
            cmd += ["--rate", self.rate]
        return cmd

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        with self.lock:
            proc = self.proc
        terminate(proc, timeout=10)
        self.thread.join(timeout=15)

    def problems(self) -> List[str]:
        return [] if self.starts else ["LOAD the bench load generator never started"]

    def _run(self) -> None:
        with open(self.log_path, "ab") as log:
            while not self.stopping.is_set():
                log.write(f"\n===== bench start #{self.starts + 1}: {' '.join(self.command())}\n".encode())
                log.flush()
                with self.lock:
                    if self.stopping.is_set():
                        return
                    self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                                 stdin=subprocess.DEVNULL)
                    self.starts += 1
                while self.proc.poll() is None and not self.stopping.is_set():
                    time.sleep(0.1)
                self.stopping.wait(0.3)  # the broker is coming back up


if __name__ == "__main__":
    sys.exit(main())
