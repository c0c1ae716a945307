"""kafka-python (pure-Python client) against a real shardlog broker.

kafka-python's default partitioner is Java-compatible murmur2, so the expected
partition of every keyed record is computed independently.
"""

import re
import time
import urllib.request

import pytest
from kafka import KafkaProducer, TopicPartition
from kafka.admin import (ConfigResource, ConfigResourceType, KafkaAdminClient,
                         NewPartitions, NewTopic)
from kafka.codec import has_lz4, has_snappy, has_zstd
from kafka.errors import TopicAlreadyExistsError

from conftest import (NUM_RECORDS, PARTITIONS, Consumed,
                      assert_partitions_match, expected_by_partition,
                      make_records, murmur2_partition, pick_ports,
                      unique_topic)

PRODUCE_VARIANTS = {
    "acks1": dict(acks=1, enable_idempotence=False),
    "acksall": dict(acks="all", enable_idempotence=False),
    "idempotent": dict(acks="all", enable_idempotence=True),
}


def kp_produce(broker, topic, records, **conf):
    """Produce in order; returns [(partition, offset)] per record."""
    cfg = dict(bootstrap_servers=broker.bootstrap, linger_ms=5, request_timeout_ms=30000,
               max_block_ms=30000)
    cfg.update(conf)
    p = KafkaProducer(**cfg)
    try:
        futures = [p.send(topic, key=r.key, value=r.value, headers=list(r.headers)) for r in records]
        p.flush(timeout=90)
        reports = []
        for i, f in enumerate(futures):
            md = f.get(timeout=30)
            reports.append((md.partition, md.offset))
    finally:
        p.close(timeout=10)
    return reports


def kp_read_topic(kp_consumer, broker, topic, expected_count, partitions=PARTITIONS, timeout=60.0):
    """Manual assignment (no group), from the beginning, until every partition's end offset."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    c = kp_consumer(broker, assign=tps)
    end = c.end_offsets(tps)
    out = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for tp, msgs in c.poll(timeout_ms=500, max_records=2000).items():
            assert tp.topic == topic
            for m in msgs:
                out.append(Consumed(m.partition, m.offset, m.key, m.value, tuple(m.headers or ())))
        if len(out) >= expected_count and all(c.position(tp) >= end[tp] for tp in tps):
            break
    else:
        raise AssertionError(f"timed out: consumed {len(out)}/{expected_count}")
    # Nothing more arrives past the end.
    extra = c.poll(timeout_ms=300)
    assert not any(extra.values()), f"unexpected extra records: {extra}"
    return out, end


def roundtrip(broker, kp_consumer, records, **conf):
    topic = broker.create_topic(unique_topic("kp"))
    reports = kp_produce(broker, topic, records, **conf)
    for r, (p, _) in zip(records, reports):
        assert p == murmur2_partition(r.key)
    expected = expected_by_partition(records, murmur2_partition)
    consumed, end = kp_read_topic(kp_consumer, broker, topic, len(records))
    assert_partitions_match(expected, consumed)
    assert {(c.partition, c.offset) for c in consumed} == set(reports)
    assert {tp.partition: off for tp, off in end.items()} == {p: len(expected[p]) for p in range(PARTITIONS)}


@pytest.mark.parametrize("variant", list(PRODUCE_VARIANTS))
def test_roundtrip(broker, kp_consumer, variant):
    roundtrip(broker, kp_consumer, make_records(NUM_RECORDS, seed=21), **PRODUCE_VARIANTS[variant])


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compression(broker, kp_consumer, codec):
    # A missing codec library must fail the suite, not skip it.
    assert {"snappy": has_snappy, "lz4": has_lz4, "zstd": has_zstd}.get(codec, lambda: True)(), \
        f"kafka-python has no {codec} support installed (see tests/compat/requirements.txt)"
    roundtrip(broker, kp_consumer, make_records(NUM_RECORDS, seed=22, text_only=True),
              acks="all", compression_type=codec, linger_ms=20)


def test_restart_between_produce_and_consume(broker, kp_consumer):
    records = make_records(NUM_RECORDS, seed=23)
    topic = broker.create_topic(unique_topic("kp-restart"))
    reports = kp_produce(broker, topic, records, acks="all")
    broker.restart()
    consumed, _ = kp_read_topic(kp_consumer, broker, topic, len(records))
    assert_partitions_match(expected_by_partition(records, murmur2_partition), consumed)
    assert {(c.partition, c.offset) for c in consumed} == set(reports)


def fetch_session_counts(metrics_port):
    """Fetch requests by session kind, summed over cores, from /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    counts = {"sessionless": 0, "full": 0, "incremental": 0}
    for kind, value in re.findall(
            r'^shardlog_fetch_requests_by_session_total\{core="\d+",kind="(\w+)"\} (\d+)', text, re.M):
        counts[kind] += int(value)
    return counts


def test_consumer_reads_through_an_incremental_fetch_session(broker_factory, kp_consumer):
    """kafka-python opens a fetch session (KIP-227) and polls incrementally;
    records produced while it polls arrive exactly once and in order."""
    metrics_port = pick_ports(1)
    broker = broker_factory("per-core", 2, extra_args=["--metrics-port", str(metrics_port)])
    partitions = 64
    topic = broker.create_topic(unique_topic("kp-session"), partitions=partitions)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer = kp_consumer(broker, assign=tps)
    assert consumer.poll(timeout_ms=500) == {}
    before = fetch_session_counts(metrics_port)

    def partition_of(key):
        return murmur2_partition(key, partitions)

    records = make_records(2_000, seed=24)
    reports = []
    consumed = []
    # Two rounds: each produces while the consumer's session is open.
    for half in (records[:1_000], records[1_000:]):
        reports += kp_produce(broker, topic, half, acks=1)
        deadline = time.monotonic() + 60
        while len(consumed) < len(reports) and time.monotonic() < deadline:
            for tp, msgs in consumer.poll(timeout_ms=500, max_records=5_000).items():
                consumed += [Consumed(m.partition, m.offset, m.key, m.value, tuple(m.headers or ())) for m in msgs]
        assert len(consumed) == len(reports), f"consumed {len(consumed)}/{len(reports)}"
    assert not any(consumer.poll(timeout_ms=300).values())
    assert_partitions_match(expected_by_partition(records, partition_of, partitions), consumed)
    assert {(c.partition, c.offset) for c in consumed} == set(reports)
    after = fetch_session_counts(metrics_port)
    incremental = after["incremental"] - before["incremental"]
    # One session per node (core), opened by the first poll; every later
    # fetch is incremental (a refused epoch would make the client reopen).
    assert before["full"] >= 1 and after["full"] == before["full"], f"sessions reopened: {before} -> {after}"
    assert incremental >= 4, f"the consumer polled without a fetch session: {before} -> {after}"


def test_admin(broker2):
    admin = KafkaAdminClient(bootstrap_servers=broker2.bootstrap, request_timeout_ms=15000)
    try:
        topic = unique_topic("kp-admin")
        res = admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1,
                                            topic_configs={"retention.ms": "3600000"})])
        assert [t["error_code"] for t in res["topics"]] == [0]
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])

        assert topic in admin.list_topics()
        [desc] = admin.describe_topics([topic])
        assert desc["error_code"] == 0 and desc["name"] == topic
        assert sorted(p["partition_index"] for p in desc["partitions"]) == list(range(PARTITIONS))
        cluster = admin.describe_cluster()
        assert sorted(b["broker_id"] for b in cluster["brokers"]) == [0, 1]
        assert {p["leader_id"] for p in desc["partitions"]} <= {0, 1}

        cfg = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        assert cfg["topic"][topic]["retention.ms"]["value"] == "3600000"
        everything = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all")
        assert "cleanup.policy" in everything["topic"][topic]

        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs={"retention.ms": "7200000"})])
        cfg = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        assert cfg["topic"][topic]["retention.ms"]["value"] == "7200000"

        admin.create_partitions({topic: NewPartitions(total_count=8)})
        [desc] = admin.describe_topics([topic])
        assert len(desc["partitions"]) == 8

        res = admin.delete_topics([topic])
        assert [t["error_code"] for t in res["topics"]] == [0]
        deadline = time.monotonic() + 10
        while topic in admin.list_topics():
            assert time.monotonic() < deadline, "deleted topic still listed"
            time.sleep(0.1)
    finally:
        admin.close()
