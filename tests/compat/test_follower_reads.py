"""Reads from followers (KIP-392, issue 30) with real clients.

Three machines in racks rack-1..rack-3, a topic with three replicas. A
consumer that names a rack (librdkafka `client.rack`, kafka-python
`client_rack`, kafkajs `rackId`) is told by the partition's leader to read
from the in-sync follower in its rack, and reads every record there: the
follower machine's fetched-bytes counter grows, the leader's does not. A
consumer without a rack reads from the leader.
"""

from __future__ import annotations

import time
import urllib.request

import pytest

from conftest import start_machines, unique_topic
from groups_common import Member, kafkajs_problem

MACHINES = 3
CORES = 2
RECORDS = 300


@pytest.fixture
def racked(tmp_path):
    def extra(i, base):
        return ["--rack", f"rack-{i + 1}", "--metrics-port", str(base + CORES + 1),
                "--group-initial-rebalance-delay-ms", "0"]

    machines = start_machines(tmp_path, MACHINES, CORES, extra, spare_ports=1)
    for m in machines:
        m.metrics_port = m.port + CORES + 1
    yield machines
    for m in machines:
        if m.running():
            assert m.stop() == 0, m.log_tail()


def fetched_bytes(machine, topic):
    text = urllib.request.urlopen(f"http://127.0.0.1:{machine.metrics_port}/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("shardlog_topic_fetched_bytes_total{") and f'topic="{topic}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def consume_confluent(bootstrap, topic, rack):
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    conf = {"bootstrap.servers": bootstrap, "group.id": f"r-{time.time_ns()}", "enable.auto.commit": False}
    if rack:
        conf["client.rack"] = rack
    c = Consumer(conf)
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    values = []
    deadline = time.monotonic() + 60
    while len(values) < RECORDS and time.monotonic() < deadline:
        for m in c.consume(num_messages=100, timeout=0.5):
            if m.error() is None:
                values.append(m.value())
    c.close()
    return values


def consume_kafka_python(bootstrap, topic, rack):
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, client_rack=rack or "", enable_auto_commit=False,
                      group_id=None, fetch_max_wait_ms=100)
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    c.seek_to_beginning(tp)
    values = []
    deadline = time.monotonic() + 60
    while len(values) < RECORDS and time.monotonic() < deadline:
        for records in c.poll(timeout_ms=500).values():
            values.extend(r.value for r in records)
    c.close()
    return values


def consume_kafkajs(bootstrap, topic, rack, tmp_path):
    member = Member("kafkajs", bootstrap, f"js-{time.time_ns()}", [topic], "js", tmp_path, rack=rack)
    deadline = time.monotonic() + 60
    try:
        while len(member.records) < RECORDS and time.monotonic() < deadline:
            time.sleep(0.1)
        return [v.encode() if v is not None else None for (_, _, _, v) in member.records]
    finally:
        member.proc.kill()
        member.proc.wait()


@pytest.mark.parametrize("client", ["confluent", "kafka-python", "kafkajs"])
def test_a_consumer_with_a_rack_reads_from_the_in_sync_follower_there(racked, client, tmp_path):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    if client == "kafkajs" and kafkajs_problem():
        pytest.fail(kafkajs_problem())
    topic = unique_topic(f"rack-{client}")
    admin = AdminClient({"bootstrap.servers": racked[0].bootstrap})
    admin.create_topics([NewTopic(topic, 1, replication_factor=3)])[topic].result(timeout=30)
    deadline = time.monotonic() + 30
    while True:
        md = admin.list_topics(topic, timeout=10)
        p = md.topics[topic].partitions[0]
        if len(p.isrs) == 3:
            break
        assert time.monotonic() < deadline, (p.replicas, p.isrs)
        time.sleep(0.1)
    leader_port = md.brokers[p.leader].port
    leader = next(m for m in racked if leader_port in m.ports)
    follower = next(m for m in racked if m is not leader)
    rack = next(a for a in follower.extra_args if a.startswith("rack-"))
    producer = Producer({"bootstrap.servers": racked[0].bootstrap, "acks": "all"})
    for i in range(RECORDS):
        producer.produce(topic, value=f"v{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    time.sleep(1)  # the followers learn the high watermark on their next fetch

    bootstrap = ",".join(m.bootstrap for m in racked)
    before = {id(m): fetched_bytes(m, topic) for m in racked}
    if client == "confluent":
        values = consume_confluent(bootstrap, topic, rack)
    elif client == "kafka-python":
        values = consume_kafka_python(bootstrap, topic, rack)
    else:
        values = consume_kafkajs(bootstrap, topic, rack, tmp_path)
    assert sorted(values) == sorted(f"v{i}".encode() for i in range(RECORDS)), f"{len(values)} records read"
    served = {m.port: fetched_bytes(m, topic) - before[id(m)] for m in racked}
    assert served[follower.port] > 0, f"the follower in {rack} served the reads: {served}"
    assert served[leader.port] == 0, f"the leader sent the consumer away and served nothing: {served}"

    # Without a rack the same client reads from the leader.
    if client == "confluent":
        before_leader = fetched_bytes(leader, topic)
        assert len(consume_confluent(bootstrap, topic, None)) == RECORDS
        assert fetched_bytes(leader, topic) > before_leader
