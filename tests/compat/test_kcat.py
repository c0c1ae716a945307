"""kcat (librdkafka 2.0.2, Debian's package) against a real shardlog broker.

kcat takes headers per invocation (-H), so records are produced in batches of
1,000 lines by 10 invocations, each with its own headers. The producer uses
partitioner=murmur2_random so expected partitions are computed independently.
"""

import json
import shutil
import subprocess
import time

import pytest

from conftest import (NUM_RECORDS, PARTITIONS, Consumed, Rec,
                      assert_partitions_match, expected_by_partition,
                      make_records, murmur2_partition, unique_topic)

BATCHES = 10
KCAT = shutil.which("kcat")

PRODUCE_VARIANTS = {
    "acks1": ["-X", "acks=1"],
    "acksall": ["-X", "acks=all"],
    "idempotent": ["-X", "enable.idempotence=true"],
}

FORMAT = "%p\\t%o\\t%k\\t%s\\t%h\\n"


@pytest.fixture(autouse=True)
def _require_kcat():
    if KCAT is None:
        pytest.fail("kcat is not installed (apt-get install kcat); tests/setup.sh installs it", pytrace=False)


def kcat(*args, input=None, timeout=120):
    res = subprocess.run([KCAT, *args], input=input, capture_output=True, timeout=timeout)
    assert res.returncode == 0, f"kcat {' '.join(args)} exited {res.returncode}:\n{res.stderr.decode(errors='replace')}"
    return res


def batch_headers(b):
    headers = [("batch", str(b).encode()), ("tag", b"a"), ("tag", f"b{b % 3}".encode())]
    if b % 2 == 0:
        headers.append(("empty", b""))
    return tuple(headers)


def kcat_records(n=NUM_RECORDS, seed=31):
    base = make_records(n, seed=seed, text_only=True)
    per = n // BATCHES
    return [Rec(r.key, r.value, batch_headers(i // per)) for i, r in enumerate(base)]


def kcat_produce(broker, topic, records, extra):
    per = len(records) // BATCHES
    for b in range(BATCHES):
        chunk = records[b * per:(b + 1) * per]
        args = ["-P", "-b", broker.bootstrap, "-t", topic, "-K", ":",
                "-X", "partitioner=murmur2_random", *extra]
        for k, v in batch_headers(b):
            args += ["-H", f"{k}={v.decode()}"]
        lines = b"".join(r.key + b":" + r.value + b"\n" for r in chunk)
        res = kcat(*args, input=lines)
        assert b"Delivery failed" not in res.stderr, res.stderr.decode(errors="replace")


def parse_headers(field):
    if not field:
        return ()
    out = []
    for kv in field.split(b","):
        k, _, v = kv.partition(b"=")
        out.append((k.decode(), v))
    return tuple(out)


def kcat_consume(broker, topic):
    res = kcat("-C", "-b", broker.bootstrap, "-t", topic, "-o", "beginning", "-e", "-q", "-f", FORMAT)
    out = []
    for line in res.stdout.split(b"\n"):
        if not line:
            continue
        p, o, k, v, h = line.split(b"\t")
        out.append(Consumed(int(p), int(o), k, v, parse_headers(h)))
    return out


def roundtrip(broker, records, extra):
    topic = broker.create_topic(unique_topic("kcat"))
    kcat_produce(broker, topic, records, extra)
    consumed = kcat_consume(broker, topic)
    assert_partitions_match(expected_by_partition(records, murmur2_partition), consumed)
    return topic


@pytest.mark.parametrize("variant", list(PRODUCE_VARIANTS))
def test_roundtrip(broker, variant):
    roundtrip(broker, kcat_records(), PRODUCE_VARIANTS[variant])


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compression(broker, codec):
    roundtrip(broker, kcat_records(seed=32), ["-X", "acks=all", "-z", codec, "-X", "linger.ms=20"])


def test_restart_between_produce_and_consume(broker):
    records = kcat_records(seed=33)
    topic = broker.create_topic(unique_topic("kcat-restart"))
    kcat_produce(broker, topic, records, ["-X", "acks=all"])
    broker.restart()
    consumed = kcat_consume(broker, topic)
    assert_partitions_match(expected_by_partition(records, murmur2_partition), consumed)


def metadata(broker, *extra):
    return json.loads(kcat("-L", "-J", "-b", broker.bootstrap, *extra).stdout)


def test_metadata_list(broker):
    topic = broker.create_topic(unique_topic("kcat-md"))
    md = metadata(broker)
    expect_brokers = [f"127.0.0.1:{p}" for p in broker.ports]
    assert sorted(b["name"] for b in md["brokers"]) == expect_brokers
    ids = {b["id"] for b in md["brokers"]}
    [t] = [t for t in md["topics"] if t["topic"] == topic]
    assert "error" not in t, t
    assert sorted(p["partition"] for p in t["partitions"]) == list(range(PARTITIONS))
    for p in t["partitions"]:
        assert p["leader"] in ids
        assert [r["id"] for r in p["replicas"]] == [p["leader"]]
        assert [r["id"] for r in p["isrs"]] == [p["leader"]]

    # Single-topic query.
    md1 = metadata(broker, "-t", topic)
    assert [t["topic"] for t in md1["topics"]] == [topic]

    # Deleted topics disappear from the listing.
    broker.cli("topic", "delete", topic, "-b", broker.bootstrap)
    deadline = time.monotonic() + 10
    while any(t["topic"] == topic for t in metadata(broker)["topics"]):
        assert time.monotonic() < deadline, "deleted topic still listed"
        time.sleep(0.1)


def test_auto_create_on_produce(broker2):
    """Producing to an unknown topic auto-creates it (default: 1 partition)."""
    topic = unique_topic("kcat-auto")
    kcat("-P", "-b", broker2.bootstrap, "-t", topic, "-K", ":", "-X", "acks=all",
         input=b"k1:v1\nk2:v2\nk3:v3\n")
    md = metadata(broker2, "-t", topic)
    [t] = md["topics"]
    assert len(t["partitions"]) == 1
    got = kcat_consume(broker2, topic)
    assert [(c.partition, c.offset, c.key, c.value) for c in got] == \
        [(0, 0, b"k1", b"v1"), (0, 1, b"k2", b"v2"), (0, 2, b"k3", b"v3")]
