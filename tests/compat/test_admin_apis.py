"""The admin calls Kafka's admin clients make beyond topics, through real
clients: broker configs (DescribeConfigs, AlterConfigs and
IncrementalAlterConfigs on the BROKER resource), DescribeCluster,
DescribeLogDirs and AlterReplicaLogDirs, explicit replica assignments in
CreateTopics and CreatePartitions, and ListOffsets for a partition that
does not exist.

Clients: kafka-python 3 (which sends DescribeCluster, DescribeLogDirs and
AlterReplicaLogDirs; librdkafka, kafkajs and aiokafka implement neither log-dir
API), confluent-kafka (librdkafka) and kafkajs (tests/compat/kafkajs/
roundtrip.js adminApis). Each broker here is `per-core` with 2 cores: nodes
0 and 1.
"""

import json
import shutil
import subprocess
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry,
                                   ConfigResource, ConfigSource, NewPartitions,
                                   NewTopic, OffsetSpec, ResourceType)
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTopicPartition
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kafka.admin import NewPartitions as KpNewPartitions
from kafka.admin import NewTopic as KpNewTopic
from kafka.errors import (InvalidReplicationAssignmentError, KafkaTimeoutError,
                          LogDirNotFoundError, NoError)

from conftest import COMPAT_DIR, unique_topic

REQUIRED_BROKER_CONFIGS = {
    "broker.id", "listeners", "advertised.listeners", "log.dirs", "num.partitions",
    "default.replication.factor", "min.insync.replicas", "log.retention.ms",
    "log.segment.bytes", "message.max.bytes", "socket.request.max.bytes",
    "auto.create.topics.enable", "group.min.session.timeout.ms",
    "group.max.session.timeout.ms", "group.initial.rebalance.delay.ms",
}
# Kafka's ConfigSource values on the wire.
DYNAMIC_BROKER, DYNAMIC_DEFAULT_BROKER, STATIC_BROKER, DEFAULT = 2, 3, 4, 5
# kafka-python 3 reports sources by name.
SOURCE_NAMES = {DYNAMIC_BROKER: "DYNAMIC_BROKER_CONFIG", DYNAMIC_DEFAULT_BROKER: "DYNAMIC_DEFAULT_BROKER_CONFIG",
                STATIC_BROKER: "STATIC_BROKER_CONFIG", DEFAULT: "DEFAULT_CONFIG"}
INVALID_REQUEST = 42
INVALID_REPLICA_ASSIGNMENT = 39
NODE = "1"

JS_DIR = COMPAT_DIR / "kafkajs"
NODE_JS = shutil.which("node")


def kp_admin(broker):
    return KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)


def ck_admin(broker):
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def ck_broker_configs(admin, node=NODE):
    resource = ConfigResource(ResourceType.BROKER, node)
    return admin.describe_configs([resource])[resource].result(15)


def ck_incremental(admin, node, ops):
    """IncrementalAlterConfigs on a broker resource; the error or None."""
    resource = ConfigResource(ResourceType.BROKER, node, incremental_configs=ops)
    try:
        admin.incremental_alter_configs([resource])[resource].result(15)
        return None
    except KafkaException as e:
        return e.args[0]


def ck_produce(broker, topic, records, partition):
    """Produces (key, value) records to one partition and waits for every ack."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "acks": "all"})
    failures = []
    for key, value in records:
        producer.produce(topic, value, key, partition=partition,
                         on_delivery=lambda err, _msg: err and failures.append(err))
        producer.poll(0)
    assert producer.flush(30) == 0, "records still unacknowledged after 30 s"
    assert not failures, failures


def leaders(admin, topic):
    md = admin.list_topics(topic, timeout=10).topics[topic]
    return [md.partitions[p].leader for p in sorted(md.partitions)]


def test_broker_configs_are_described_with_values_sources_read_only_flags_and_synonyms(broker2):
    ck = ck_admin(broker2)
    configs = ck_broker_configs(ck)
    assert REQUIRED_BROKER_CONFIGS <= set(configs), REQUIRED_BROKER_CONFIGS - set(configs)
    assert configs["broker.id"].value == NODE
    assert configs["log.dirs"].value == str(broker2.data_dir)
    assert configs["advertised.listeners"].value == f"PLAINTEXT://127.0.0.1:{broker2.port + 1}"
    assert configs["num.partitions"].is_read_only
    assert not configs["log.retention.ms"].is_read_only
    assert configs["default.replication.factor"].value == "1"
    assert configs["num.partitions"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["log.retention.ms"].synonyms, "librdkafka asks for synonyms"

    kp = kp_admin(broker2)
    try:
        described = kp.describe_configs([KpConfigResource(ConfigResourceType.BROKER, "0")],
                                        include_synonyms=True, config_filter="all")
        entries = described["broker"]["0"]
        assert REQUIRED_BROKER_CONFIGS <= set(entries)
        assert entries["broker.id"]["value"] == "0"
        assert entries["listeners"]["value"] == f"PLAINTEXT://127.0.0.1:{broker2.port}"
        assert entries["socket.request.max.bytes"]["read_only"] is True
    finally:
        kp.close()


def test_dynamic_broker_configs_change_at_run_time_persist_and_reach_topics(broker2):
    ck = ck_admin(broker2)
    topic = unique_topic("dyn")
    ck.create_topics([NewTopic(topic, num_partitions=2)])[topic].result(15)

    # A value for every node, then one for node 1 alone, which wins on node
    # 1. (librdkafka and kafka-python refuse the empty broker name of the
    # cluster-wide defaults; kafkajs sends it, below.)
    for node in ("0", NODE):
        assert ck_incremental(ck, node, [ConfigEntry("log.retention.ms", "7200000",
                                                     incremental_operation=AlterConfigOpType.SET)]) is None
    assert ck_incremental(ck, NODE, [ConfigEntry("log.retention.ms", "5400000",
                                                 incremental_operation=AlterConfigOpType.SET)]) is None
    node1 = ck_broker_configs(ck, NODE)["log.retention.ms"]
    assert (node1.value, node1.source) == ("5400000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    node0 = ck_broker_configs(ck, "0")["log.retention.ms"]
    assert (node0.value, node0.source) == ("7200000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)

    # A topic without an override takes the broker layer of the node asked.
    kp = kp_admin(broker2)
    try:
        described = kp.describe_configs([KpConfigResource(ConfigResourceType.TOPIC, topic)],
                                        include_synonyms=True, config_filter="all")
        retention = described["topic"][topic]["retention.ms"]
        assert retention["value"] in ("7200000", "5400000")
        assert retention["config_source"] in (DYNAMIC_BROKER, SOURCE_NAMES[DYNAMIC_BROKER])

        entries = kp.describe_configs([KpConfigResource(ConfigResourceType.BROKER, NODE)],
                                      include_synonyms=True, config_filter="all")["broker"][NODE]
        synonyms = entries["log.retention.ms"]["synonyms"]
        assert [(s["name"], s["value"], s["source"]) for s in synonyms] == [
            ("log.retention.ms", "5400000", SOURCE_NAMES[DYNAMIC_BROKER]),
            ("log.retention.ms", str(7 * 24 * 3600 * 1000), SOURCE_NAMES[DEFAULT])]

        # The legacy AlterConfigs replaces node 0's whole dynamic set.
        kp.alter_configs([KpConfigResource(ConfigResourceType.BROKER, "0",
                                           configs={"log.segment.bytes": "1048576"})])
        entries = kp.describe_configs([KpConfigResource(ConfigResourceType.BROKER, "0")],
                                      config_filter="all")["broker"]["0"]
        assert entries["log.segment.bytes"]["value"] == "1048576"
        assert entries["log.segment.bytes"]["config_source"] in (DYNAMIC_BROKER, SOURCE_NAMES[DYNAMIC_BROKER])
    finally:
        kp.close()

    # Read-only and unknown configs are refused whole, with Kafka's words.
    err = ck_incremental(ck, NODE, [ConfigEntry("num.partitions", "9", incremental_operation=AlterConfigOpType.SET),
                                    ConfigEntry("log.retention.ms", "1000",
                                                incremental_operation=AlterConfigOpType.SET)])
    assert err is not None and err.code() == KafkaError.INVALID_REQUEST, err
    assert "Cannot update these configs dynamically" in err.str() and "num.partitions" in err.str()
    assert ck_broker_configs(ck, NODE)["log.retention.ms"].value == "5400000", "a refused change changed nothing"
    err = ck_incremental(ck, NODE, [ConfigEntry("log.segment.bytes", "12",
                                                incremental_operation=AlterConfigOpType.SET)])
    assert err is not None and err.code() == KafkaError.INVALID_REQUEST, err

    # The changes live in the metadata: a restart keeps them.
    broker2.restart()
    ck = ck_admin(broker2)
    assert ck_broker_configs(ck, NODE)["log.retention.ms"].value == "5400000"
    assert ck_broker_configs(ck, "0")["log.segment.bytes"].value == "1048576"
    # Deleting the node's value falls back to the static one.
    assert ck_incremental(ck, NODE, [ConfigEntry("log.retention.ms", None,
                                                 incremental_operation=AlterConfigOpType.DELETE)]) is None
    retention = ck_broker_configs(ck, NODE)["log.retention.ms"]
    assert retention.source == ConfigSource.DEFAULT_CONFIG.value, retention


def test_a_dynamic_segment_size_rolls_the_segments_of_existing_topics(broker2):
    """log.segment.bytes set at run time applies to the logs already open."""
    ck = ck_admin(broker2)
    topic = unique_topic("roll")
    ck.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[0]])])[topic].result(15)
    part_dir = broker2.data_dir / f"{topic}-0"

    def segments():
        return sorted(p.name for p in part_dir.glob("*.log"))

    for _ in range(4):
        ck_produce(broker2, topic, [(b"k", b"v" * 1000)] * 50, partition=0)
    assert len(segments()) == 1
    assert ck_incremental(ck, "0", [ConfigEntry("log.segment.bytes", str(64 * 1024),
                                                incremental_operation=AlterConfigOpType.SET)]) is None
    # Batches of ~50 KB: each one after the first fills a 64 KiB segment.
    for _ in range(4):
        ck_produce(broker2, topic, [(b"k", b"v" * 1000)] * 50, partition=0)
    assert len(segments()) >= 4, segments()


def test_describe_cluster_names_the_cluster_the_controller_and_every_node(broker2):
    kp = kp_admin(broker2)
    try:
        # kafka-python sends DescribeCluster (key 60).
        cluster = kp.describe_cluster()
    finally:
        kp.close()
    assert cluster["controller_id"] == 0
    assert sorted((b["broker_id"], b["port"]) for b in cluster["brokers"]) == [
        (0, broker2.port), (1, broker2.port + 1)]
    assert cluster["cluster_id"].startswith("shardlog-")

    # librdkafka describes the cluster through Metadata: the same answer.
    admin = ck_admin(broker2)
    ck = admin.describe_cluster(request_timeout=15).result(15)
    assert ck.cluster_id == cluster["cluster_id"]
    assert ck.controller.id == 0
    assert sorted(n.id for n in ck.nodes) == [0, 1]


def test_describe_log_dirs_reports_each_nodes_replicas_and_alter_replica_log_dirs_knows_only_the_data_dir(broker2):
    ck = ck_admin(broker2)
    topic = unique_topic("logdirs")
    ck.create_topics([NewTopic(topic, num_partitions=2, replica_assignment=[[0], [1]])])[topic].result(15)
    ck_produce(broker2, topic, [(b"k", b"x" * 500)] * 200, partition=1)
    kp = kp_admin(broker2)
    try:
        answers = {a["broker"]: a["log_dirs"] for a in kp.describe_log_dirs()}
        assert sorted(answers) == [0, 1]
        for node, dirs in answers.items():
            [log_dir] = dirs
            assert log_dir["error_code"] == 0
            assert log_dir["log_dir"] == str(broker2.data_dir)
            assert 0 < log_dir["usable_bytes"] <= log_dir["total_bytes"]
            partitions = {(t["name"], p["partition_index"]): p
                          for t in log_dir["topics"] for p in t["partitions"]}
            assert (topic, node) in partitions, f"node {node} hosts partition {node}"
            assert (topic, 1 - node) not in partitions, "a node reports only its own replicas"
        sizes = {node: {(t["name"], p["partition_index"]): p["partition_size"]
                        for t in dirs[0]["topics"] for p in t["partitions"]} for node, dirs in answers.items()}
        assert sizes[1][(topic, 1)] >= 200 * 500 > sizes[0][(topic, 0)]

        # Asking for one partition answers only that one.
        [only] = kp.describe_log_dirs(topic_partitions={topic: [1]}, brokers=[1])
        assert [(t["name"], [p["partition_index"] for p in t["partitions"]])
                for t in only["log_dirs"][0]["topics"]] == [(topic, [1])]

        moved = kp.alter_replica_log_dirs({(topic, 1, 1): str(broker2.data_dir) + "/"})
        assert list(moved.values()) == [NoError]
        moved = kp.alter_replica_log_dirs({(topic, 0, 0): "/no/such/dir"})
        assert list(moved.values()) == [LogDirNotFoundError]
    finally:
        kp.close()


def test_create_topics_and_partitions_honour_explicit_assignments_through_confluent_and_kafka_python(broker2):
    ck = ck_admin(broker2)
    topic = unique_topic("assigned")
    ck.create_topics([NewTopic(topic, num_partitions=3, replica_assignment=[[1], [0], [1]])])[topic].result(15)
    assert leaders(ck, topic) == [1, 0, 1]
    ck.create_partitions([NewPartitions(topic, 5, replica_assignment=[[0], [0]])])[topic].result(15)
    deadline = time.monotonic() + 10
    while len(leaders(ck, topic)) != 5:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert leaders(ck, topic) == [1, 0, 1, 0, 0]
    bad = unique_topic("unassignable")
    with pytest.raises(KafkaException) as caught:
        ck.create_topics([NewTopic(bad, num_partitions=1, replica_assignment=[[9]])])[bad].result(15)
    assert caught.value.args[0].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    with pytest.raises(KafkaException) as caught:
        ck.create_partitions([NewPartitions(topic, 6, replica_assignment=[[4]])])[topic].result(15)
    assert caught.value.args[0].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    assert bad not in ck.list_topics(timeout=10).topics

    kp = kp_admin(broker2)
    try:
        other = unique_topic("kp-assigned")
        kp.create_topics([KpNewTopic(other, replica_assignments={0: [0], 1: [1]})])
        deadline = time.monotonic() + 10
        while other not in ck.list_topics(timeout=10).topics:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert leaders(ck, other) == [0, 1]
        kp.create_partitions({other: KpNewPartitions(total_count=3, new_assignments=[[1]])})
        while len(leaders(ck, other)) != 3:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert leaders(ck, other) == [0, 1, 1]
        with pytest.raises(InvalidReplicationAssignmentError):
            kp.create_topics([KpNewTopic(unique_topic("kp-bad"), replica_assignments={0: [5]})])
    finally:
        kp.close()


def test_list_offsets_for_a_partition_that_does_not_exist_is_retried_until_the_clients_timeout(broker2):
    ck = ck_admin(broker2)
    topic = unique_topic("nopart")
    ck.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(15)

    # kafka-python retries UNKNOWN_TOPIC_OR_PARTITION until its own timeout.
    consumer = KafkaConsumer(bootstrap_servers=broker2.bootstrap, request_timeout_ms=15000)
    try:
        started = time.monotonic()
        with pytest.raises(KafkaTimeoutError):
            consumer.offsets_for_times({KpTopicPartition(topic, 5): int(time.time() * 1000)}, timeout_ms=3000)
        waited = time.monotonic() - started
        assert 2.5 <= waited < 15, f"gave up after {waited:.1f} s, not at its 3 s timeout"
        # The partition that exists answers at once.
        found = consumer.offsets_for_times({KpTopicPartition(topic, 0): 0}, timeout_ms=3000)
        assert list(found) == [KpTopicPartition(topic, 0)]
    finally:
        consumer.close()

    # librdkafka looks the partition's leader up in Metadata first and, as
    # against Kafka, ends the call there: at once, not hanging.
    tp = TopicPartition(topic, 5)
    started = time.monotonic()
    with pytest.raises(KafkaException):
        ck.list_offsets({tp: OffsetSpec.for_timestamp(0)}, request_timeout=5)[tp].result(15)
    assert time.monotonic() - started < 10


def test_kafkajs_admin_calls_on_brokers_and_assignments(broker2, tmp_path):
    if NODE_JS is None:
        pytest.fail("node is not installed", pytrace=False)
    topic = unique_topic("js-admin")
    spec_path, out_path = tmp_path / "spec.json", tmp_path / "out.json"
    spec_path.write_text(json.dumps({"brokers": [broker2.bootstrap], "topic": topic, "node": 0}))
    res = subprocess.run([NODE_JS, str(JS_DIR / "roundtrip.js"), "adminApis", str(spec_path), str(out_path)],
                         capture_output=True, text=True, timeout=180, cwd=str(JS_DIR))
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    out = json.loads(out_path.read_text())

    [resource] = out["describeBroker"]["ok"]["resources"]
    entries = {e["configName"]: e for e in resource["configEntries"]}
    assert REQUIRED_BROKER_CONFIGS <= set(entries)
    assert entries["broker.id"]["configValue"] == "0"
    assert entries["num.partitions"]["readOnly"] is True
    assert entries["log.retention.ms"]["configSynonyms"], "kafkajs asked for synonyms"

    assert "ok" in out["alterRetention"], out["alterRetention"]
    [resource] = out["describeRetention"]["ok"]["resources"]
    [retention] = resource["configEntries"]
    assert (retention["configName"], retention["configValue"]) == ("log.retention.ms", "5400000")
    assert retention["configSource"] == DYNAMIC_BROKER

    refused = out["alterReadOnly"]["error"]
    assert (refused["type"], refused["code"]) == ("INVALID_REQUEST", INVALID_REQUEST), refused

    cluster = out["describeCluster"]["ok"]
    assert cluster["controller"] == 0 and cluster["clusterId"].startswith("shardlog-")
    assert sorted(b["nodeId"] for b in cluster["brokers"]) == [0, 1]

    assert out["createAssigned"] == {"ok": True}, out["createAssigned"]
    [created] = out["metadataCreated"]["ok"]["topics"]
    assert sorted((p["partitionId"], p["leader"]) for p in created["partitions"]) == [(0, 1), (1, 0)]
    refused = out["createUnknownNode"]["error"]
    assert [e["type"] for e in refused["errors"]] == ["INVALID_REPLICA_ASSIGNMENT"], refused

    assert "ok" in out["growAssigned"], out["growAssigned"]
    refused = out["growUnknownNode"]["error"]
    assert refused["type"] == "INVALID_REPLICA_ASSIGNMENT" or \
        [e["type"] for e in refused["errors"]] == ["INVALID_REPLICA_ASSIGNMENT"], refused
    [grown] = out["metadataGrown"]["ok"]["topics"]
    assert sorted((p["partitionId"], p["leader"]) for p in grown["partitions"]) == [(0, 1), (1, 0), (2, 1)]
    assert f"{topic}-bad" not in out["listTopics"]["ok"]


def test_describe_metadata_quorum_names_this_machine_as_the_controller_of_the_metadata_log(broker2):
    """kafka-python's describe_metadata_quorum (DescribeQuorum, KRaft's
    __cluster_metadata partition 0): a lone machine is the sole voter and
    the controller, and the log's high watermark moves with each change."""
    machine = int((broker2.data_dir / "machine.id").read_text().strip())
    kp = kp_admin(broker2)
    try:
        before = kp.describe_metadata_quorum()
        [topic] = before["topics"]
        [partition] = topic["partitions"]
        assert (topic["topic_name"], partition["partition_index"], partition["error"]) == (
            "__cluster_metadata", 0, None)
        assert partition["leader_id"] == machine
        assert partition["leader_epoch"] >= 1
        assert [v["replica_id"] for v in partition["current_voters"]] == [machine]
        assert partition["current_voters"][0]["log_end_offset"] >= partition["high_watermark"] > 0
        assert partition["observers"] == []
        kp.create_topics([KpNewTopic(unique_topic("quorum"), num_partitions=1)])
        [after] = kp.describe_metadata_quorum()["topics"][0]["partitions"]
        assert after["high_watermark"] > partition["high_watermark"], "a topic is a committed metadata change"
    finally:
        kp.close()
