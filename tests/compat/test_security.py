"""SASL authentication (issue 32, first step): `--sasl-mechanisms` makes the
Kafka ports SASL_PLAINTEXT listeners (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512),
`--bootstrap-user` creates the first user as SCRAM credentials in the
metadata log. Real clients (confluent-kafka, kafka-python, kafkajs, kcat)
log in and produce, consume and use groups; wrong passwords, unknown
mechanisms and requests before authentication get Kafka's error codes and a
closed connection, checked on the wire with hand-built frames; a cluster of
three machines replicates with its followers logged in to each other."""

import json
import shutil
import socket
import struct
import subprocess
import time

import pytest

from conftest import start_machines, unique_topic
from groups_common import JS_DIR, NODE, kafkajs_problem

KCAT = shutil.which("kcat")
ADMIN = ("admin", "admin-secret")
MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
SASL_ARGS = ["--sasl-mechanisms", ",".join(MECHANISMS), "--bootstrap-user", f"{ADMIN[0]}:{ADMIN[1]}"]


@pytest.fixture
def sasl_broker(broker_factory):
    return broker_factory("per-core", 2, extra_args=SASL_ARGS)


def ck_conf(broker, mechanism, user=ADMIN[0], password=ADMIN[1], **extra):
    return {"bootstrap.servers": broker.bootstrap_all, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password, **extra}


def create_topic(conf, topic, partitions=2):
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic, partitions, replication_factor=1)])[topic].result(timeout=30)


# ---- hand-built frames -------------------------------------------------------

def frame(api_key, version, body, correlation=1):
    client = b"raw"
    header = struct.pack(">hhih", api_key, version, correlation, len(client)) + client
    return struct.pack(">i", len(header) + len(body)) + header + body


def kstring(text):
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def kbytes(data):
    return struct.pack(">i", len(data)) + data


def read_frame(sock):
    """One size-prefixed answer, or None once the broker closed the connection."""
    head = sock.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        return None
    size = struct.unpack(">i", head)[0]
    data = sock.recv(size, socket.MSG_WAITALL)
    return data if len(data) == size else None


def closed(sock, timeout=5.0):
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def handshake(sock, mechanism, version=1):
    sock.sendall(frame(17, version, kstring(mechanism)))
    answer = read_frame(sock)
    error = struct.unpack_from(">h", answer, 4)[0]
    count = struct.unpack_from(">i", answer, 6)[0]
    names, at = [], 10
    for _ in range(count):
        n = struct.unpack_from(">h", answer, at)[0]
        names.append(answer[at + 2:at + 2 + n].decode())
        at += 2 + n
    return error, names


def authenticate(sock, token):
    sock.sendall(frame(36, 1, kbytes(token)))
    answer = read_frame(sock)
    error = struct.unpack_from(">h", answer, 4)[0]
    n = struct.unpack_from(">h", answer, 6)[0]
    message = answer[8:8 + n].decode() if n >= 0 else None
    return error, message


def metadata_answered(sock):
    sock.sendall(frame(3, 1, struct.pack(">i", 0), correlation=9))
    answer = read_frame(sock)
    return answer is not None and struct.unpack_from(">i", answer, 0)[0] == 9


# ---- tests --------------------------------------------------------------------

@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_confluent_kafka_logs_in_produces_and_consumes_in_a_group(sasl_broker, mechanism):
    from confluent_kafka import Consumer, Producer
    topic = unique_topic("sasl-ck")
    conf = ck_conf(sasl_broker, mechanism)
    create_topic(conf, topic)
    producer = Producer({**conf, "acks": "all"})
    for i in range(100):
        producer.produce(topic, value=f"v{i}".encode())
    assert producer.flush(30) == 0
    consumer = Consumer({**conf, "group.id": unique_topic("g"), "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 100 and time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value().decode())
    consumer.close()
    assert sorted(got) == sorted(f"v{i}" for i in range(100))


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafka_python_logs_in_produces_and_consumes(sasl_broker, mechanism):
    from kafka import KafkaConsumer, KafkaProducer
    topic = unique_topic("sasl-kp")
    create_topic(ck_conf(sasl_broker, "SCRAM-SHA-512"), topic)
    conf = dict(bootstrap_servers=sasl_broker.bootstrap_all, security_protocol="SASL_PLAINTEXT",
                sasl_mechanism=mechanism, sasl_plain_username=ADMIN[0], sasl_plain_password=ADMIN[1])
    producer = KafkaProducer(acks="all", **conf)
    for i in range(50):
        producer.send(topic, f"v{i}".encode())
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=10000,
                             group_id=unique_topic("g"), **conf)
    got = [m.value.decode() for m in consumer]
    consumer.close()
    assert sorted(got) == sorted(f"v{i}" for i in range(50))


@pytest.mark.parametrize("mechanism", ["plain", "scram-sha-256", "scram-sha-512"])
def test_kafkajs_logs_in_produces_and_consumes_in_a_group(sasl_broker, mechanism):
    if kafkajs_problem():
        pytest.fail(kafkajs_problem(), pytrace=False)
    topic = unique_topic("sasl-js")
    create_topic(ck_conf(sasl_broker, "PLAIN"), topic)
    spec = dict(brokers=sasl_broker.bootstrap_all.split(","), topic=topic, group=unique_topic("g"),
                mechanism=mechanism, username=ADMIN[0], password=ADMIN[1], count=40)
    res = subprocess.run([NODE, str(JS_DIR / "sasl.js"), json.dumps(spec)], capture_output=True, text=True,
                         timeout=90, cwd=str(JS_DIR))
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert "error" not in out, out
    assert sorted(out["consumed"]) == sorted(f"v{i}" for i in range(40))


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_kcat_logs_in_produces_and_consumes(sasl_broker, mechanism):
    if KCAT is None:
        pytest.fail("kcat is not installed (apt-get install kcat; .ci/run does)", pytrace=False)
    topic = unique_topic("sasl-kcat")
    create_topic(ck_conf(sasl_broker, mechanism), topic, partitions=1)
    sasl = ["-X", "security.protocol=SASL_PLAINTEXT", "-X", f"sasl.mechanisms={mechanism}",
            "-X", f"sasl.username={ADMIN[0]}", "-X", f"sasl.password={ADMIN[1]}"]
    lines = "".join(f"line-{i}\n" for i in range(20)).encode()
    res = subprocess.run([KCAT, "-b", sasl_broker.bootstrap, *sasl, "-P", "-t", topic], input=lines,
                         capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr.decode()
    res = subprocess.run([KCAT, "-b", sasl_broker.bootstrap, *sasl, "-C", "-t", topic, "-o", "beginning", "-e", "-q"],
                         capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr.decode()
    assert res.stdout.decode().split() == [f"line-{i}" for i in range(20)]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_wrong_password_and_an_unknown_user_are_refused_as_authentication_failures(sasl_broker, mechanism):
    from confluent_kafka import KafkaError, Producer
    for user, password in [(ADMIN[0], "wrong"), ("nobody", ADMIN[1])]:
        errors = []
        producer = Producer({**ck_conf(sasl_broker, mechanism, user, password), "error_cb": errors.append,
                             "message.timeout.ms": 3000})
        producer.produce("never", b"x")
        producer.flush(5)
        assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), (user, [str(e) for e in errors])
        assert any("Authentication failed" in e.str() for e in errors), [str(e) for e in errors]


def test_on_the_wire_refusals_carry_kafka_error_codes_and_close_the_connection(sasl_broker):
    addr = ("127.0.0.1", sasl_broker.port)
    # A request before authentication: closed, no answer.
    with socket.create_connection(addr, timeout=5) as s:
        s.sendall(frame(3, 1, struct.pack(">i", 0)))
        assert read_frame(s) is None
    # A frame over 512 KiB before login (Kafka's sasl.server.max.receive.size): closed unread.
    with socket.create_connection(addr, timeout=5) as s:
        s.sendall(struct.pack(">i", 1 << 20) + b"\0" * 64)
        assert closed(s)
    # ApiVersions is allowed first and lists both SASL APIs.
    with socket.create_connection(addr, timeout=5) as s:
        s.sendall(frame(18, 0, b""))
        answer = read_frame(s)
        count = struct.unpack_from(">i", answer, 6)[0]
        keys = {struct.unpack_from(">h", answer, 10 + 6 * i)[0] for i in range(count)}
        assert {17, 36} <= keys
        assert handshake(s, "PLAIN") == (0, MECHANISMS)
    # An unknown mechanism: UNSUPPORTED_SASL_MECHANISM (33) with the list, closed.
    with socket.create_connection(addr, timeout=5) as s:
        assert handshake(s, "GSSAPI") == (33, MECHANISMS)
        assert closed(s)
    # SaslAuthenticate before the handshake: ILLEGAL_SASL_STATE (34), closed.
    with socket.create_connection(addr, timeout=5) as s:
        assert authenticate(s, b"\0admin\0admin-secret")[0] == 34
        assert closed(s)
    # A wrong password: SASL_AUTHENTICATION_FAILED (58) with a message, closed.
    with socket.create_connection(addr, timeout=5) as s:
        handshake(s, "PLAIN")
        error, message = authenticate(s, b"\0admin\0nope")
        assert error == 58 and "Authentication failed" in message
        assert closed(s)
    # A malformed SCRAM message: 58, closed.
    with socket.create_connection(addr, timeout=5) as s:
        handshake(s, "SCRAM-SHA-256")
        assert authenticate(s, b"n,,r=no-user")[0] == 58
        assert closed(s)
    # The right password: requests are served on that connection.
    with socket.create_connection(addr, timeout=5) as s:
        handshake(s, "PLAIN")
        assert authenticate(s, b"\0admin\0admin-secret") == (0, None)
        assert metadata_answered(s)
        # No re-authentication: a second handshake is ILLEGAL_SASL_STATE and the connection stays.
        assert handshake(s, "PLAIN")[0] == 34
        assert metadata_answered(s)
    # A v0 handshake: the token travels bare (size-prefixed), then requests.
    with socket.create_connection(addr, timeout=5) as s:
        assert handshake(s, "PLAIN", version=0)[0] == 0
        token = b"\0admin\0admin-secret"
        s.sendall(struct.pack(">i", len(token)) + token)
        assert read_frame(s) == b""
        assert metadata_answered(s)
    # Other connections were never disturbed; the failures are counted.
    assert sasl_broker.running()


def test_a_plaintext_broker_answers_sasl_requests_with_illegal_sasl_state(broker_factory):
    plain = broker_factory("per-core", 1)
    with socket.create_connection(("127.0.0.1", plain.port), timeout=5) as s:
        assert handshake(s, "PLAIN") == (34, [])
        assert metadata_answered(s)


def test_the_bootstrap_user_is_kept_in_the_metadata_log_across_a_restart(broker_factory):
    """Created once: a restart with another --bootstrap-user password keeps
    the first (the user exists), and a restart without the flag still
    knows the user."""
    from confluent_kafka import KafkaError, Producer
    from confluent_kafka.admin import AdminClient
    b = broker_factory("per-core", 1, extra_args=SASL_ARGS)
    b.extra_args = ["--sasl-mechanisms", "SCRAM-SHA-256", "--bootstrap-user", "admin:other-password"]
    b.restart()
    assert AdminClient(ck_conf(b, "SCRAM-SHA-256")).list_topics(timeout=10).brokers
    b.extra_args = ["--sasl-mechanisms", "SCRAM-SHA-256"]
    b.restart()
    assert AdminClient(ck_conf(b, "SCRAM-SHA-256")).list_topics(timeout=10).brokers
    errors = []
    producer = Producer({**ck_conf(b, "SCRAM-SHA-256", password="other-password"), "error_cb": errors.append,
                         "message.timeout.ms": 3000})
    producer.produce("never", b"x")
    producer.flush(5)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), [str(e) for e in errors]


def test_three_machines_replicate_with_their_followers_logged_in(tmp_path):
    """Followers fetch from leaders over the Kafka ports, logged in as the
    bootstrap user: an RF 3, min.insync.replicas 3 topic takes acks=all
    writes only if every follower fetches."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic
    machines = start_machines(tmp_path, 3, 1, lambda i, base: list(SASL_ARGS))
    try:
        bootstrap = ",".join(m.bootstrap for m in machines)
        conf = {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": ADMIN[0], "sasl.password": ADMIN[1]}
        topic = unique_topic("sasl-rf3")
        admin = AdminClient(conf)
        admin.create_topics([NewTopic(topic, 3, replication_factor=3,
                                      config={"min.insync.replicas": "3"})])[topic].result(30)
        producer = Producer({**conf, "acks": "all", "message.timeout.ms": 20000})
        failed = []
        for i in range(300):
            producer.produce(topic, value=f"v{i}".encode(), partition=i % 3,
                             on_delivery=lambda err, msg: err and failed.append(err))
        assert producer.flush(30) == 0
        assert failed == []
        consumer = Consumer({**conf, "group.id": unique_topic("g"), "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 300 and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                got.append(m.value().decode())
        consumer.close()
        assert sorted(got) == sorted(f"v{i}" for i in range(300))
    finally:
        for m in machines:
            if m.running():
                m.stop()


def test_users_are_added_described_and_deleted_through_the_admin_api(sasl_broker):
    """AlterUserScramCredentials / DescribeUserScramCredentials (KIP-554)
    with confluent-kafka's AdminClient: a user added logs in with its
    mechanism and not another; iterations are reported; a bad alteration is
    refused with Kafka's codes and changes nothing; a deleted user no longer
    logs in."""
    from confluent_kafka import KafkaError, KafkaException, Producer
    from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism,
                                       UserScramCredentialDeletion, UserScramCredentialUpsertion)
    admin = AdminClient(ck_conf(sasl_broker, "SCRAM-SHA-512"))

    def logs_in(mechanism, user, password):
        errors = []
        p = Producer({**ck_conf(sasl_broker, mechanism, user, password), "error_cb": errors.append})
        md = None
        try:
            md = p.list_topics(timeout=5)
        except KafkaException:
            pass
        refused = any(e.code() == KafkaError._AUTHENTICATION for e in errors)
        return md is not None and not refused

    sha256 = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192)
    done = admin.alter_user_scram_credentials([UserScramCredentialUpsertion("carol", sha256, b"carol-pw")])
    assert done["carol"].result(10) is None
    assert logs_in("SCRAM-SHA-256", "carol", "carol-pw")
    assert logs_in("PLAIN", "carol", "carol-pw")
    assert not logs_in("SCRAM-SHA-512", "carol", "carol-pw")
    assert not logs_in("SCRAM-SHA-256", "carol", "wrong")

    described = admin.describe_user_scram_credentials(["carol", "admin"])
    carol = described["carol"].result(10)
    assert [(i.mechanism, i.iterations) for i in carol.scram_credential_infos] == [(ScramMechanism.SCRAM_SHA_256, 8192)]
    admin_infos = described["admin"].result(10).scram_credential_infos
    assert sorted(i.mechanism for i in admin_infos) == [ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512]
    everyone = admin.describe_user_scram_credentials().result(10)
    assert sorted(everyone) == ["admin", "carol"]
    with pytest.raises(KafkaException) as missing:
        admin.describe_user_scram_credentials(["nobody"])["nobody"].result(10)
    assert missing.value.args[0].code() == KafkaError.RESOURCE_NOT_FOUND

    # Too few iterations: UNACCEPTABLE_CREDENTIAL, and dave is not created.
    weak = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 100)
    with pytest.raises(KafkaException) as refused:
        admin.alter_user_scram_credentials([UserScramCredentialUpsertion("dave", weak, b"pw")])["dave"].result(10)
    assert refused.value.args[0].code() == KafkaError.UNACCEPTABLE_CREDENTIAL
    # Deleting a credential carol does not have: RESOURCE_NOT_FOUND, and her
    # upsertion in the same request is not applied either.
    with pytest.raises(KafkaException) as refused:
        admin.alter_user_scram_credentials([
            UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_512),
            UserScramCredentialUpsertion("carol", sha256, b"new-pw"),
        ])["carol"].result(10)
    assert refused.value.args[0].code() == KafkaError.RESOURCE_NOT_FOUND
    assert logs_in("SCRAM-SHA-256", "carol", "carol-pw")
    assert sorted(admin.describe_user_scram_credentials().result(10)) == ["admin", "carol"]

    done = admin.alter_user_scram_credentials([UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_256)])
    assert done["carol"].result(10) is None
    assert not logs_in("SCRAM-SHA-256", "carol", "carol-pw")
    assert not logs_in("PLAIN", "carol", "carol-pw")
    assert sorted(admin.describe_user_scram_credentials().result(10)) == ["admin"]


def test_the_client_commands_log_in_and_manage_users(sasl_broker):
    """`shardlog user add|list|delete` and `shardlog topic` with the
    --sasl-* settings (the password from SHARDLOG_SASL_PASSWORD); without
    them the broker closes the connection and the command fails."""
    import os
    from conftest import BIN

    def run(*args, env_extra=None):
        env = {**os.environ, **(env_extra or {})}
        return subprocess.run([str(BIN), *args, "-b", sasl_broker.bootstrap], capture_output=True, text=True,
                              timeout=30, env=env)

    login = {"SHARDLOG_SASL_USERNAME": ADMIN[0], "SHARDLOG_SASL_PASSWORD": ADMIN[1]}
    refused = run("topic", "list")
    assert refused.returncode != 0, refused.stdout
    added = run("user", "add", "erin", "--mechanism", "SCRAM-SHA-256", "--iterations", "8192",
                env_extra={**login, "SHARDLOG_USER_PASSWORD": "erin-pw"})
    assert added.returncode == 0, added.stderr
    listed = run("user", "list", env_extra=login)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert sorted(rows) == ["admin", "erin"]
    assert "SCRAM-SHA-256 (8192 iterations)" in rows["erin"] and "SCRAM-SHA-512" not in rows["erin"]
    # erin logs in (PLAIN, checked against her SCRAM-SHA-256 credential) and creates a topic.
    as_erin = {"SHARDLOG_SASL_USERNAME": "erin", "SHARDLOG_SASL_PASSWORD": "erin-pw", "SHARDLOG_SASL_MECHANISM": "PLAIN"}
    topic = unique_topic("by-erin")
    created = run("topic", "create", topic, "--partitions", "2", env_extra=as_erin)
    assert created.returncode == 0, created.stderr
    assert topic in run("topic", "list", env_extra=login).stdout
    wrong = run("topic", "list", env_extra={**as_erin, "SHARDLOG_SASL_PASSWORD": "nope"})
    assert wrong.returncode != 0 and "SaslAuthenticationFailed" in wrong.stderr, wrong.stderr
    deleted = run("user", "delete", "erin", env_extra=login)
    assert deleted.returncode == 0, deleted.stderr
    assert run("topic", "list", env_extra=as_erin).returncode != 0
    listed = run("user", "list", env_extra=login)
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == ["admin"]


def sasl_counts(metrics_port):
    """shardlog_sasl_authentications_total summed over cores, by result."""
    import re
    import urllib.request
    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    counts = {}
    for result, value in re.findall(r'^shardlog_sasl_authentications_total\{[^}]*result="(\w+)"[^}]*\} (\d+)', body, re.M):
        counts[result] = counts.get(result, 0) + int(value)
    return counts


def test_a_login_that_never_finishes_is_closed_and_a_flood_of_failures_is_throttled(broker_factory):
    """A connection that has not logged in 10 s after it opened is closed;
    past --sasl-login-failures-max failed logins in 10 s from one address,
    its logins are refused unchecked (other addresses are not) until the
    window ends; all of it is counted in the metrics."""
    from conftest import pick_ports
    metrics = pick_ports(1)
    b = broker_factory("per-core", 2, extra_args=SASL_ARGS + ["--sasl-login-failures-max", "5",
                                                              "--metrics-port", str(metrics)])
    addr = ("127.0.0.1", b.port)
    opened = time.monotonic()
    silent = socket.create_connection(addr, timeout=20)
    chatty = socket.create_connection(addr, timeout=20)
    chatty.sendall(frame(18, 0, b""))
    assert read_frame(chatty) is not None
    assert closed(silent, timeout=20) and closed(chatty, timeout=20)
    assert 9 <= time.monotonic() - opened <= 15
    silent.close()
    chatty.close()

    # Five failures from 127.0.0.1, over both cores' ports.
    for i in range(5):
        with socket.create_connection(("127.0.0.1", b.ports[i % 2]), timeout=5) as s:
            handshake(s, "PLAIN")
            assert authenticate(s, b"\0admin\0nope")[0] == 58
    window = time.monotonic()
    with socket.create_connection(addr, timeout=5) as s:
        handshake(s, "PLAIN")
        error, message = authenticate(s, b"\0admin\0admin-secret")
        assert error == 58 and "too many failed logins" in message
    with socket.create_connection(addr, timeout=5, source_address=("127.0.0.2", 0)) as s:
        handshake(s, "PLAIN")
        assert authenticate(s, b"\0admin\0admin-secret") == (0, None)
    counts = sasl_counts(metrics)
    assert counts.get("timeout", 0) == 2 and counts.get("failed", 0) == 5 and counts.get("ok", 0) == 1, counts
    assert counts.get("throttled", 0) == 1, counts
    time.sleep(max(0.0, 10.5 - (time.monotonic() - window)))
    with socket.create_connection(addr, timeout=5) as s:
        handshake(s, "PLAIN")
        assert authenticate(s, b"\0admin\0admin-secret") == (0, None)
