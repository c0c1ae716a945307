"""Faults against a replicated topic, checked like Jepsen's Kafka workload
(issue 30).

Three `shardlog serve` machines, each in a network namespace of its own
(2 cores each, all controller voters; `conftest.NetnsMachines`), a topic of
3 partitions with 3 replicas and min.insync.replicas=2.
confluent-kafka (librdkafka, unmodified) produces unique values to keys
with acks=all and idempotence, records every send's outcome; a consumer in
a group and a consumer by assignment record every poll. Meanwhile the
faults, chosen by a seed: kill -9 of a partition leader's machine (with,
sometimes, a torn batch written at the end of its logs before it returns),
SIGSTOP of a machine for longer than its lease, and network partitions
made with nftables in the namespaces: a leader's machine cut off from the
others (the majority goes on without it, it cannot commit), and a bridge
(two machines cut from each other, both still reaching the third). The
clients reach every machine throughout, as in Jepsen. After the last fault
every machine returns, a fresh consumer drains every partition, and
`shardlog history check` looks for lost, duplicated, inconsistent, skipped
and out-of-order records. Then the replicas' logs are compared on disk,
byte for byte, up to the high watermark.

A second test restarts every machine in turn with SIGTERM under the same
workload: the controlled shutdown moves leadership first, so no send ends
in an error.

SHARDLOG_FAULT_CYCLES (default 4) and SHARDLOG_FAULT_SEED pick the run;
SHARDLOG_HISTORY_OUT keeps the history file. perf/faults.sh runs the long
version.
"""

from __future__ import annotations

import json
import os
import random
import signal
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import BIN, NetnsMachines, start_machines_netns, unique_topic

MACHINES = 3
CORES = 2
PARTITIONS = 3
KEYS = 24
CYCLES = int(os.environ.get("SHARDLOG_FAULT_CYCLES", "4"))
SEED = int(os.environ.get("SHARDLOG_FAULT_SEED", str(random.randrange(1 << 30))))


@pytest.fixture
def net():
    """The namespaces and links, removed at teardown whatever happened."""
    net = NetnsMachines(MACHINES)
    yield net
    net.close()


@pytest.fixture
def machines(tmp_path, net):
    out = start_machines_netns(tmp_path, net, CORES, lambda i, base: ["--group-initial-rebalance-delay-ms", "0"])
    yield out
    net.heal()
    for m in out:
        if m.proc is not None and m.proc.poll() is None:
            m.proc.send_signal(signal.SIGCONT)
            m.stop()


def machine_of_broker(machines, broker):
    """The machine (index) a Metadata broker entry is a node of."""
    return next(i for i, m in enumerate(machines) if broker.host == m.host and broker.port in m.ports)


class Recorder:
    """The history, appended from several threads."""

    def __init__(self):
        self.ops = []
        self.lock = threading.Lock()

    def add(self, op):
        with self.lock:
            self.ops.append(op)


def producer_loop(bootstrap, topic, history, stop):
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 2, "message.timeout.ms": 30000, "request.timeout.ms": 5000})
    n = 0

    def report(err, msg):
        value = msg.value().decode()
        key = msg.key().decode()
        if err is None:
            history.add({"op": "send", "key": key, "value": value, "outcome": "ok",
                         "partition": msg.partition(), "offset": msg.offset()})
        else:
            # After retries ran out the write may or may not be there.
            history.add({"op": "send", "key": key, "value": value, "outcome": "info"})

    while not stop.is_set():
        value, key = f"v{n}", f"k{n % KEYS}"
        try:
            producer.produce(topic, value=value.encode(), key=key.encode(), on_delivery=report)
        except BufferError:
            history.add({"op": "send", "key": key, "value": value, "outcome": "fail"})
        n += 1
        producer.poll(0)
        time.sleep(0.003)
    assert producer.flush(60) == 0, "every send settled"


def consumer_loop(bootstrap, topic, history, stop, name, group):
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    generation = [0]
    conf = {"bootstrap.servers": bootstrap, "enable.partition.eof": False, "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}
    if group:
        conf.update({"group.id": f"faults-{SEED}", "enable.auto.commit": True, "auto.commit.interval.ms": 500})
        consumer = Consumer(conf)

        def on_assign(c, partitions):
            generation[0] += 1

        def on_revoke(c, partitions):
            generation[0] += 1

        consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    else:
        conf.update({"group.id": f"unused-{SEED}", "enable.auto.commit": False})
        consumer = Consumer(conf)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    try:
        while not stop.is_set():
            for m in consumer.consume(num_messages=500, timeout=0.2):
                if m.error() is not None:
                    continue
                history.add({"op": "poll", "consumer": name, "generation": generation[0],
                             "partition": m.partition(), "offset": m.offset(),
                             "key": m.key().decode(), "value": m.value().decode()})
    finally:
        consumer.close()


def drain(bootstrap, topic, history):
    """Reads every partition from its start to its high watermark."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"drain-{SEED}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    ends = {}
    for p in range(PARTITIONS):
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
        ends[p] = high
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    done = {p for p, high in ends.items() if high == 0}
    deadline = time.monotonic() + 60
    while len(done) < PARTITIONS:
        assert time.monotonic() < deadline, f"drain stuck: done {done}, ends {ends}"
        for m in consumer.consume(num_messages=1000, timeout=0.5):
            if m.error() is not None:
                continue
            history.add({"op": "poll", "consumer": "drain", "generation": 0, "partition": m.partition(),
                         "offset": m.offset(), "key": m.key().decode(), "value": m.value().decode()})
            if m.offset() + 1 >= ends[m.partition()]:
                done.add(m.partition())
    consumer.close()
    return ends


def tear_tails(data_dir: Path, topic: str, rng):
    """Writes a torn batch (a header whose length runs past what follows,
    then garbage) where each partition's last segment's data ends, as a
    crash in the middle of a write leaves it."""
    for p in range(PARTITIONS):
        segments = sorted((data_dir / f"{topic}-{p}").glob("*.log"))
        if not segments:
            continue
        path = segments[-1]
        end = valid_end(path.read_bytes())
        with open(path, "r+b") as f:
            f.seek(end)
            f.write(struct.pack(">qi", rng.randrange(1 << 40), 5000) + bytes(rng.randrange(256) for _ in range(200)))


def batches(raw: bytes):
    """(base offset, last offset, bytes) of each whole batch at the start of a segment."""
    at = 0
    while at + 61 <= len(raw):
        base, length = struct.unpack(">qi", raw[at:at + 12])
        if length <= 49 or at + 12 + length > len(raw):
            return
        last_delta = struct.unpack(">i", raw[at + 23:at + 27])[0]
        yield base, base + last_delta, raw[at:at + 12 + length]
        if base < 0 or last_delta < 0:
            return
        at += 12 + length


def valid_end(raw: bytes) -> int:
    end, expected = 0, None
    for base, last, data in batches(raw):
        if expected is not None and base != expected:
            break
        end += len(data)
        expected = last + 1
    return end


def replica_log(data_dir: Path, topic: str, partition: int, upto: int):
    """The batches of one replica below `upto`, in order."""
    out = []
    for path in sorted((data_dir / f"{topic}-{partition}").glob("*.log")):
        for base, last, data in batches(path.read_bytes()):
            if base >= upto:
                return out
            if out and base <= out[-1][1]:
                break
            out.append((base, last, data))
    return out


def leader_machine(machines, topic, partition):
    from confluent_kafka.admin import AdminClient

    for m in machines:
        if m.proc is None or m.proc.poll() is not None:
            continue
        try:
            md = AdminClient({"bootstrap.servers": m.bootstrap}).list_topics(topic, timeout=5)
        except Exception:
            continue
        leader = md.topics[topic].partitions[partition].leader
        if leader >= 0 and leader in md.brokers:
            return machine_of_broker(machines, md.brokers[leader])
    return None


def wait_full_isr(machines, topic, timeout=60.0):
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout
    while True:
        try:
            md = AdminClient({"bootstrap.servers": machines[0].bootstrap}).list_topics(topic, timeout=5)
            parts = md.topics[topic].partitions
            if len(parts) == PARTITIONS and all(len(p.isrs) == MACHINES and p.leader >= 0 for p in parts.values()):
                return md
        except Exception:
            pass
        assert time.monotonic() < deadline, "the ISR of every partition is whole again"
        time.sleep(0.2)


def replicated_topic(machines, prefix):
    """A topic of PARTITIONS partitions, three replicas, min.insync.replicas=2,
    once every ISR is whole; with the bootstrap list of every machine."""
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = unique_topic(prefix)
    admin = AdminClient({"bootstrap.servers": machines[0].bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, replication_factor=3,
                                  config={"min.insync.replicas": "2"})])[topic].result(timeout=30)
    wait_full_isr(machines, topic)
    return topic, ",".join(m.bootstrap for m in machines)


def check_history(history, path):
    """Writes the history to `path` and runs `shardlog history check` on it:
    its report, and whether it found no anomaly."""
    with open(path, "w") as f:
        for op in history.ops:
            f.write(json.dumps(op) + "\n")
    checked = subprocess.run([str(BIN), "history", "check", str(path)], capture_output=True, text=True)
    print(checked.stdout)
    return checked.stdout, checked.returncode == 0


@pytest.mark.timeout(max(900, CYCLES * 30))
def test_kills_stops_partitions_and_torn_tails_lose_no_acknowledged_write_and_replicas_agree(machines, net, tmp_path):
    rng = random.Random(SEED)
    print(f"fault seed {SEED}, {CYCLES} cycles (SHARDLOG_FAULT_SEED={SEED} replays the choices)")
    topic, bootstrap = replicated_topic(machines, "faults")
    history = Recorder()
    stop_producing, stop_consuming = threading.Event(), threading.Event()
    workers = [threading.Thread(target=producer_loop, args=(bootstrap, topic, history, stop_producing)),
               threading.Thread(target=consumer_loop, args=(bootstrap, topic, history, stop_consuming, "group", True)),
               threading.Thread(target=consumer_loop,
                                args=(bootstrap, topic, history, stop_consuming, "assigned", False))]
    for w in workers:
        w.start()
    faults = []
    try:
        time.sleep(2)
        for cycle in range(CYCLES):
            kind = rng.choice(["kill", "kill-torn", "stop", "isolate", "bridge"])
            victim = leader_machine(machines, topic, rng.randrange(PARTITIONS))
            if victim is None:
                victim = rng.randrange(MACHINES)
            m = machines[victim]
            faults.append(f"{kind} m{victim + 1}")
            if kind.startswith("kill"):
                m.kill()
                time.sleep(rng.uniform(1.0, 3.0))
                if kind == "kill-torn":
                    tear_tails(m.data_dir, topic, rng)
                m.start(60.0)
            elif kind == "stop":
                m.proc.send_signal(signal.SIGSTOP)
                time.sleep(rng.uniform(2.5, 4.0))
                m.proc.send_signal(signal.SIGCONT)
            elif kind == "isolate":
                # The leader's machine alone: the other two (a majority of
                # the voters and of each ISR) go on without it.
                net.isolate(victim)
                time.sleep(rng.uniform(3.0, 5.0))
                net.heal()
            else:
                # The victim is the bridge: the other two cannot reach each
                # other, both reach it.
                a, b = [i for i in range(MACHINES) if i != victim]
                net.cut(a, b)
                time.sleep(rng.uniform(3.0, 5.0))
                net.heal()
            wait_full_isr(machines, topic)
            time.sleep(rng.uniform(0.5, 2.0))
    finally:
        stop_producing.set()
        workers[0].join(120)
        time.sleep(3)
        stop_consuming.set()
        for w in workers[1:]:
            w.join(60)
    print("faults:", ", ".join(faults))
    md = wait_full_isr(machines, topic)
    ends = drain(bootstrap, topic, history)
    path = Path(os.environ.get("SHARDLOG_HISTORY_OUT", tmp_path / "history.jsonl"))
    report, valid = check_history(history, path)
    assert valid, f"history {path} has anomalies (seed {SEED}, faults {faults}):\n{report}"
    sends = [op for op in history.ops if op["op"] == "send"]
    assert sum(op["outcome"] == "ok" for op in sends) > 100, "the workload ran"

    # Divergence: once every follower holds the leader's end, the replicas'
    # logs are the same bytes up to the high watermark.
    for p in range(PARTITIONS):
        deadline = time.monotonic() + 30
        while True:
            logs = [replica_log(m.data_dir, topic, p, ends[p]) for m in machines]
            reached = [sum(last - base + 1 for base, last, _ in log) for log in logs]
            if all(log and log[-1][1] + 1 >= ends[p] for log in logs) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        first = logs[0]
        for i, log in enumerate(logs[1:], start=2):
            assert [b for b in log] == [b for b in first], (
                f"partition {p}: machine {i}'s log differs from machine 1's below the high watermark "
                f"{ends[p]} (records {reached})")
    assert md is not None


@pytest.mark.timeout(600)
def test_a_rolling_restart_fails_no_produce(machines, tmp_path):
    """Each machine in turn gets SIGTERM and starts again while an
    idempotent acks=all producer and two consumers run: the controlled
    shutdown moves leadership first, so every send is acknowledged (none
    ends in an error) and the history holds no anomaly."""
    topic, bootstrap = replicated_topic(machines, "rolling")
    history = Recorder()
    stop_producing, stop_consuming = threading.Event(), threading.Event()
    workers = [threading.Thread(target=producer_loop, args=(bootstrap, topic, history, stop_producing)),
               threading.Thread(target=consumer_loop,
                                args=(bootstrap, topic, history, stop_consuming, "assigned", False))]
    for w in workers:
        w.start()
    try:
        time.sleep(1)
        for m in machines:
            assert m.stop() == 0, m.log_tail()
            m.start(60.0)
            wait_full_isr(machines, topic)
            time.sleep(1)
    finally:
        stop_producing.set()
        workers[0].join(120)
        time.sleep(2)
        stop_consuming.set()
        workers[1].join(60)
    drain(bootstrap, topic, history)
    report, valid = check_history(history, tmp_path / "history.jsonl")
    assert valid, report
    sends = [op for op in history.ops if op["op"] == "send"]
    assert sends and all(op["outcome"] == "ok" for op in sends), (
        f"{sum(op['outcome'] != 'ok' for op in sends)} of {len(sends)} sends not acknowledged")
