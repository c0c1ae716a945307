#!/usr/bin/env python3
"""Measure consumer-group rebalance times against a real shardlog broker.

    python3 tests/compat/measure_rebalance.py [--runs 10] [--clients confluent,kafka-python,kafkajs]
                                              [--session-timeout-ms 6000] [--listener per-core|shared]

Starts target/release/shardlog (2 cores, --group-initial-rebalance-delay-ms 0)
in a temporary directory, creates a 12-partition topic that a background
producer keeps writing to, and runs a group of 3 member processes per client
(groups_consumer.py / kafkajs/groups.js). Each run:

  kill:  SIGKILL one member; time until the 2 survivors report assignments that
         cover all 12 partitions (expected: about session.timeout.ms plus a rebalance);
  leave: SIGTERM one member (consumer.close(), LeaveGroup); time until the
         survivors cover all 12 (expected: about a heartbeat interval plus a rebalance),

with a fresh member started after each to get back to 3, and a random
0.5-2 s pause before each kill/close (so it does not land at a fixed phase
of the members' 1 s heartbeats, which all restart at each assignment). Prints every run and
the median, min and max per client; exits non-zero if a median is out of the
loose bounds test_groups.py asserts for single runs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import BIN, Broker, pick_ports  # noqa: E402
from groups_common import (CLIENTS, GROUP_BROKER_ARGS, BackgroundProducer,  # noqa: E402
                           Member, cleanup_members, kafkajs_problem,
                           wait_all_consumed, wait_balanced)

PARTITIONS = 12


def measure_client(broker: Broker, client: str, runs: int, session_ms: int, log_dir: Path, run_seed: int = 1):
    topic = f"measure-{client}-{int(time.time())}"
    broker.create_topic(topic, partitions=PARTITIONS)
    all_tps = {(topic, p) for p in range(PARTITIONS)}
    group = f"measure-{client}-{int(time.time() * 1000)}"
    producer = BackgroundProducer(broker.bootstrap, topic, PARTITIONS, rate=200)
    started = []
    counter = 0

    def new_member():
        nonlocal counter
        counter += 1
        m = Member(client, broker.bootstrap, group, [topic], f"m{counter}", log_dir,
                   session_timeout_ms=session_ms)
        started.append(m)
        return m

    kill_times, leave_times = [], []
    rng = random.Random(run_seed)
    try:
        live = [new_member() for _ in range(3)]
        wait_balanced(live, all_tps, timeout=60, what="(initial)")
        for run in range(runs):
            # A random pause first, so the kill does not land at a fixed phase of
            # the members' heartbeats (they all restart them at each assignment).
            time.sleep(rng.uniform(0.5, 2.0))
            victim = live.pop(0)
            t0 = victim.kill()
            t1 = wait_balanced(live, all_tps, timeout=session_ms / 1000 + 30, what=f"(run {run} kill)")
            kill_times.append(t1 - t0)
            live.append(new_member())
            wait_balanced(live, all_tps, timeout=60, what=f"(run {run} rejoin after kill)")

            time.sleep(rng.uniform(0.5, 2.0))
            leaver = live.pop(0)
            t0 = leaver.terminate()
            t1 = wait_balanced(live, all_tps, timeout=session_ms / 1000 + 30, what=f"(run {run} leave)")
            leave_times.append(t1 - t0)
            leaver.wait_closed()
            live.append(new_member())
            wait_balanced(live, all_tps, timeout=60, what=f"(run {run} rejoin after leave)")
            print(f"  {client} run {run + 1}/{runs}: kill {kill_times[-1]:.2f}s  leave {leave_times[-1]:.2f}s",
                  flush=True)
    finally:
        produced = producer.stop()
    try:
        wait_all_consumed(started, produced, timeout=60, what=f"by {client} group {group}")
    finally:
        cleanup_members(started)
    return kill_times, leave_times, len(produced)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--clients", default=",".join(CLIENTS))
    ap.add_argument("--session-timeout-ms", type=int, default=6000)
    ap.add_argument("--listener", default="per-core", choices=["per-core", "shared"])
    ap.add_argument("--cores", type=int, default=2)
    args = ap.parse_args()

    clients = [c for c in args.clients.split(",") if c]
    if "kafkajs" in clients and kafkajs_problem():
        sys.exit(kafkajs_problem())
    tmp = Path(tempfile.mkdtemp(prefix="shardlog-measure-"))
    (tmp / "data").mkdir()
    span = args.cores if args.listener == "per-core" else 1
    broker = Broker(listener=args.listener, cores=args.cores, data_dir=tmp / "data",
                    log_path=tmp / "broker.log", port=pick_ports(span), extra_args=GROUP_BROKER_ARGS)
    print(f"broker {BIN} {broker.mode}, logs in {tmp}; session.timeout.ms {args.session_timeout_ms}, "
          f"heartbeat.interval.ms 1000, {args.runs} runs per client", flush=True)
    broker.start()
    results = {}
    try:
        for client in clients:
            results[client] = measure_client(broker, client, args.runs, args.session_timeout_ms, tmp)
    finally:
        broker.stop()

    session_s = args.session_timeout_ms / 1000
    ok = True
    print("\nrebalance time, seconds (median [min..max])")
    for client, (kills, leaves, produced) in results.items():
        mk, ml = statistics.median(kills), statistics.median(leaves)
        print(f"  {client:13s} after SIGKILL: {mk:6.2f} [{min(kills):.2f}..{max(kills):.2f}]   "
              f"after graceful close: {ml:5.2f} [{min(leaves):.2f}..{max(leaves):.2f}]   "
              f"({produced} records produced, none lost)")
        if not mk < session_s + 10 or not ml < session_s - 2:
            ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
