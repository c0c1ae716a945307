#!/usr/bin/env python3
"""Partition failover as an unmodified client sees it (issue 30).

Three `shardlog serve` machines on 127.0.0.1 (1 core each, all controller
voters, gossip on), a topic of one partition with three replicas and
min.insync.replicas=2. confluent-kafka (librdkafka, default settings but
linger.ms=0) produces to partition 0 every 2 ms with acks=all. Each trial
kills the leader's machine with SIGKILL and measures the time from the
kill to the acknowledgement of the first message sent after it; then the
machine restarts and the trial waits for a full ISR. Then the same with
SIGTERM (controlled shutdown), counting the produces that failed.

    python3 perf/replication_failover.py [TRIALS]      (default 20)

Prints one line per trial and the p50/p99/max; writes
perf/results/replication-failover.json. Needs target/release/shardlog
(SHARDLOG_BIN) and the Python clients of tests/compat.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "compat"))

from conftest import start_machines  # noqa: E402

MACHINES = 3


def start_cluster(work: Path):
    """Three machines of one core, gossiping (machine 1's gossip port is the seed)."""
    seed = []

    def extra(i, base):
        gossip = base + 2
        if i == 0:
            seed.append(gossip)
        return ["--gossip-port", str(gossip), "--seeds", f"127.0.0.1:{seed[0]}"]

    return start_machines(work, MACHINES, 1, extra, spare_ports=1)


def describe(machines, topic):
    from confluent_kafka.admin import AdminClient

    for m in machines:
        if m.proc is None or m.proc.poll() is not None:
            continue
        try:
            md = AdminClient({"bootstrap.servers": m.bootstrap}).list_topics(topic, timeout=5)
            return md, md.topics[topic].partitions[0]
        except Exception:
            continue
    raise RuntimeError("no machine answers")


def wait_full_isr(machines, topic, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            md, p = describe(machines, topic)
            if len(p.isrs) == MACHINES and p.leader >= 0:
                return md, p
        except Exception:
            pass
        time.sleep(0.1)
    raise RuntimeError("ISR not whole again")


class Probe:
    """Produces to partition 0 every 2 ms, remembering each send and its answer."""

    def __init__(self, bootstrap, topic):
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
        self.topic = topic
        self.lock = threading.Lock()
        self.sends = []  # (sent_at, answered_at, ok)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            sent = time.monotonic()

            def report(err, msg, sent=sent):
                with self.lock:
                    self.sends.append((sent, time.monotonic(), err is None))

            try:
                self.producer.produce(self.topic, value=b"x" * 100, partition=0, on_delivery=report)
            except BufferError:
                pass
            self.producer.poll(0)
            time.sleep(0.002)
        self.producer.flush(60)

    def first_ack_after(self, at):
        with self.lock:
            acked = [answered for sent, answered, ok in self.sends if ok and sent >= at]
        return min(acked) if acked else None

    def failures_between(self, start, end):
        with self.lock:
            return sum(1 for sent, _, ok in self.sends if not ok and start <= sent <= end)

    def close(self):
        self.stop.set()
        self.thread.join()


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main():
    from confluent_kafka.admin import AdminClient, NewTopic

    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    keep = os.environ.get("SHARDLOG_KEEP_WORK")
    with tempfile.TemporaryDirectory() as scratch:
        work = keep or scratch
        machines = start_cluster(Path(work))
        try:
            topic = "failover"
            admin = AdminClient({"bootstrap.servers": machines[0].bootstrap})
            admin.create_topics([NewTopic(topic, 1, replication_factor=3,
                                          config={"min.insync.replicas": "2"})])[topic].result(30)
            md, p = wait_full_isr(machines, topic)
            probe = Probe(",".join(m.bootstrap for m in machines), topic)
            time.sleep(2)
            kills = []
            for trial in range(trials):
                md, p = wait_full_isr(machines, topic)
                victim = next(i for i, m in enumerate(machines) if md.brokers[p.leader].port in m.ports)
                time.sleep(1)
                old_leader = p.leader
                killed_at = time.monotonic()
                killed_wall = time.strftime("%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}"
                machines[victim].kill()
                deadline = killed_at + 30
                elected = None
                while probe.first_ack_after(killed_at) is None and time.monotonic() < deadline:
                    if elected is None:
                        try:
                            _, now = describe(machines, topic)
                            if now.leader >= 0 and now.leader != old_leader:
                                elected = time.monotonic()
                        except Exception:
                            pass
                    time.sleep(0.01)
                acked = probe.first_ack_after(killed_at)
                took = (acked - killed_at) * 1000 if acked else float("inf")
                kills.append(took)
                elected_ms = (elected - killed_at) * 1000 if elected else float("nan")
                print(f"kill -9 trial {trial + 1} (at {killed_wall} UTC): machine {victim + 1}, new leader in metadata after "
                      f"{elected_ms:.0f} ms, first acknowledged produce after {took:.0f} ms")
                machines[victim].start(60.0)
            stops = []
            for trial in range(min(trials, 5)):
                md, p = wait_full_isr(machines, topic)
                victim = next(i for i, m in enumerate(machines) if md.brokers[p.leader].port in m.ports)
                time.sleep(1)
                started = time.monotonic()
                code = machines[victim].stop()
                failed = probe.failures_between(started, time.monotonic() + 5)
                time.sleep(2)
                failed = probe.failures_between(started - 0.1, time.monotonic())
                stops.append({"exit": code, "failed_produces": failed})
                print(f"SIGTERM trial {trial + 1}: machine {victim + 1} exited {code}, failed produces {failed}")
                machines[victim].start(60.0)
            probe.close()
            summary = {
                "kill_trials": len(kills),
                "kill_p50_ms": round(percentile(kills, 50)),
                "kill_p99_ms": round(percentile(kills, 99)),
                "kill_max_ms": round(max(kills)),
                "sigterm_trials": stops,
                "host": platform.node(),
                "cpus": os.cpu_count(),
            }
            print(json.dumps(summary, indent=2))
            out = REPO / "perf" / "results" / "replication-failover.json"
            out.write_text(json.dumps(summary, indent=2) + "\n")
        finally:
            for m in machines:
                if m.proc is not None and m.proc.poll() is None:
                    m.proc.send_signal(signal.SIGKILL)
                    m.proc.wait()


if __name__ == "__main__":
    main()
