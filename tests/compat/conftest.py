"""Fixtures and helpers for shardlog's real-client compatibility suite.

The suite runs unmodified Kafka clients (confluent-kafka/librdkafka,
kafka-python, kcat, kafkajs) against a real `target/release/shardlog` broker
started per test in a temporary data directory. Nothing is built here: run
`cargo build --release` first (tests/run-all.sh does).

Environment knobs:
  SHARDLOG_BIN             broker binary [target/release/shardlog]
  SHARDLOG_TEST_LOG_LEVEL  broker --log-level [warn]; use `debug` for repros
  SHARDLOG_TEST_PIN        broker --pin true|false [broker default]

Consumers: consumer groups are not implemented yet, so every consumer here
uses manual partition assignment. The `ck_consumer` / `kp_consumer` factory
fixtures take `assign=` today; when groups land, give them `subscribe=` (and
drop the manual-assignment helpers where groups are the point of the test).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import pytest

REPO = Path(__file__).resolve().parents[2]
COMPAT_DIR = Path(__file__).resolve().parent
BIN = Path(os.environ.get("SHARDLOG_BIN", REPO / "target" / "release" / "shardlog"))
LOG_LEVEL = os.environ.get("SHARDLOG_TEST_LOG_LEVEL", "warn")

# (listener, cores) combinations the round-trip tests run under.
MODES = [("per-core", 1), ("per-core", 2), ("shared", 2)]
MODE_IDS = [f"{listener}-{cores}" for listener, cores in MODES]

PARTITIONS = 6
NUM_RECORDS = 10_000


TEST_TIMEOUT_S = int(os.environ.get("SHARDLOG_TEST_TIMEOUT", "180"))


def pytest_configure(config):
    # kafka-python 3.x uses deprecated importlib.resources calls; not our concern.
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:kafka.*")
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:importlib.*")


def pytest_collection_modifyitems(config, items):
    # A hung client or broker fails its test instead of stalling the suite
    # (pytest-timeout, pinned in requirements.txt).
    if config.pluginmanager.hasplugin("timeout"):
        for item in items:
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S))


# --------------------------------------------------------------------------
# Broker process management
# --------------------------------------------------------------------------

def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_ports(count: int, attempts: int = 200) -> int:
    """A base port P such that P..P+count-1 are all free on 127.0.0.1.

    Drawn below the Linux ephemeral range so client sockets don't collide."""
    rng = random.Random()
    for _ in range(attempts):
        base = rng.randrange(12000, 32000 - count)
        if all(_port_free(base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no run of {count} free ports found")


def _can_connect(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class Broker:
    listener: str
    cores: int
    data_dir: Path
    log_path: Path
    port: int
    log_level: str = LOG_LEVEL
    proc: Optional[subprocess.Popen] = None
    starts: int = 0
    extra_args: List[str] = field(default_factory=list)
    # A machine in a network namespace of its own (`NetnsMachines`): its
    # address there, and the namespace it runs in.
    host: str = "127.0.0.1"
    netns: Optional[str] = None

    # ---- addressing ----
    @property
    def ports(self) -> List[int]:
        if self.listener == "per-core":
            return [self.port + i for i in range(self.cores)]
        return [self.port]

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def bootstrap_all(self) -> str:
        return ",".join(f"{self.host}:{p}" for p in self.ports)

    @property
    def mode(self) -> str:
        return f"{self.listener}-{self.cores}"

    # ---- lifecycle ----
    def command(self) -> List[str]:
        cmd = [
            str(BIN), "serve",
            "--data", str(self.data_dir),
            "--port", str(self.port),
            "--cores", str(self.cores),
            "--listener", self.listener,
            "--log-level", self.log_level,
        ]
        if "--metrics-port" not in self.extra_args:
            cmd += ["--metrics-port", "0"]
        pin = os.environ.get("SHARDLOG_TEST_PIN")
        if pin:
            cmd += ["--pin", pin]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns] + cmd + ["--host", self.host]
        return cmd + list(self.extra_args)

    def start(self, timeout: float = 30.0) -> None:
        assert self.proc is None or self.proc.poll() is not None, "broker already running"
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start #{self.starts}: {' '.join(self.command())}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, cwd=str(self.data_dir.parent),
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                pytest.fail(f"broker exited with code {rc} during startup\n{self.log_tail()}")
            if all(_can_connect(p, self.host) for p in self.ports):
                return
            time.sleep(0.05)
        self.proc.kill()
        self.proc.wait()
        pytest.fail(f"broker did not accept connections on {self.ports} within {timeout}s\n{self.log_tail()}")

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit code (fails the test on a hang)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                pytest.fail(f"broker did not exit within {timeout}s of SIGTERM\n{self.log_tail()}")
        return self.proc.returncode

    def restart(self) -> None:
        """Clean restart: SIGTERM, require exit code 0, start on the same dir/ports."""
        rc = self.stop()
        assert rc == 0, f"broker exited with {rc} on SIGTERM\n{self.log_tail()}"
        self._wait_ports_released()
        self.start()

    def kill(self) -> None:
        """Crash: SIGKILL and reap. Call start() to bring it back."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._wait_ports_released()

    def _wait_ports_released(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(_can_connect(p, self.host) for p in self.ports):
            time.sleep(0.05)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_text().splitlines()[-lines:]
        return f"--- broker log ({self.log_path}) ---\n" + "\n".join(text)

    # ---- admin via the shardlog CLI ----
    def cli(self, *args: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
        cmd = [str(BIN), *args]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}{res.stderr}\n{self.log_tail()}")
        return res

    def create_topic(self, name: str, partitions: int = PARTITIONS, configs: Sequence[str] = ()) -> str:
        args = ["topic", "create", name, "--partitions", str(partitions), "-b", self.bootstrap]
        for c in configs:
            args += ["--config", c]
        self.cli(*args)
        return name


def start_machines(work: Path, count: int, cores: int, extra: Callable[[int, int], List[str]] = lambda i, base: [],
                   spare_ports: int = 0) -> List[Broker]:
    """`count` machines of one cluster on 127.0.0.1, all controller voters,
    started together (none serves before a quorum of voters runs). Machine
    i (0-based) gets ports base .. base + cores (Kafka, then its controller
    port), then `spare_ports` more for `extra(i, base)` to use (gossip,
    metrics), and its data in `work/m{i+1}/data`."""
    _require_binary()
    per = cores + 1 + spare_ports
    first = pick_ports(count * per)
    voters = ",".join(f"{i + 1}@127.0.0.1:{first + i * per + cores}" for i in range(count))
    machines = []
    for i in range(count):
        base = first + i * per
        data = work / f"m{i + 1}" / "data"
        data.mkdir(parents=True)
        machines.append(Broker(listener="per-core", cores=cores, data_dir=data,
                               log_path=work / f"m{i + 1}" / "broker.log", port=base,
                               extra_args=["--machine-id", str(i + 1), "--controller-voters", voters,
                                           *extra(i, base)]))
    threads = [threading.Thread(target=m.start, args=(60.0,)) for m in machines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(m.running() for m in machines), "every machine started"
    return machines


class NetnsMachines:
    """Machines of one cluster, each in a network namespace of its own with
    an address on a bridge (198.18.1.0/24, RFC 2544's range for tests; the
    recipe of ../shared/netns.md), reached by the test through a link of its
    own (198.18.1.100), so that nftables inside a namespace can cut a
    machine off from the others while clients still reach it. `close`
    removes every namespace and link, also after a failure."""

    SUBNET = "198.18.1"
    HOST = "198.18.1.100"

    def __init__(self, count: int):
        self.count = count
        self.prefix = f"slpy{os.getpid() % 10000}"
        self.hub = f"{self.prefix}hub"
        self.cuts = set()
        try:
            self._run("ip", "netns", "add", self.hub)
            self._run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
            self._run("ip", "-n", self.hub, "link", "set", "br0", "up")
            for i in range(count):
                ns, veth = self.ns(i), f"{self.prefix}v{i}"
                self._run("ip", "netns", "add", ns)
                self._run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
                self._run("ip", "link", "set", veth, "netns", self.hub)
                self._run("ip", "-n", self.hub, "link", "set", veth, "master", "br0", "up")
                self._run("ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
                self._run("ip", "-n", ns, "link", "set", "eth0", "up")
                self._run("ip", "-n", ns, "link", "set", "lo", "up")
            host, peer = f"{self.prefix}h", f"{self.prefix}hb"
            self._run("ip", "link", "add", host, "type", "veth", "peer", "name", peer, "netns", self.hub)
            self._run("ip", "-n", self.hub, "link", "set", peer, "master", "br0", "up")
            self._run("ip", "addr", "add", f"{self.HOST}/24", "dev", host)
            self._run("ip", "link", "set", host, "up")
        except Exception:
            self.close()
            raise

    @staticmethod
    def _run(*args: str) -> None:
        subprocess.run(list(args), check=True, capture_output=True)

    def ns(self, i: int) -> str:
        return f"{self.prefix}m{i}"

    def address(self, i: int) -> str:
        return f"{self.SUBNET}.{i + 1}"

    def cut(self, a: int, b: int) -> None:
        """Drops every packet between machines a and b, both ways, silently."""
        for me, other in ((a, b), (b, a)):
            ns = self.ns(me)
            self._run("ip", "netns", "exec", ns, "nft", "add", "table", "inet", "cut")
            for chain, hook, fld in (("out", "output", "daddr"), ("in", "input", "saddr")):
                self._run("ip", "netns", "exec", ns, "nft", "add", "chain", "inet", "cut", chain,
                          f"{{ type filter hook {hook} priority 0; }}")
                self._run("ip", "netns", "exec", ns, "nft", "add", "rule", "inet", "cut", chain,
                          "ip", fld, self.address(other), "drop")
        self.cuts.add((min(a, b), max(a, b)))

    def isolate(self, i: int) -> None:
        for other in range(self.count):
            if other != i:
                self.cut(i, other)

    def heal(self) -> None:
        for i in range(self.count):
            subprocess.run(["ip", "netns", "exec", self.ns(i), "nft", "delete", "table", "inet", "cut"],
                           capture_output=True)
        self.cuts.clear()

    def close(self) -> None:
        subprocess.run(["ip", "link", "del", f"{self.prefix}h"], capture_output=True)
        for i in range(self.count):
            subprocess.run(["ip", "netns", "del", self.ns(i)], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.hub], capture_output=True)


def start_machines_netns(work: Path, net: NetnsMachines, cores: int,
                         extra: Callable[[int, int], List[str]] = lambda i, base: []) -> List[Broker]:
    """`start_machines`, each machine in its namespace of `net` at its
    address there (the same ports on every machine)."""
    _require_binary()
    base = 19092
    voters = ",".join(f"{i + 1}@{net.address(i)}:{base + cores}" for i in range(net.count))
    machines = []
    for i in range(net.count):
        data = work / f"m{i + 1}" / "data"
        data.mkdir(parents=True)
        machines.append(Broker(listener="per-core", cores=cores, data_dir=data,
                               log_path=work / f"m{i + 1}" / "broker.log", port=base,
                               host=net.address(i), netns=net.ns(i),
                               extra_args=["--machine-id", str(i + 1), "--controller-voters", voters,
                                           *extra(i, base)]))
    threads = [threading.Thread(target=m.start, args=(60.0,)) for m in machines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(m.running() for m in machines), "every machine started"
    return machines


def _require_binary() -> None:
    if not BIN.is_file() or not os.access(BIN, os.X_OK):
        pytest.fail(
            f"broker binary {BIN} is missing: build it first with `cargo build --release` "
            f"(tests/run-all.sh does), or point SHARDLOG_BIN at one",
            pytrace=False,
        )


@pytest.fixture
def broker_factory(tmp_path, request):
    """Start brokers: factory(listener, cores) -> Broker (running).

    Every broker started is SIGTERMed at teardown and must exit with code 0
    (unless the test SIGKILLed it and did not start it again)."""
    _require_binary()
    started: List[Broker] = []

    def make(listener: str = "per-core", cores: int = 2, extra_args: Sequence[str] = ()) -> Broker:
        n = len(started)
        data = tmp_path / f"broker{n}" / "data"
        data.mkdir(parents=True)
        span = cores if listener == "per-core" else 1
        b = Broker(listener=listener, cores=cores, data_dir=data,
                   log_path=tmp_path / f"broker{n}" / "broker.log",
                   port=pick_ports(span), extra_args=list(extra_args))
        started.append(b)
        b.start()
        return b

    yield make

    failures = []
    for b in started:
        if b.running():
            rc = b.stop()
            if rc != 0:
                failures.append(f"broker {b.mode} exited with code {rc} on SIGTERM\n{b.log_tail()}")
        log = b.log_text()
        if "panicked" in log:
            failures.append(f"broker {b.mode} panicked\n{b.log_tail(120)}")
    if os.environ.get("SHARDLOG_TEST_KEEP_LOGS"):
        keep = Path(os.environ["SHARDLOG_TEST_KEEP_LOGS"])
        keep.mkdir(parents=True, exist_ok=True)
        for i, b in enumerate(started):
            shutil.copy(b.log_path, keep / f"{request.node.name}-{i}.log".replace("/", "_"))
    if failures:
        pytest.fail("\n\n".join(failures), pytrace=False)


@pytest.fixture(params=MODES, ids=MODE_IDS)
def broker(request, broker_factory) -> Broker:
    """A running broker, once per (listener, cores) mode."""
    listener, cores = request.param
    return broker_factory(listener, cores)


@pytest.fixture
def broker2(broker_factory) -> Broker:
    """A single running broker (per-core, 2 cores) for tests that don't need every mode."""
    return broker_factory("per-core", 2)


_topic_counter = 0


def unique_topic(prefix: str = "compat") -> str:
    global _topic_counter
    _topic_counter += 1
    return f"{prefix}-{os.getpid()}-{_topic_counter}-{random.randrange(1 << 30):x}"


# --------------------------------------------------------------------------
# Test data
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class Rec:
    key: bytes
    value: bytes
    headers: Tuple[Tuple[str, bytes], ...]


def make_records(n: int = NUM_RECORDS, seed: int = 1, text_only: bool = False) -> List[Rec]:
    """Deterministic keyed records with headers.

    Keys repeat (key-0..key-996) so partitions get many records per key;
    values vary in length (0..~300 bytes) and, unless text_only, contain
    arbitrary bytes. Each record carries a sequence header, a repeated header
    name, and every 7th record an empty header value."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        key = f"key-{i % 997}".encode()
        body_len = rng.randrange(0, 300)
        if text_only:
            alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 -_."
            body = "".join(rng.choice(alphabet) for _ in range(body_len)).encode()
        else:
            body = bytes(rng.getrandbits(8) for _ in range(body_len))
        value = f"value-{i}|".encode() + body
        headers = [("seq", str(i).encode()), ("tag", b"a"), ("tag", f"b{i % 3}".encode())]
        if i % 7 == 0:
            headers.append(("empty", b""))
        out.append(Rec(key, value, tuple(headers)))
    return out


def murmur2(data: bytes) -> int:
    """Kafka's (Java client's) murmur2, as used by its default partitioner."""
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    r = 24
    h = seed ^ length
    length4 = length // 4
    for i in range(length4):
        i4 = i * 4
        k = (data[i4] & 0xFF) + ((data[i4 + 1] & 0xFF) << 8) + \
            ((data[i4 + 2] & 0xFF) << 16) + ((data[i4 + 3] & 0xFF) << 24)
        k &= 0xFFFFFFFF
        k = (k * m) & 0xFFFFFFFF
        k ^= (k % 0x100000000) >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
        h &= 0xFFFFFFFF
    extra = length % 4
    if extra >= 3:
        h ^= (data[(length & ~3) + 2] & 0xFF) << 16
    if extra >= 2:
        h ^= (data[(length & ~3) + 1] & 0xFF) << 8
    if extra >= 1:
        h ^= data[length & ~3] & 0xFF
        h = (h * m) & 0xFFFFFFFF
    h ^= (h % 0x100000000) >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= (h % 0x100000000) >> 15
    return h


def murmur2_partition(key: bytes, partitions: int = PARTITIONS) -> int:
    """Partition Java/kafka-python/kafkajs (and librdkafka murmur2_random) pick for a key."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def crc32_partition(key: bytes, partitions: int = PARTITIONS) -> int:
    """librdkafka's `consistent` partitioner."""
    return zlib.crc32(key) % partitions


def expected_by_partition(records: Iterable[Rec], partition_of: Callable[[bytes], int],
                          partitions: int = PARTITIONS) -> Dict[int, List[Rec]]:
    """Records grouped by the partition the client's partitioner assigns, in send order."""
    out: Dict[int, List[Rec]] = {p: [] for p in range(partitions)}
    for rec in records:
        out[partition_of(rec.key)].append(rec)
    return out


@dataclass(frozen=True)
class Consumed:
    partition: int
    offset: int
    key: Optional[bytes]
    value: Optional[bytes]
    headers: Tuple[Tuple[str, bytes], ...]

    def rec(self) -> Rec:
        return Rec(self.key, self.value, self.headers)


def group_consumed(consumed: Iterable[Consumed]) -> Dict[int, List[Consumed]]:
    out: Dict[int, List[Consumed]] = {p: [] for p in range(PARTITIONS)}
    for c in consumed:
        out.setdefault(c.partition, []).append(c)
    return out


def _describe_rec(r) -> str:
    return f"key={r.key!r} value={r.value[:40]!r}... headers={r.headers!r}"


def assert_partitions_match(expected: Dict[int, List[Rec]], consumed: Iterable[Consumed],
                            start_offsets: Optional[Dict[int, int]] = None) -> None:
    """Every partition holds exactly its expected records, in order, at contiguous offsets."""
    got = group_consumed(consumed)
    problems = []
    for p in sorted(set(expected) | set(got)):
        exp = expected.get(p, [])
        have = got.get(p, [])
        base = (start_offsets or {}).get(p, 0)
        offsets = [c.offset for c in have]
        if offsets != list(range(base, base + len(have))):
            problems.append(f"partition {p}: offsets not contiguous from {base}: "
                            f"{offsets[:5]}...{offsets[-5:]}")
        if len(have) != len(exp):
            problems.append(f"partition {p}: expected {len(exp)} records, consumed {len(have)}")
        for i, (e, c) in enumerate(zip(exp, have)):
            if e != c.rec():
                problems.append(f"partition {p} index {i} (offset {c.offset}) differs:\n"
                                f"  expected {_describe_rec(e)}\n  consumed {_describe_rec(c)}")
                break
    assert not problems, "round trip mismatch:\n" + "\n".join(problems[:20])


# --------------------------------------------------------------------------
# Consumer helpers (manual assignment today; subscribe= once groups land)
# --------------------------------------------------------------------------

@pytest.fixture
def ck_consumer():
    """Factory for confluent-kafka consumers, closed at teardown.

    ck_consumer(broker, assign=[TopicPartition...]) -> Consumer (manual assignment)
    ck_consumer(broker, subscribe=[topic], group_id=...) -> Consumer (group; needs
    FindCoordinator/JoinGroup, not implemented yet)."""
    from confluent_kafka import Consumer

    consumers = []

    def make(broker: Broker, assign=None, subscribe=None, group_id: Optional[str] = None, **conf):
        cfg = {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group_id or f"unused-{unique_topic('group')}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 100,
        }
        cfg.update(conf)
        c = Consumer(cfg)
        consumers.append(c)
        if assign is not None:
            c.assign(assign)
        if subscribe is not None:
            c.subscribe(subscribe)
        return c

    yield make
    for c in consumers:
        try:
            c.close()
        except Exception:
            pass


def ck_consume_all(consumer, topic: str, expected_count: int, partitions: int = PARTITIONS,
                   timeout: float = 60.0) -> List[Consumed]:
    """Read an assigned topic until every partition hit EOF and `expected_count` records arrived."""
    from confluent_kafka import KafkaError

    out: List[Consumed] = []
    eof = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msgs = consumer.consume(num_messages=1000, timeout=0.5)
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                    continue
                raise AssertionError(f"consumer error on {m.topic()}[{m.partition()}]: {err}")
            assert m.topic() == topic
            eof.discard(m.partition())
            out.append(Consumed(m.partition(), m.offset(), m.key(), m.value(),
                                tuple((k, v if v is not None else None) for k, v in (m.headers() or []))))
        if len(eof) == partitions and len(out) >= expected_count:
            break
    else:
        raise AssertionError(f"timed out after {timeout}s: consumed {len(out)}/{expected_count}, "
                             f"partitions at EOF: {sorted(eof)}")
    return out


def ck_read_topic(ck_consumer, broker: Broker, topic: str, expected_count: int,
                  partitions: int = PARTITIONS, **conf) -> List[Consumed]:
    """Manual-assignment read of a whole topic from the beginning with confluent-kafka."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    c = ck_consumer(broker, assign=[TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)], **conf)
    return ck_consume_all(c, topic, expected_count, partitions)


@pytest.fixture
def kp_consumer():
    """Factory for kafka-python consumers, closed at teardown.

    kp_consumer(broker, assign=[TopicPartition...]) -> KafkaConsumer (group_id=None,
    seeked to the beginning); kp_consumer(broker, subscribe=[topic], group_id=...)
    once groups land."""
    from kafka import KafkaConsumer

    consumers = []

    def make(broker: Broker, assign=None, subscribe=None, group_id: Optional[str] = None, **conf):
        cfg = dict(bootstrap_servers=broker.bootstrap, group_id=group_id,
                   enable_auto_commit=False, auto_offset_reset="earliest",
                   fetch_max_wait_ms=100, request_timeout_ms=30000)
        cfg.update(conf)
        c = KafkaConsumer(**cfg)
        consumers.append(c)
        if assign is not None:
            c.assign(assign)
            c.seek_to_beginning(*assign)
        if subscribe is not None:
            c.subscribe(subscribe)
        return c

    yield make
    for c in consumers:
        try:
            c.close()
        except Exception:
            pass
