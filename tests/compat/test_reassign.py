"""Moving partitions between machines (issue 30, item 10) with real clients.

Three machines of one cluster, two cores each. kafkajs moves a replicated
partition to another machine with AlterPartitionReassignments and follows it
with ListPartitionReassignments until it is done; `shardlog cluster drain`
empties a machine (through the same API), after which it holds no replica
and `shardlog cluster unregister` removes it once stopped. confluent-kafka
produces with acks=all before, and reads every record back once after.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter

import pytest

from conftest import BIN, ck_read_topic, start_machines, unique_topic
from test_cluster import machine_of_port
from test_kafkajs import NODE, run_js

MACHINES = 3
CORES = 2


@pytest.fixture
def cluster(tmp_path):
    """Three machines, each with its /v1/status endpoint on the port after
    its controller port."""
    machines = start_machines(tmp_path, MACHINES, CORES,
                              lambda i, base: ["--metrics-port", str(base + CORES + 1)], spare_ports=1)
    yield machines
    for m in machines:
        if m.running():
            assert m.stop() == 0, m.log_tail()


def replicas_of(admin, topic):
    md = admin.list_topics(topic, timeout=10).topics[topic]
    return {p.id: (list(p.replicas), list(p.isrs), p.leader) for p in md.partitions.values()}


def wait_replicas(admin, topic, ready, what, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        now = replicas_of(admin, topic)
        if ready(now):
            return now
        assert time.monotonic() < deadline, f"{what}: {now}"
        time.sleep(0.2)


def test_a_partition_moves_to_another_machine_and_a_drained_machine_holds_nothing(cluster, ck_consumer, tmp_path):
    if NODE is None:
        pytest.fail("node is not installed", pytrace=False)
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    bootstrap = ",".join(m.bootstrap for m in cluster)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = unique_topic("moving")
    admin.create_topics([NewTopic(topic, 2, replication_factor=2)])[topic].result(timeout=30)
    placed = wait_replicas(admin, topic, lambda r: all(len(isr) == 2 for _, isr, _ in r.values()), "in sync")
    brokers = admin.list_topics(timeout=10).brokers

    def machine_of(node):
        return machine_of_port(cluster, brokers[node].port)

    total = 300
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5})
    for i in range(total):
        producer.produce(topic, value=f"v{i}".encode(), partition=i % 2)
    assert producer.flush(60) == 0

    # kafkajs moves partition 0's first replica to the machine without one.
    replicas, _, _ = placed[0]
    used = {machine_of(n) for n in replicas}
    free_machine = next(i + 1 for i in range(MACHINES) if i + 1 not in used)
    new_node = next(n for n in brokers if machine_of(n) == free_machine)
    target = [new_node, replicas[1]]
    out = run_js(tmp_path, "reassign", dict(brokers=[cluster[0].bootstrap], topic=topic, partition=0,
                                            replicas=target))
    assert "ok" in out["altered"], out["altered"]
    assert out["done"], f"the move did not finish: {out}"
    assert "INVALID_REPLICA_ASSIGNMENT" in json.dumps(out["badNode"]), out["badNode"]
    moved = wait_replicas(admin, topic, lambda r: r[0][0] == target and sorted(r[0][1]) == sorted(target),
                          "partition 0 on its new replicas")
    assert moved[0][2] in target, "the leader is one of the new replicas"

    # Drain the machine that leads partition 1.
    drained = machine_of(replicas_of(admin, topic)[1][2])
    node = next(n for n in brokers if machine_of(n) == drained)
    host = cluster[drained - 1]
    metrics_port = host.port + CORES + 1
    drain = subprocess.run([str(BIN), "cluster", "drain", str(node), "--wait", "60",
                            "--metrics-port", str(metrics_port), "--brokers", host.bootstrap],
                           capture_output=True, text=True, timeout=90)
    assert drain.returncode == 0, drain.stdout + drain.stderr
    after = wait_replicas(admin, topic, lambda r: all(machine_of(n) != drained for reps, _, _ in r.values()
                                                      for n in reps), "nothing on the drained machine")
    for p, (reps, isr, leader) in after.items():
        assert len({machine_of(n) for n in reps}) == 2, f"partition {p}: two replicas on two machines: {reps}"
        assert sorted(isr) == sorted(reps) and leader in reps, after
    deadline = time.monotonic() + 20
    while any(d.name.startswith(topic) for d in host.data_dir.iterdir()):
        assert time.monotonic() < deadline, sorted(d.name for d in host.data_dir.iterdir())
        time.sleep(0.2)

    # Stopped, the drained machine is removed for good.
    assert host.stop() == 0
    survivor = next(m for i, m in enumerate(cluster) if i + 1 != drained)
    deadline = time.monotonic() + 20
    while True:
        gone = subprocess.run([str(BIN), "cluster", "unregister", str(node), "--brokers", survivor.bootstrap],
                              capture_output=True, text=True, timeout=30)
        if gone.returncode == 0:
            break
        assert time.monotonic() < deadline, gone.stdout + gone.stderr
        time.sleep(0.5)

    consumed = ck_read_topic(ck_consumer, survivor, topic, total, partitions=2)
    values = Counter(c.value for c in consumed)
    assert set(values) == {f"v{i}".encode() for i in range(total)} and max(values.values()) == 1
