"""kafkajs 2.2.x against a real shardlog broker.

kafkajs produces (via tests/compat/kafkajs/roundtrip.js); since its consumer
needs consumer groups (not implemented yet), records are read back with
confluent-kafka using manual assignment. kafkajs' default partitioner is the
Java-compatible murmur2 one, so expected partitions are computed independently.
"""

import base64
import json
import shutil
import subprocess
import zlib

import pytest

from conftest import (COMPAT_DIR, NUM_RECORDS, PARTITIONS,
                      assert_partitions_match, ck_read_topic,
                      expected_by_partition, make_records, murmur2_partition,
                      unique_topic)

JS_DIR = COMPAT_DIR / "kafkajs"
SCRIPT = JS_DIR / "roundtrip.js"
NODE = shutil.which("node")

PRODUCE_VARIANTS = {
    "acks1": dict(acks=1, idempotent=False),
    "acksall": dict(acks=-1, idempotent=False),
    "idempotent": dict(acks=-1, idempotent=True),
}


@pytest.fixture(autouse=True)
def _require_kafkajs():
    if NODE is None:
        pytest.fail("node is not installed", pytrace=False)
    pkg = JS_DIR / "node_modules" / "kafkajs" / "package.json"
    if not pkg.is_file():
        pytest.fail(f"kafkajs is not installed: run `npm ci` in {JS_DIR} (tests/setup.sh does)", pytrace=False)
    version = json.loads(pkg.read_text())["version"]
    assert version.startswith("2.2."), f"kafkajs {version} installed, package.json pins 2.2.x"


def run_js(tmp_path, command, spec, timeout=180):
    spec_path = tmp_path / f"{command}-spec.json"
    out_path = tmp_path / f"{command}-out.json"
    spec_path.write_text(json.dumps(spec))
    res = subprocess.run([NODE, str(SCRIPT), command, str(spec_path), str(out_path)],
                         capture_output=True, text=True, timeout=timeout, cwd=str(JS_DIR))
    assert res.returncode == 0, f"roundtrip.js {command} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    return json.loads(out_path.read_text())


def b64(b):
    return base64.b64encode(b).decode()


def js_produce(tmp_path, broker, topic, records, acks, idempotent=False, compression="none", send_size=1000):
    spec = dict(
        brokers=[broker.bootstrap], topic=topic, acks=acks, idempotent=idempotent,
        compression=compression, sendSize=send_size,
        records=[dict(key=b64(r.key), value=b64(r.value), headers=[[k, b64(v)] for k, v in r.headers])
                 for r in records],
    )
    out = run_js(tmp_path, "produce", spec)
    assert out["sent"] == len(records)
    for md_list in out["metadata"]:
        for md in md_list:
            assert md["topicName"] == topic and md["errorCode"] == 0, md
    return out


def check_against_confluent(broker, ck_consumer, topic, records):
    consumed = ck_read_topic(ck_consumer, broker, topic, len(records))
    assert_partitions_match(expected_by_partition(records, murmur2_partition), consumed)


@pytest.mark.parametrize("variant", list(PRODUCE_VARIANTS))
def test_roundtrip(broker, ck_consumer, tmp_path, variant):
    records = make_records(NUM_RECORDS, seed=41)
    topic = broker.create_topic(unique_topic("js"))
    out = js_produce(tmp_path, broker, topic, records, **PRODUCE_VARIANTS[variant])
    if PRODUCE_VARIANTS[variant]["acks"] != 0:
        # The base offsets reported per send are where each send's records landed.
        expected = expected_by_partition(records, murmur2_partition)
        next_offset = {p: 0 for p in range(PARTITIONS)}
        for i, md_list in enumerate(out["metadata"]):
            chunk = records[i * 1000:(i + 1) * 1000]
            per_part = {}
            for r in chunk:
                p = murmur2_partition(r.key)
                per_part[p] = per_part.get(p, 0) + 1
            got = {md["partition"]: int(md["baseOffset"]) for md in md_list}
            assert got == {p: next_offset[p] for p in per_part}, f"send {i}: base offsets {got}"
            for p, n in per_part.items():
                next_offset[p] += n
        assert next_offset == {p: len(expected[p]) for p in range(PARTITIONS)}
    check_against_confluent(broker, ck_consumer, topic, records)


def test_compression_gzip(broker, ck_consumer, tmp_path):
    records = make_records(NUM_RECORDS, seed=42, text_only=True)
    topic = broker.create_topic(unique_topic("js-gzip"))
    js_produce(tmp_path, broker, topic, records, acks=-1, compression="gzip")
    check_against_confluent(broker, ck_consumer, topic, records)


def test_restart_between_produce_and_consume(broker, ck_consumer, tmp_path):
    records = make_records(NUM_RECORDS, seed=43)
    topic = broker.create_topic(unique_topic("js-restart"))
    js_produce(tmp_path, broker, topic, records, acks=-1)
    broker.restart()
    check_against_confluent(broker, ck_consumer, topic, records)


def test_admin(broker2, tmp_path):
    topic = unique_topic("js-admin")
    out = run_js(tmp_path, "admin", dict(brokers=[broker2.bootstrap], topic=topic, partitions=PARTITIONS))
    assert out["created"] is True
    assert out["createdAgain"] is False  # TOPIC_ALREADY_EXISTS is reported as "not created"
    assert topic in out["listed"]

    [tmd] = out["metadata"]["topics"]
    assert tmd["name"] == topic
    assert sorted(p["partitionId"] for p in tmd["partitions"]) == list(range(PARTITIONS))
    for p in tmd["partitions"]:
        assert p["partitionErrorCode"] == 0
        assert p["leader"] in (0, 1)
        assert p["replicas"] == [p["leader"]] and p["isr"] == [p["leader"]]

    assert sorted(b["nodeId"] for b in out["cluster"]["brokers"]) == [0, 1]
    assert sorted(b["port"] for b in out["cluster"]["brokers"]) == broker2.ports

    [res] = out["configs"]["resources"]
    assert res["errorCode"] == 0 and res["resourceName"] == topic
    entries = {e["configName"]: e["configValue"] for e in res["configEntries"]}
    assert entries["retention.ms"] == "3600000"
    assert "cleanup.policy" in entries

    [res] = out["configsAfterAlter"]["resources"]
    assert {e["configName"]: e["configValue"] for e in res["configEntries"]} == {"retention.ms": "7200000"}

    offsets = sorted(out["offsets"], key=lambda o: o["partition"])
    assert [o["partition"] for o in offsets] == list(range(PARTITIONS))
    assert all(o["offset"] == "0" and o["high"] == "0" and o["low"] == "0" for o in offsets), offsets

    [grown] = out["metadataAfterGrow"]["topics"]
    assert len(grown["partitions"]) == PARTITIONS + 2

    assert topic not in out["listedAfterDelete"]


def test_list_groups_shows_each_group_once(broker, tmp_path):
    """admin.listGroups() asks every node and concatenates: each node must
    list only the groups it coordinates (in shared-port mode, the one node
    lists them all), so that every group shows exactly once."""
    topic = broker.create_topic(unique_topic("js-groups"), partitions=1)
    # Three groups per core (a group lives on core crc32(group) % cores).
    groups, per_core = [], [0] * broker.cores
    for i in range(1000):
        group = f"{topic}-group-{i}"
        core = zlib.crc32(group.encode()) % broker.cores
        if per_core[core] < 3:
            per_core[core] += 1
            groups.append(group)
    assert per_core == [3] * broker.cores
    for group in groups:
        broker.cli("group", "reset-offsets", group, "--topic", topic, "--to-earliest", "-b", broker.bootstrap)
    out = run_js(tmp_path, "listGroups", dict(brokers=[broker.bootstrap]))
    listed = sorted(g["groupId"] for g in out["groups"])
    assert listed == sorted(groups)
