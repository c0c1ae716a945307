"""Acknowledged records survive a full disk, kill -9 and restarts (issue 33).

Real clients (confluent-kafka, idempotent, acks=all), a real broker process,
a real ext4 file system that really fills up, real SIGKILLs. Every record a
delivery report acknowledged at (topic, partition, offset) must be read back
there with its value; the checks live in durability.py, shared with the long
run in tests/durability/kill_loop.py.

Needs root, a loop device and mkfs.ext4 for the full-disk test; without them
it fails and says what is missing. SHARDLOG_TEST_SEED replays a kill loop.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from conftest import Broker, _require_binary, pick_ports, unique_topic
from durability import (KILL_LOOP_PRODUCER_CONFIG, SEED_ENV, AckLog, MissingTool, check_acknowledged,
                        check_dense, check_in_order, check_unique, describe_problems, flush, free_bytes,
                        idempotent_producer_config, kill9, loop_mounted_ext4, read_partitions, run_kill_loop,
                        seed_from_env, stop_quietly)

DISK_SIZE = "300M"
FILL_VALUE_BYTES = 4096
FILLER_SEGMENT_BYTES = 16 * 1024 * 1024
# The disk counts as full once nothing was acknowledged for this long.
FILL_STALL_S = 10.0
FILL_DEADLINE_S = 120.0
# Delivery reports of records the broker cannot store fail after this long.
FILL_MESSAGE_TIMEOUT_MS = 20000
RESUME_RECORDS = 2000
# The same producer goes on after the clean restart (a stale producer snapshot
# answers it OUT_OF_ORDER_SEQUENCE_NUMBER or stores its retries twice).
AFTER_RESTART_RECORDS = 200

KILL_LOOP_KILLS = 20
KILL_LOOP_PARTITIONS = 4


# --------------------------------------------------------------------------
# 1. A full disk
# --------------------------------------------------------------------------

@pytest.fixture
def full_disk_broker(tmp_path):
    """A 2-core broker whose --data is a fresh 300 MB loop-mounted ext4.

    Teardown stops the broker (SIGTERM, then SIGKILL), unmounts the file
    system and detaches the loop device, also when the test failed."""
    _require_binary()
    with contextlib.ExitStack() as stack:
        try:
            mnt = stack.enter_context(loop_mounted_ext4(tmp_path, DISK_SIZE))
        except MissingTool as exc:
            pytest.fail(f"cannot make the {DISK_SIZE} loop-mounted ext4 this test needs: {exc}", pytrace=False)
        data = mnt / "data"
        data.mkdir()
        broker = Broker(listener="per-core", cores=2, data_dir=data, log_path=tmp_path / "broker.log",
                        port=pick_ports(2))
        stack.callback(stop_quietly, broker)
        broker.start()
        yield broker
    keep = os.environ.get("SHARDLOG_TEST_KEEP_LOGS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(broker.log_path, Path(keep) / f"full-disk-{broker.port}.log")
    if "panicked" in broker.log_text():
        pytest.fail(f"broker panicked\n{broker.log_tail(120)}", pytrace=False)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("while_full", ["stay-up", "kill9"])
def test_full_disk_loses_no_acknowledged_record_and_reuses_no_offset(full_disk_broker, while_full):
    """Fill the disk through two topics with an idempotent acks=all producer;
    every acknowledged record stays at its offset (also across a SIGKILL on the
    full disk, variant kill9); deleting the filler topic lets production resume
    at fresh offsets; a clean restart keeps it all, and the same producer goes
    on after it."""
    broker = full_disk_broker
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.create_topics([
        NewTopic("filler", num_partitions=2, replication_factor=1,
                 config={"segment.bytes": str(FILLER_SEGMENT_BYTES)}),
        NewTopic("keep", num_partitions=2, replication_factor=1),
    ], operation_timeout=15)
    for future in futures.values():
        future.result(30)
    acks = AckLog()
    producer = Producer(idempotent_producer_config(
        broker.bootstrap, acks, **{"message.timeout.ms": FILL_MESSAGE_TIMEOUT_MS, "linger.ms": 5}))
    writer = FillWriter(producer, acks)
    flush_timeout_s = FILL_MESSAGE_TIMEOUT_MS / 1000 + 30

    fill_disk(writer, acks, broker.data_dir)
    problems = unflushed_problems(flush(producer, acks, flush_timeout_s))
    print(f"after filling: {acks.summary()}, {free_bytes(broker.data_dir) >> 10} KiB free")
    full_partitions = sorted({(t, p) for t, p, _, _ in acks.failed})
    print(f"partitions refused by the full disk: {full_partitions}")
    if not full_partitions and not acks.fatal:
        problems.append("NOT-FULL the disk never filled: no delivery failed")
    if while_full == "kill9":
        if not acks.fatal and len(full_partitions) < 2:
            problems.append(f"NOT-FULL only {full_partitions} hit the full disk")
        kill9(broker, 1)
        start(broker, f"restarting in place after kill -9 on the full disk ({acks.summary()})")
    verify(f"after filling the disk ({while_full})", broker, acks, {"filler": 2, "keep": 2}, problems)

    admin.delete_topics(["filler"], operation_timeout=30)["filler"].result(60)
    wait_topic_gone(admin, "filler")
    resumed = writer.write_keep(RESUME_RECORDS)
    problems = unflushed_problems(flush(producer, acks, flush_timeout_s))
    problems += not_acknowledged(acks, resumed, "after deleting filler")
    print(f"after deleting filler and producing {RESUME_RECORDS} more: {acks.summary()}, "
          f"{free_bytes(broker.data_dir) >> 10} KiB free")
    verify("after deleting filler and producing more", broker, acks, {"keep": 2}, problems)

    stopped = broker.stop()
    assert stopped == 0, f"broker exited with {stopped} on SIGTERM\n{broker.log_tail()}"
    broker._wait_ports_released()
    start(broker, "restarting after a clean stop")
    verify("after a clean restart", broker, acks, {"keep": 2})
    resumed = writer.write_keep(AFTER_RESTART_RECORDS)
    problems = unflushed_problems(flush(producer, acks, flush_timeout_s))
    problems += not_acknowledged(acks, resumed, "after the clean restart")
    verify("after the clean restart and producing more", broker, acks, {"keep": 2}, problems)


class FillWriter:
    """4 KB self-describing values (`topic/partition/seq/....`), three in four to filler."""

    def __init__(self, producer: Producer, acks: AckLog) -> None:
        self.producer = producer
        self.acks = acks
        self.seq = 0
        self.per_topic: Dict[str, int] = {"filler": 0, "keep": 0}

    def write_one(self, topic: str) -> bytes:
        """Queue one record; raises BufferError when the local queue is full."""
        partition = self.per_topic[topic] % 2
        head = f"{topic}/{partition}/{self.seq}/".encode()
        value = head + b"." * (FILL_VALUE_BYTES - len(head))
        self.producer.produce(topic, value=value, partition=partition)
        self.per_topic[topic] += 1
        self.seq += 1
        return value

    def write_next(self) -> bytes:
        return self.write_one("keep" if self.seq % 4 == 3 else "filler")

    def write_keep(self, count: int) -> set:
        """Queue `count` records to keep; stops early on a fatal producer error."""
        values = set()
        while len(values) < count and not self.acks.fatal:
            try:
                try:
                    values.add(self.write_one("keep"))
                    self.producer.poll(0)
                except BufferError:
                    self.producer.poll(0.05)
            except (KafkaException, SystemError) as exc:
                self.acks.note_exception(exc)
        return values


def fill_disk(writer: FillWriter, acks: AckLog, data_dir: Path) -> None:
    """Write until nothing has been acknowledged for FILL_STALL_S (the disk is
    full) or the producer failed."""
    start = time.monotonic()
    while not acks.fatal:
        try:
            now = time.monotonic()
            if acks.ack_count and now - acks.last_ack_at > FILL_STALL_S:
                return
            if now - start > FILL_DEADLINE_S:
                raise AssertionError(f"the disk did not fill within {FILL_DEADLINE_S}s: {acks.summary()}, "
                                     f"{free_bytes(data_dir) >> 20} MiB free")
            try:
                writer.write_next()
                writer.producer.poll(0)
            except BufferError:
                writer.producer.poll(0.05)
        except (KafkaException, SystemError) as exc:
            acks.note_exception(exc)


def fill_sequence(value: bytes) -> Tuple[int, int]:
    parts = value.split(b"/", 3)
    if len(parts) != 4:
        raise ValueError(value)
    return int(parts[1]), int(parts[2])


def unflushed_problems(unflushed: int) -> List[str]:
    return [f"UNFLUSHED {unflushed} records had no delivery report"] if unflushed else []


def not_acknowledged(acks: AckLog, values: set, when: str) -> List[str]:
    """Production must resume: every one of `values` acknowledged."""
    failed = [(t, p, v[:24], e) for t, p, v, e in acks.failed if v in values]
    acked = sum(1 for v in acks.acked.values() if v in values)
    if acked == len(values) and not failed:
        return []
    return [f"NOT-RESUMED {when}: {acked} of {len(values)} records acknowledged, "
            f"{len(failed)} failed, first {failed[:3]}"]


def verify(stage: str, broker: Broker, acks: AckLog, topics: Dict[str, int], problems: List[str] = ()) -> None:
    """Read each topic whole and check it against the delivery reports; fail
    with everything found (the producer's fatal error included)."""
    problems = list(problems) + list(acks.reused)
    if acks.fatal:
        problems.insert(0, f"FATAL {acks.fatal}")
    for topic, partitions in topics.items():
        contents = read_partitions(broker.bootstrap, topic, partitions)
        problems += check_acknowledged(acks.acked_in(topic), contents)
        problems += check_unique(contents)
        problems += check_in_order(contents, fill_sequence)
        gaps = check_dense(contents)
        acked = sum(len(v) for v in acks.acked_in(topic).values())
        print(f"{stage}: {topic} read {contents.count()} records (watermarks {contents.watermarks}), "
              f"{acked} acknowledged" + (f"; not dense: {gaps}" if gaps else ""))
    assert not problems, f"{stage}: {describe_problems(problems)}\n({acks.summary()})\n{broker.log_tail(20)}"


def start(broker: Broker, stage: str) -> None:
    """broker.start(), its failure message naming the stage."""
    try:
        broker.start()
    except pytest.fail.Exception as exc:
        pytest.fail(f"{stage}: {exc.msg}", pytrace=False)


def wait_topic_gone(admin: AdminClient, topic: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while topic in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"deleted topic {topic} still listed after {timeout_s}s"
        time.sleep(0.2)


# --------------------------------------------------------------------------
# 2. kill -9, again and again
# --------------------------------------------------------------------------

@pytest.mark.timeout(240)
def test_kill9_loop_keeps_every_acknowledged_record(broker_factory):
    """SIGKILL the broker >= 10 times under an idempotent acks=all producer on 4
    partitions; every acknowledged record is at its offset exactly once, offsets
    are dense, nothing is duplicated or reordered, and the producer resumes after
    every restart without a fatal error."""
    seed = seed_from_env()
    replay = f"seed {seed} (replay: {SEED_ENV}={seed})"
    print(replay)
    broker = broker_factory("per-core", 2)
    topic = unique_topic("kill9")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=KILL_LOOP_PARTITIONS, replication_factor=1)],
                        operation_timeout=15)[topic].result(30)
    try:
        result = run_kill_loop(broker, topic, KILL_LOOP_PARTITIONS, KILL_LOOP_KILLS, seed, log=print,
                               **KILL_LOOP_PRODUCER_CONFIG)
    except AssertionError as exc:
        raise AssertionError(f"{replay}: {exc}") from exc
    except pytest.fail.Exception as exc:
        pytest.fail(f"{replay}: {exc.msg}", pytrace=False)
    print(result.describe())
    assert result.kills == KILL_LOOP_KILLS or not result.ok, result.describe()
    assert result.ok, result.describe() + "\n" + broker.log_tail(30)
