"""`shardlog mirror` (issue 31) between two shardlog clusters, with real clients.

Each cluster is one shardlog process of its own (own port, own data dir).
confluent-kafka writes keyed records with headers, explicit timestamps and
lz4 compression to the source and reads both sides back; the mirror runs as
the user runs it (`shardlog mirror --source ... --target ...`), and is killed
with SIGKILL in the middle of a stream. MirrorMaker 2's checkpoint records are
decoded here with Kafka's Struct layout, written out independently of the
Rust encoder.
"""

from __future__ import annotations

import json
import os
import re
import signal
import struct
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from conftest import BIN, unique_topic


class Mirror:
    def __init__(self, log: Path, args: List[str]):
        self.log = log
        self.args = args
        self.proc = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([str(BIN), "mirror", *self.args], stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
                return -9
        return self.proc.returncode

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@pytest.fixture
def mirrors(tmp_path):
    """mirrors(source, target, *flags) -> a started Mirror; all are stopped at
    teardown, and each must exit 0 on SIGTERM unless the test killed it."""
    started: List[Mirror] = []

    def make(source, target, *flags: str) -> Mirror:
        m = Mirror(tmp_path / f"mirror{len(started)}.log",
                   ["--source", source.bootstrap, "--target", target.bootstrap, "--report-s", "1", *flags])
        m.start()
        started.append(m)
        return m

    yield make
    failures = []
    for m in started:
        killed = m.proc.returncode is not None and m.proc.returncode < 0
        rc = m.stop()
        if not killed and rc != 0:
            failures.append(f"mirror exited {rc}:\n{m.text()[-3000:]}")
        if "panicked" in m.text():
            failures.append(f"mirror panicked:\n{m.text()[-3000:]}")
    if failures:
        pytest.fail("\n\n".join(failures), pytrace=False)


Row = Tuple[bytes, bytes, tuple, tuple]


def read_all(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> Dict[int, List[Row]]:
    """Every record of every partition, in offset order: (key, value, headers, timestamp)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_topic("reader"), "enable.auto.commit": False,
                  "enable.partition.eof": True, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 50})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: Dict[int, List[Row]] = {p: [] for p in range(partitions)}
        at_end = set()
        deadline = time.time() + timeout
        while len(at_end) < partitions and time.time() < deadline:
            for m in c.consume(1000, 0.5):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        at_end.add(m.partition())
                    continue
                at_end.discard(m.partition())
                out[m.partition()].append((m.key(), m.value(), tuple(m.headers() or ()), m.timestamp()))
        assert len(at_end) == partitions, f"{topic}: not every partition reached its end"
        return out
    finally:
        c.close()


def end_offsets(bootstrap: str, topic: str, partitions: int) -> List[int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_topic("ends")})
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)]
    finally:
        c.close()


def wait_until(check: Callable[[], bool], timeout: float, what: str, log: Callable[[], str] = lambda: "") -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if check():
                return
        except Exception:  # the topic may not exist yet
            pass
        time.sleep(0.3)
    pytest.fail(f"timed out waiting for {what}\n{log()[-4000:]}")


def topics_of(bootstrap: str) -> Dict[str, int]:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    return {name: len(t.partitions) for name, t in md.topics.items()}


def produce(bootstrap: str, topic: str, count: int, rate: float = 0.0, start: int = 0,
            compression: str = "lz4") -> None:
    """Keyed records with two headers and a timestamp of their own."""
    p = Producer({"bootstrap.servers": bootstrap, "compression.type": compression, "linger.ms": 5,
                  "enable.idempotence": True})
    began = time.time()
    for i in range(start, start + count):
        p.produce(topic, key=f"key-{i % 101}".encode(), value=f"value-{i}-".encode() * 3,
                  headers=[("seq", str(i).encode()), ("origin", b"east")], timestamp=1_700_000_000_000 + i)
        p.poll(0)
        if rate and (i - start) % 100 == 0:
            ahead = (i - start) / rate - (time.time() - began)
            if ahead > 0:
                time.sleep(ahead)
    assert p.flush(30) == 0


def decode_checkpoint(key: bytes, value: bytes) -> Tuple[str, str, int, int, int, str]:
    """MirrorMaker 2's Checkpoint: key (group STRING, topic STRING, partition
    INT32), value (version INT16 = 0, upstreamOffset INT64, offset INT64,
    metadata STRING); STRING is an INT16 length and UTF-8."""
    def string(data: bytes, at: int) -> Tuple[str, int]:
        (n,) = struct.unpack_from(">h", data, at)
        return data[at + 2:at + 2 + n].decode(), at + 2 + n
    group, at = string(key, 0)
    topic, at = string(key, at)
    (partition,) = struct.unpack_from(">i", key, at)
    version, upstream, downstream = struct.unpack_from(">hqq", value, 0)
    assert version == 0
    metadata, _ = string(value, 18)
    return group, topic, partition, upstream, downstream, metadata


def test_a_mirror_killed_mid_stream_resumes_with_every_record_once_and_in_order(broker_factory, mirrors):
    source = broker_factory("per-core", 2)
    target = broker_factory("per-core", 2)
    topic = source.create_topic(unique_topic("orders"), partitions=4)
    total = 30_000
    writer = threading.Thread(target=produce, args=(source.bootstrap, topic, total, 6000.0))
    writer.start()
    # A static member (--instance-id): each restart takes the partitions
    # back at once, not after the dead process's session.
    mirror = mirrors(source, target, "--source-alias", "east", "--target-alias", "west", "--topics", topic,
                     "--instance-id", "east-west-1")
    kills = 0
    for pause in (1.5, 1.0, 2.0):
        time.sleep(pause)
        mirror.kill()
        kills += 1
        mirror.start()
    writer.join()
    expected = read_all(source.bootstrap, topic, 4)
    assert sum(len(v) for v in expected.values()) == total
    mirrored = f"east.{topic}"
    wait_until(lambda: sum(end_offsets(target.bootstrap, mirrored, 4)) >= total, 60,
               f"{total} records on {mirrored}", mirror.text)
    got = read_all(target.bootstrap, mirrored, 4)
    for p in range(4):
        assert len(got[p]) == len(expected[p]), f"partition {p}: {len(got[p])} records, source has {len(expected[p])}"
        assert got[p] == expected[p], f"partition {p} differs from the source (order, key, value, headers or time)"
    assert kills == 3
    # The restarts went on from where the target's data ended, not from 0.
    resumed = [int(n) for n in re.findall(r"mirror: copying .*? start=(\d+)", mirror.text())]
    assert any(n > 0 for n in resumed), mirror.text()[-3000:]


def test_a_group_fails_over_to_the_target_rereading_nothing_and_missing_nothing(broker_factory, mirrors):
    source = broker_factory("per-core", 2)
    target = broker_factory("per-core", 2)
    topic = source.create_topic(unique_topic("ledger"), partitions=2)
    # Uncompressed: the copy starts inside a batch, and only an uncompressed
    # batch can be cut there (a compressed one travels whole).
    produce(source.bootstrap, topic, 600, compression="none")
    # The source's log starts at 100 on each partition: source and target
    # offsets differ, so a translation that copied offsets would be caught.
    admin = AdminClient({"bootstrap.servers": source.bootstrap})
    for future in admin.delete_records([TopicPartition(topic, p, 100) for p in range(2)]).values():
        future.result(10)
    produce(source.bootstrap, topic, 1400, start=600, compression="none")
    live = read_all(source.bootstrap, topic, 2)
    remaining = sum(len(v) for v in live.values())
    mirror = mirrors(source, target, "--source-alias", "east", "--target-alias", "west", "--topics", topic,
                     "--checkpoint-interval-ms", "300")
    mirrored = f"east.{topic}"
    wait_until(lambda: sum(end_offsets(target.bootstrap, mirrored, 2)) == remaining, 60, "the copy", mirror.text)

    # The group reads the first half of each partition on the source and
    # commits there.
    group = unique_topic("billing")
    half = {p: len(live[p]) // 2 for p in range(2)}
    c = Consumer({"bootstrap.servers": source.bootstrap, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, p, 100) for p in range(2)])
    seen = {0: 0, 1: 0}
    next_offset = {0: 100, 1: 100}
    deadline = time.time() + 30
    while any(seen[p] < half[p] for p in range(2)) and time.time() < deadline:
        for m in c.consume(200, 1.0):
            if not m.error() and seen[m.partition()] < half[m.partition()]:
                seen[m.partition()] += 1
                next_offset[m.partition()] = m.offset() + 1
    c.commit(offsets=[TopicPartition(topic, p, next_offset[p]) for p in range(2)], asynchronous=False)
    committed = {tp.partition: tp.offset for tp in c.committed([TopicPartition(topic, p) for p in range(2)], 10)}
    c.close()
    assert seen == half and committed == {p: 100 + half[p] for p in range(2)}, (seen, committed)
    read = sum(half.values())

    # The checkpoint, read as MirrorMaker 2's tools read it.
    checkpoints = {}

    def checkpointed() -> bool:
        r = Consumer({"bootstrap.servers": target.bootstrap, "group.id": unique_topic("cp"),
                      "auto.offset.reset": "earliest", "enable.partition.eof": True})
        r.assign([TopicPartition("east.checkpoints.internal", 0, 0)])
        try:
            while True:
                m = r.poll(2.0)
                if m is None or (m.error() and m.error().code() == KafkaError._PARTITION_EOF):
                    break
                if not m.error():
                    g, t, p, up, down, _ = decode_checkpoint(m.key(), m.value())
                    if g == group and t == mirrored:
                        checkpoints[p] = (up, down)
        finally:
            r.close()
        return all(checkpoints.get(p, (None,))[0] == committed[p] for p in range(2))
    wait_until(checkpointed, 30, "checkpoints of the group's commits", mirror.text)

    for p in range(2):
        upstream, downstream = checkpoints[p]
        # Target offset = source offset less the 100 records the source had
        # deleted before the copy began.
        assert downstream == upstream - 100, (p, upstream, downstream)

    out = subprocess.run([str(BIN), "group", "translate-offsets", group, "--source", source.bootstrap,
                          "--target", target.bootstrap, "--source-alias", "east"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = {int(line.split()[1]): (int(line.split()[2]), int(line.split()[3]))
            for line in out.stdout.splitlines()[1:] if line.strip()}
    assert rows == {p: checkpoints[p] for p in checkpoints}, out.stdout

    # The group is not active on the target: the mirror committed there.
    def synced() -> bool:
        probe = Consumer({"bootstrap.servers": target.bootstrap, "group.id": group})
        try:
            got = probe.committed([TopicPartition(mirrored, p) for p in range(2)], 10)
            return all(tp.offset == checkpoints[tp.partition][1] for tp in got)
        finally:
            probe.close()
    wait_until(synced, 30, "the translated offsets on the target group", mirror.text)

    # Fail over: the same group on the target reads exactly the unread half.
    c = Consumer({"bootstrap.servers": target.bootstrap, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    c.subscribe([mirrored])
    after = {0: [], 1: []}
    deadline = time.time() + 30
    quiet_since = None
    while time.time() < deadline:
        batch = [m for m in c.consume(500, 0.5) if not m.error()]
        for m in batch:
            after[m.partition()].append(m.value())
        if sum(map(len, after.values())) >= remaining - read:
            quiet_since = quiet_since or time.time()
            if time.time() - quiet_since > 1.5:
                break
    c.close()
    for p in range(2):
        unread = [row[1] for row in live[p]][committed[p] - 100:]
        assert after[p] == unread, f"partition {p}: re-read or missed records after failover"


def test_two_way_mirroring_does_not_loop(broker_factory, mirrors):
    east = broker_factory("per-core", 2)
    west = broker_factory("per-core", 2)
    topic = unique_topic("events")
    east.create_topic(topic, partitions=2)
    west.create_topic(topic, partitions=2)
    produce(east.bootstrap, topic, 300)
    produce(west.bootstrap, topic, 200)
    forward = mirrors(east, west, "--source-alias", "east", "--target-alias", "west", "--refresh-ms", "500")
    back = mirrors(west, east, "--source-alias", "west", "--target-alias", "east", "--refresh-ms", "500")
    log = lambda: forward.text() + back.text()  # noqa: E731
    wait_until(lambda: sum(end_offsets(west.bootstrap, f"east.{topic}", 2)) == 300, 60, "east -> west", log)
    wait_until(lambda: sum(end_offsets(east.bootstrap, f"west.{topic}", 2)) == 200, 60, "west -> east", log)
    # Heartbeats travel too (they tell a cluster where its data comes from).
    wait_until(lambda: "east.heartbeats" in topics_of(west.bootstrap), 30, "east.heartbeats on west", log)
    time.sleep(3)  # several refreshes: a loop would have made its topics by now
    for cluster in (east, west):
        names = topics_of(cluster.bootstrap)
        looped = [n for n in names if n.startswith("east.west.") or n.startswith("west.east.")]
        assert not looped, f"mirrored back: {looped}"
    assert sum(end_offsets(west.bootstrap, f"east.{topic}", 2)) == 300
    assert sum(end_offsets(east.bootstrap, f"west.{topic}", 2)) == 200
    assert sum(end_offsets(east.bootstrap, topic, 2)) == 300, "the source topic itself got records back"


def test_partitions_and_configs_added_on_the_source_appear_on_the_target(broker_factory, mirrors):
    source = broker_factory("per-core", 2)
    target = broker_factory("per-core", 2)
    topic = source.create_topic(unique_topic("grow"), partitions=2, configs=["retention.ms=3600000"])
    produce(source.bootstrap, topic, 100)
    mirror = mirrors(source, target, "--source-alias", "east", "--topics", topic, "--refresh-ms", "500",
                     "--metrics-port", "0")
    mirrored = f"east.{topic}"
    wait_until(lambda: topics_of(target.bootstrap).get(mirrored) == 2, 30, "the target topic", mirror.text)
    configs = target.cli("topic", "describe", mirrored, "-b", target.bootstrap).stdout
    assert "retention.ms=3600000" in configs.replace(" ", "").replace(":", "=").replace("\t", ""), configs
    admin = AdminClient({"bootstrap.servers": source.bootstrap})
    for future in admin.create_partitions([NewPartitions(topic, 5)]).values():
        future.result(10)
    p = Producer({"bootstrap.servers": source.bootstrap})
    for partition in (2, 3, 4):
        p.produce(topic, value=f"new-{partition}".encode(), partition=partition)
    assert p.flush(10) == 0
    wait_until(lambda: topics_of(target.bootstrap).get(mirrored) == 5, 30, "5 partitions on the target", mirror.text)
    wait_until(lambda: end_offsets(target.bootstrap, mirrored, 5)[2:] == [1, 1, 1], 30, "the new partitions' records",
               mirror.text)
    got = read_all(target.bootstrap, mirrored, 5)
    assert [got[p][0][1] for p in (2, 3, 4)] == [b"new-2", b"new-3", b"new-4"]

    # The metrics, as a scraper reads them.
    port = int(re.search(r"mirror metrics on port (\d+)", mirror.text()).group(1))
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    copied = re.search(r"^shardlog_mirror_records_total (\d+)", metrics, re.M)
    assert copied and int(copied.group(1)) == 103, metrics
    lags = re.findall(rf'^shardlog_mirror_lag_records{{[^}}]*topic="{topic}"[^}}]*}} (-?\d+)', metrics, re.M)
    assert lags == ["0"] * 5, metrics
    batches = re.search(r"^shardlog_mirror_replication_latency_seconds_count (\d+)", metrics, re.M)
    assert batches and int(batches.group(1)) >= 5, metrics
    status = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/status", timeout=10).read())
    assert sorted((row["partition"], row["lag"]) for row in status["partitions"]) == [(p, 0) for p in range(5)]
    source.cli("topic", "alter", topic, "--set", "retention.ms=7200000", "-b", source.bootstrap)
    wait_until(lambda: "7200000" in target.cli("topic", "describe", mirrored, "-b", target.bootstrap).stdout, 60,
               "the changed config on the target", mirror.text)


def mirror_status(mirror: Mirror) -> dict:
    port = int(re.search(r"mirror metrics on port (\d+)", mirror.text()).group(1))
    return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/status", timeout=10).read())


def test_mirrors_of_one_name_share_the_partitions_and_take_over_a_dead_ones_share(broker_factory, mirrors):
    source = broker_factory("per-core", 2)
    target = broker_factory("per-core", 2)
    topic = source.create_topic(unique_topic("shared"), partitions=6)
    total = 24_000
    writer = threading.Thread(target=produce, args=(source.bootstrap, topic, total, 1500.0))
    writer.start()
    flags = ("--source-alias", "east", "--topics", topic, "--name", "pair", "--metrics-port", "0")
    first = mirrors(source, target, *flags)
    second = mirrors(source, target, *flags)
    log = lambda: first.text() + second.text()  # noqa: E731

    def shares():
        return [{row["partition"] for row in mirror_status(m)["partitions"]} for m in (first, second)]

    def split() -> bool:
        a, b = shares()
        return len(a) == 3 and len(b) == 3 and a | b == set(range(6))
    wait_until(split, 60, "the six partitions split between the two mirrors", log)
    mirrored = f"east.{topic}"
    wait_until(lambda: sum(end_offsets(target.bootstrap, mirrored, 6)) > total // 4, 60, "copying", log)
    first.kill()
    survivor = lambda: {row["partition"] for row in mirror_status(second)["partitions"]}  # noqa: E731
    wait_until(lambda: survivor() == set(range(6)), 60, "the survivor taking over the dead mirror's share", log)
    writer.join()
    expected = read_all(source.bootstrap, topic, 6)
    wait_until(lambda: sum(end_offsets(target.bootstrap, mirrored, 6)) >= total, 60, f"{total} records", log)
    got = read_all(target.bootstrap, mirrored, 6)
    for p in range(6):
        assert got[p] == expected[p], f"partition {p}: {len(got[p])} records on the target, {len(expected[p])} on the source"
