"""confluent-kafka (librdkafka) against a real shardlog broker.

Producers use partitioner=murmur2_random so the expected partition of every
keyed record is computed independently (Java-compatible murmur2) and checked
against both the delivery report and what is read back.
"""

import threading
import time

import pytest
from confluent_kafka import (OFFSET_BEGINNING, KafkaError, KafkaException,
                             Producer, TopicPartition)
from confluent_kafka.admin import (AdminClient, AlterConfigOpType,
                                   ConfigEntry, ConfigResource, NewPartitions,
                                   NewTopic)

from conftest import (NUM_RECORDS, PARTITIONS, assert_partitions_match,
                      ck_read_topic, expected_by_partition, make_records,
                      murmur2_partition, unique_topic)

PRODUCE_VARIANTS = {
    "acks1": {"acks": "1"},
    "acksall": {"acks": "all"},
    "idempotent": {"enable.idempotence": True},
}


def ck_produce(broker, topic, records, **conf):
    """Produce `records` in order; returns [(partition, offset)] per record from delivery reports."""
    cfg = {
        "bootstrap.servers": broker.bootstrap,
        "partitioner": "murmur2_random",
        "linger.ms": 5,
        "message.timeout.ms": 60000,
    }
    cfg.update(conf)
    p = Producer(cfg)
    reports = [None] * len(records)
    errors = []

    def on_delivery(i):
        def cb(err, msg):
            if err is not None:
                errors.append((i, err))
            else:
                reports[i] = (msg.partition(), msg.offset())
        return cb

    for i, r in enumerate(records):
        while True:
            try:
                p.produce(topic, key=r.key, value=r.value, headers=list(r.headers), on_delivery=on_delivery(i))
                break
            except BufferError:
                p.poll(0.05)
        if i % 500 == 0:
            p.poll(0)
    remaining = p.flush(90)
    assert remaining == 0, f"{remaining} records still undelivered after flush"
    assert not errors, f"{len(errors)} delivery errors, first: {errors[:5]}"
    assert all(rep is not None for rep in reports)
    return reports


def check_reports(records, reports):
    """Delivery reports name the murmur2 partition and contiguous offsets in send order."""
    next_offset = {p: None for p in range(PARTITIONS)}
    for r, (part, off) in zip(records, reports):
        assert part == murmur2_partition(r.key), f"{r.key!r} went to {part}"
        if next_offset[part] is not None:
            assert off == next_offset[part], f"partition {part}: offset {off}, expected {next_offset[part]}"
        next_offset[part] = off + 1


def watermarks(ck_consumer, broker, topic):
    c = ck_consumer(broker)
    return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(PARTITIONS)}


def roundtrip(broker, ck_consumer, records, **producer_conf):
    topic = broker.create_topic(unique_topic("ck"))
    reports = ck_produce(broker, topic, records, **producer_conf)
    check_reports(records, reports)
    consumed = ck_read_topic(ck_consumer, broker, topic, len(records))
    expected = expected_by_partition(records, murmur2_partition)
    assert_partitions_match(expected, consumed)
    # Consumed offsets are the acknowledged ones.
    acked = {(p, o) for p, o in reports}
    assert {(c.partition, c.offset) for c in consumed} == acked
    # ListOffsets agrees with what was written.
    wm = watermarks(ck_consumer, broker, topic)
    for p in range(PARTITIONS):
        assert wm[p] == (0, len(expected[p])), f"partition {p} watermarks {wm[p]}"
    return topic


@pytest.mark.parametrize("variant", list(PRODUCE_VARIANTS))
def test_roundtrip(broker, ck_consumer, variant):
    roundtrip(broker, ck_consumer, make_records(NUM_RECORDS, seed=11), **PRODUCE_VARIANTS[variant])


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compression(broker, ck_consumer, codec):
    roundtrip(broker, ck_consumer, make_records(NUM_RECORDS, seed=12, text_only=True),
              **{"acks": "all", "compression.type": codec, "linger.ms": 20})


def test_restart_between_produce_and_consume(broker, ck_consumer):
    """Everything acknowledged with acks=all is readable after a clean restart."""
    records = make_records(NUM_RECORDS, seed=13)
    topic = broker.create_topic(unique_topic("ck-restart"))
    reports = ck_produce(broker, topic, records, acks="all")
    broker.restart()
    consumed = ck_read_topic(ck_consumer, broker, topic, len(records))
    assert_partitions_match(expected_by_partition(records, murmur2_partition), consumed)
    assert {(c.partition, c.offset) for c in consumed} == set(reports)


def test_sigkill_keeps_acknowledged_records(broker2, ck_consumer):
    """Records acknowledged with acks=all are all read back, at their offsets,
    after a kill -9 and a restart, and the log appends after them.

    A kill -9 cannot tell whether they were fdatasynced: the kernel keeps what
    it accepted. Durability across power loss (an fdatasync completed before
    each answer under flush=always) is checked in tests/operability.rs,
    flush_always_answers_each_produce_after_an_fsync_of_its_own."""
    records = make_records(3000, seed=14)
    topic = broker2.create_topic(unique_topic("ck-kill"))
    reports = ck_produce(broker2, topic, records, acks="all")
    broker2.kill()
    broker2.start()
    consumed = ck_read_topic(ck_consumer, broker2, topic, len(records))
    assert_partitions_match(expected_by_partition(records, murmur2_partition), consumed)
    assert {(c.partition, c.offset) for c in consumed} == set(reports)
    # The log is still appendable after recovery, at the next offsets.
    more = make_records(600, seed=15)
    reports2 = ck_produce(broker2, topic, more, acks="all")
    counts = {p: 0 for p in range(PARTITIONS)}
    for r in records:
        counts[murmur2_partition(r.key)] += 1
    for r, (p, o) in zip(more, reports2):
        assert o == counts[p], f"after recovery partition {p} appended at {o}, expected {counts[p]}"
        counts[p] += 1


def test_idempotent_producer_across_restart(broker2, ck_consumer):
    """An idempotent producer keeps sending while the broker restarts: every
    record ends up exactly once, in order, with nothing lost."""
    records = make_records(6000, seed=16)
    topic = broker2.create_topic(unique_topic("ck-idem-restart"))
    p = Producer({
        "bootstrap.servers": broker2.bootstrap,
        "partitioner": "murmur2_random",
        "enable.idempotence": True,
        "linger.ms": 2,
        "message.timeout.ms": 60000,
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 500,
    })
    errors = []

    def cb(err, msg):
        if err is not None:
            errors.append(err)

    restarted = threading.Event()

    def restart_later():
        time.sleep(0.3)
        broker2.restart()
        restarted.set()

    t = threading.Thread(target=restart_later)
    t.start()
    try:
        for i, r in enumerate(records):
            while True:
                try:
                    p.produce(topic, key=r.key, value=r.value, headers=list(r.headers), on_delivery=cb)
                    break
                except BufferError:
                    p.poll(0.05)
            if i % 100 == 0:
                p.poll(0)
                time.sleep(0.01)  # spread production over the restart
    finally:
        t.join()
    remaining = p.flush(90)
    assert restarted.is_set()
    assert remaining == 0
    assert not errors, f"{len(errors)} delivery errors: {errors[:5]}"
    consumed = ck_read_topic(ck_consumer, broker2, topic, len(records))
    assert_partitions_match(expected_by_partition(records, murmur2_partition), consumed)


def test_init_transactions_fails_fast_and_idempotence_still_works(broker2, ck_consumer):
    """Transactions are not supported: init_transactions fails at once with a
    fatal error saying so (not after its whole timeout with _TIMED_OUT), and
    an idempotent producer that starts afterwards works as before."""
    transactional = Producer({
        "bootstrap.servers": broker2.bootstrap,
        "transactional.id": unique_topic("ck-txn"),
    })
    started = time.monotonic()
    with pytest.raises(KafkaException) as raised:
        transactional.init_transactions(10)
    elapsed = time.monotonic() - started
    error = raised.value.args[0]
    assert elapsed < 3, f"init_transactions took {elapsed:.1f}s to fail: {error}"
    assert error.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, error
    assert error.fatal() and not error.retriable(), error
    assert "transactions are not supported by shardlog" in error.str(), error

    records = make_records(1000, seed=18)
    roundtrip(broker2, ck_consumer, records, **{"enable.idempotence": True})


def test_admin(broker2, ck_consumer):
    admin = AdminClient({"bootstrap.servers": broker2.bootstrap})
    topic = unique_topic("ck-admin")

    # CreateTopics with a config override.
    futs = admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1,
                                         config={"retention.ms": "3600000"})], operation_timeout=10)
    futs[topic].result(15)
    with pytest.raises(KafkaException) as exc:
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(15)
    assert exc.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS

    # Metadata / list.
    md = admin.list_topics(timeout=10)
    assert topic in md.topics
    tmd = md.topics[topic]
    assert tmd.error is None
    assert sorted(tmd.partitions) == list(range(PARTITIONS))
    assert {b.id for b in md.brokers.values()} == {0, 1}
    for pmd in tmd.partitions.values():
        assert pmd.leader in (0, 1)

    # DescribeConfigs.
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([res])[res].result(15)
    assert configs["retention.ms"].value == "3600000"
    assert "cleanup.policy" in configs or "segment.bytes" in configs

    # IncrementalAlterConfigs, then DescribeConfigs sees it.
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(15)
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    assert admin.describe_configs([res])[res].result(15)["retention.ms"].value == "7200000"

    # CreatePartitions.
    admin.create_partitions([NewPartitions(topic, 8)])[topic].result(15)
    deadline = time.monotonic() + 10
    while len(admin.list_topics(topic, timeout=10).topics[topic].partitions) != 8:
        assert time.monotonic() < deadline, "partition count did not reach 8"
        time.sleep(0.1)

    # DeleteTopics.
    admin.delete_topics([topic], operation_timeout=10)[topic].result(15)
    deadline = time.monotonic() + 10
    while topic in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, "deleted topic still listed"
        time.sleep(0.1)


def test_acks0_roundtrip(broker2, ck_consumer):
    """acks=0: no offsets come back, but on a healthy broker nothing is lost."""
    records = make_records(NUM_RECORDS, seed=17)
    topic = broker2.create_topic(unique_topic("ck-acks0"))
    reports = ck_produce(broker2, topic, records, acks="0")
    assert all(p == murmur2_partition(r.key) for r, (p, _) in zip(records, reports))
    consumed = ck_read_topic(ck_consumer, broker2, topic, len(records))
    assert_partitions_match(expected_by_partition(records, murmur2_partition), consumed)


def test_null_keys_values_and_tombstones(broker2, ck_consumer):
    """Null keys, null values (tombstones), empty keys/values and no headers round-trip."""
    topic = broker2.create_topic(unique_topic("ck-nulls"), partitions=1)
    p = Producer({"bootstrap.servers": broker2.bootstrap, "acks": "all"})
    cases = [(None, b"v0", None), (b"k1", None, None), (b"", b"", None), (None, None, [("h", None)]),
             (b"k4", b"v4", [("h", b"")])]
    for k, v, h in cases:
        p.produce(topic, key=k, value=v, headers=h, partition=0)
    assert p.flush(30) == 0
    got = ck_read_topic(ck_consumer, broker2, topic, len(cases), partitions=1)
    assert [(c.offset, c.key, c.value) for c in got] == [(i, k, v) for i, (k, v, _) in enumerate(cases)]
    assert [c.headers for c in got] == [(), (), (), (("h", None),), (("h", b""),)]


def test_fetch_edge_cases(broker2, ck_consumer):
    """Seek into the middle of compressed batches, tiny fetch sizes, large records,
    OffsetsForTimes and DeleteRecords with the low watermark."""
    from confluent_kafka.admin import OffsetSpec

    topic = broker2.create_topic(unique_topic("ck-fetch"), partitions=2)
    p = Producer({"bootstrap.servers": broker2.bootstrap, "acks": "all", "compression.type": "lz4",
                  "linger.ms": 50, "batch.num.messages": 100})
    values = [f"v{i}-".encode() + b"x" * (i % 50) for i in range(1000)]
    t0 = int(time.time() * 1000)
    for i, v in enumerate(values):
        p.produce(topic, key=b"k", value=v, partition=0, timestamp=t0 + i)
    big = [bytes([i]) * (300_000 + i) for i in range(3)]
    for v in big:
        p.produce(topic, value=v, partition=1)
    assert p.flush(30) == 0

    # Start in the middle of a compressed batch: records before the offset are skipped.
    c = ck_consumer(broker2, assign=[TopicPartition(topic, 0, 537)])
    got = ck_consume_partition(c, 1000 - 537)
    assert [m.offset() for m in got] == list(range(537, 1000))
    assert [m.value() for m in got] == values[537:]

    # Tiny fetch limits still make progress (a whole first batch is returned).
    c = ck_consumer(broker2, assign=[TopicPartition(topic, 1, OFFSET_BEGINNING)],
                    **{"fetch.max.bytes": 1024, "max.partition.fetch.bytes": 1024,
                       "message.max.bytes": 1000})
    got = ck_consume_partition(c, 3)
    assert [m.value() for m in got] == big

    # OffsetsForTimes: the first record with timestamp >= t.
    c = ck_consumer(broker2)
    [tp] = c.offsets_for_times([TopicPartition(topic, 0, t0 + 700)], timeout=10)
    assert tp.error is None and tp.offset == 700
    [tp] = c.offsets_for_times([TopicPartition(topic, 0, t0 + 10_000_000)], timeout=10)
    assert tp.offset in (-1, 1000)  # past the last timestamp: "none" (-1) / end

    # DeleteRecords moves the low watermark; reading from the beginning starts there.
    admin = AdminClient({"bootstrap.servers": broker2.bootstrap})
    fut = admin.delete_records([TopicPartition(topic, 0, 400)])
    [res] = list(fut.values())
    assert res.result(15).low_watermark == 400
    lo = admin.list_offsets({TopicPartition(topic, 0): OffsetSpec.earliest()})
    assert list(lo.values())[0].result(15).offset == 400
    assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (400, 1000)
    c2 = ck_consumer(broker2, assign=[TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got = ck_consume_partition(c2, 600)
    assert [m.offset() for m in got] == list(range(400, 1000))
    assert [m.value() for m in got] == values[400:]


def ck_consume_partition(consumer, count, timeout=30.0):
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        for m in consumer.consume(num_messages=500, timeout=0.5):
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise AssertionError(f"consumer error: {m.error()}")
            out.append(m)
    assert len(out) == count, f"consumed {len(out)}/{count}"
    return out
