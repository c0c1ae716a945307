"""Helpers for the consumer-group tests (test_groups.py) and measure_rebalance.py.

Each group member runs as its own process (groups_consumer.py for
confluent-kafka and kafka-python, kafkajs/groups.js for kafkajs) so a test can
SIGKILL it (crash) or SIGTERM it (graceful close: consumer.close() /
disconnect(), which sends LeaveGroup). Members print JSON lines; `Member`
reads them on a thread and keeps the member's current assignment, the records
it printed, those its commits cover and the offsets it committed.

What the tests check with these:
  * a record is consumed once a commit covers it: the member that printed it
    committed past it (or was SIGKILLed with that commit in flight, which the
    broker may have applied); a record printed and never committed counts
    only when a later owner reads it again and commits (`wait_all_consumed`);
  * no partition is held by two members at any moment of the run, by the
    assignment intervals of the members' own logs (`assert_exclusive_ownership`);
  * member errors are only the expected kinds, named
    (`assert_member_errors`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

COMPAT_DIR = Path(__file__).resolve().parent
PY_CONSUMER = COMPAT_DIR / "groups_consumer.py"
JS_DIR = COMPAT_DIR / "kafkajs"
JS_CONSUMER = JS_DIR / "groups.js"
NODE = shutil.which("node")

CLIENTS = ["confluent", "kafka-python", "kafkajs"]

# Broker flags for every group test: no initial-rebalance wait, so the first
# member of a fresh group is assigned at once.
GROUP_BROKER_ARGS = ["--group-initial-rebalance-delay-ms", "0"]

SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 1000

TP = Tuple[str, int]


def kafkajs_problem() -> Optional[str]:
    """Why kafkajs members cannot run here, or None."""
    if NODE is None:
        return "node is not installed"
    pkg = JS_DIR / "node_modules" / "kafkajs" / "package.json"
    if not pkg.is_file():
        return f"kafkajs is not installed: run `npm ci` in {JS_DIR} (tests/setup.sh does)"
    return None


class Member:
    """One consumer-group member process and what it has reported."""

    def __init__(self, client: str, bootstrap: str, group: str, topics: Sequence[str], name: str,
                 log_dir: Path, session_timeout_ms: int = SESSION_TIMEOUT_MS,
                 heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS, rack: Optional[str] = None,
                 kafkajs_retries: Optional[int] = None):
        self.client = client
        self.name = name
        self.group = group
        spec = dict(client=client, bootstrap=bootstrap, group=group, topics=list(topics),
                    session_timeout_ms=session_timeout_ms, heartbeat_interval_ms=heartbeat_interval_ms,
                    client_id=f"{client}-{name}")
        if rack is not None:
            spec["rack_id"] = rack
        if kafkajs_retries is not None:
            spec["retries"] = kafkajs_retries
        if client == "kafkajs":
            cmd = [NODE, str(JS_CONSUMER), json.dumps(spec)]
            cwd = JS_DIR
        else:
            cmd = [sys.executable, str(PY_CONSUMER), json.dumps(spec)]
            cwd = COMPAT_DIR
        self.stderr_path = Path(log_dir) / f"member-{group}-{name}.stderr"
        self._stderr = open(self.stderr_path, "wb")
        self.cond = threading.Condition()
        self.events: List[dict] = []
        self.assigned: frozenset = frozenset()
        self.assigned_at: float = 0.0
        self.assignments = 0
        self.records: List[Tuple[str, int, int, Optional[str]]] = []
        # Records a confirmed commit of this member covers, and those printed
        # since its last commit of their partition.
        self.commit_covered: Dict[Tuple[str, int, int], Optional[str]] = {}
        self._uncommitted: Dict[TP, List[Tuple[int, Optional[str]]]] = {}
        # The offsets of a commit sent and not yet answered.
        self._commit_in_flight: Optional[List[Tuple[str, int, int]]] = None
        self.killed_at: Optional[float] = None
        self.committed: Dict[TP, int] = {}
        self.commit_errors: List[str] = []
        self.errors: List[str] = []
        self.closed_at: Optional[float] = None
        self.started = time.time()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr,
                                     stdin=subprocess.DEVNULL, cwd=str(cwd))
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"member-{name}")
        self._reader.start()

    # ---- event intake ----
    def _read(self):
        for raw in self.proc.stdout:
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            with self.cond:
                self.events.append(ev)
                kind = ev["ev"]
                if kind == "assigned":
                    self.assigned = frozenset((t, p) for t, p in ev["parts"])
                    self.assigned_at = ev["t"]
                    self.assignments += 1
                elif kind == "revoked":
                    self.assigned = frozenset()
                    self.assigned_at = ev["t"]
                elif kind == "rec":
                    self.records.append((ev["topic"], ev["p"], ev["o"], ev["v"]))
                    self._uncommitted.setdefault((ev["topic"], ev["p"]), []).append((ev["o"], ev["v"]))
                elif kind == "committing":
                    self._commit_in_flight = [tuple(tpo) for tpo in ev["offsets"]]
                elif kind == "commit":
                    self._commit_in_flight = None
                    for t, p, o in ev["offsets"]:
                        self.committed[(t, p)] = o
                        self._cover((t, p), o, self.commit_covered)
                elif kind == "commit_error":
                    self._commit_in_flight = None
                    self.commit_errors.append(ev["err"])
                elif kind == "error":
                    self.errors.append(ev["err"])
                elif kind == "closed":
                    self.closed_at = ev["t"]
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def _cover(self, tp: TP, next_offset: int, into: Dict[Tuple[str, int, int], Optional[str]]):
        """Moves the printed records of `tp` below `next_offset` into `into`."""
        kept = []
        for o, v in self._uncommitted.get(tp, []):
            if o < next_offset:
                into[(tp[0], tp[1], o)] = v
            else:
                kept.append((o, v))
        self._uncommitted[tp] = kept

    # ---- control ----
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> float:
        """SIGKILL; returns the time.time() it was sent."""
        t = time.time()
        with self.cond:
            self.killed_at = t
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        return t

    def terminate(self) -> float:
        """SIGTERM (graceful close); returns the time.time() it was sent."""
        t = time.time()
        self.proc.send_signal(signal.SIGTERM)
        return t

    def wait_closed(self, timeout: float = 30.0) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.describe()} did not exit within {timeout}s of SIGTERM\n{self.stderr_tail()}")
        self._reader.join(5)
        assert rc == 0 and self.closed_at is not None, \
            f"{self.describe()} exited {rc} (closed={self.closed_at is not None})\n{self.stderr_tail()}"
        return rc

    def cleanup(self):
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self._stderr.close()

    # ---- inspection ----
    def describe(self) -> str:
        return f"{self.client} member {self.name} (pid {self.proc.pid}, group {self.group})"

    def stderr_tail(self, lines: int = 30) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace").splitlines()[-lines:]
        except FileNotFoundError:
            text = []
        return f"--- {self.describe()} stderr ---\n" + "\n".join(text)

    def offsets_seen(self) -> List[Tuple[str, int, int]]:
        with self.cond:
            return [(t, p, o) for t, p, o, _ in self.records]

    def consumed(self) -> Dict[Tuple[str, int, int], Optional[str]]:
        """The records this member printed and then committed past, and, if
        it was SIGKILLed with a commit in flight, those that commit covers
        (the broker may have applied it). Not what it printed after its last
        commit: those count only once their next owner commits them."""
        with self.cond:
            out = dict(self.commit_covered)
            if self.killed_at is not None and self._commit_in_flight:
                pending = {tp: list(records) for tp, records in self._uncommitted.items()}
                for t, p, o in self._commit_in_flight:
                    out.update({(t, p, ro): v for ro, v in pending.get((t, p), []) if ro < o})
            return out

    def ownership(self) -> Dict[TP, List[Tuple[float, float]]]:
        """When this member held each partition, by its own log: from an
        "assigned" that names it to the next "revoked" (or "assigned" that
        does not name it), else to its end: its SIGKILL, its exit, or now."""
        with self.cond:
            events = list(self.events)
            if self.killed_at is not None:
                end = self.killed_at
            elif self.closed_at is not None:
                end = self.closed_at
            else:
                end = time.time()
        held: Dict[TP, float] = {}
        out: Dict[TP, List[Tuple[float, float]]] = {}
        for ev in events:
            if ev["ev"] == "assigned":
                now = {(t, p) for t, p in ev["parts"]}
                for tp in [tp for tp in held if tp not in now]:
                    out.setdefault(tp, []).append((held.pop(tp), ev["t"]))
                for tp in now:
                    held.setdefault(tp, ev["t"])
            elif ev["ev"] == "revoked":
                for tp, start in held.items():
                    out.setdefault(tp, []).append((start, ev["t"]))
                held = {}
        for tp, start in held.items():
            out.setdefault(tp, []).append((start, max(end, start)))
        return out

    def wait_for(self, predicate, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        with self.cond:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.describe()}: timed out after {timeout}s waiting for {what}; "
                                         f"assigned={sorted(self.assigned)} records={len(self.records)} "
                                         f"alive={self.alive()}\n{self.stderr_tail()}")
                self.cond.wait(min(left, 0.1))


def cleanup_members(members: Iterable[Member]):
    for m in members:
        try:
            m.cleanup()
        except Exception:
            pass


def balanced(members: Sequence[Member], partitions: Set[TP]) -> bool:
    """The members' current assignments split `partitions` exactly: disjoint, complete, none empty."""
    seen: Set[TP] = set()
    for m in members:
        a = m.assigned
        if not a or a & seen:
            return False
        seen |= a
    return seen == partitions


def wait_balanced(members: Sequence[Member], partitions: Set[TP], timeout: float, what: str = "") -> float:
    """Wait until `balanced`; returns the time.time() the last member reported its part."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if balanced(members, partitions):
            return max(m.assigned_at for m in members)
        dead = [m for m in members if not m.alive()]
        if dead:
            raise AssertionError(f"{dead[0].describe()} exited while waiting for a balanced group\n"
                                 f"{dead[0].stderr_tail()}")
        time.sleep(0.02)
    state = "\n".join(f"  {m.describe()}: {sorted(p for _, p in m.assigned)} "
                      f"({m.assignments} assignments)" for m in members)
    tails = "\n".join(m.stderr_tail(15) for m in members)
    raise AssertionError(f"group not balanced over {len(partitions)} partitions within {timeout}s {what}\n"
                         f"{state}\n{tails}")


def consumed_union(members: Iterable[Member]) -> Dict[Tuple[str, int, int], Optional[str]]:
    """Every record some member consumed: printed, then covered by its commit."""
    out = {}
    for m in members:
        out.update(m.consumed())
    return out


def printed_union(members: Iterable[Member]) -> Dict[Tuple[str, int, int], Optional[str]]:
    """Every record some member printed, committed or not."""
    out = {}
    for m in members:
        with m.cond:
            for t, p, o, v in m.records:
                out[(t, p, o)] = v
    return out


def wait_all_consumed(members: Sequence[Member], produced: Dict[Tuple[str, int, int], str],
                      timeout: float, what: str = "") -> Dict[Tuple[str, int, int], Optional[str]]:
    """Wait until every produced (topic, partition, offset) was consumed by some
    member (printed, then committed: see `Member.consumed`), then check each
    value any member printed is the one produced there."""
    deadline = time.monotonic() + timeout
    while True:
        got = consumed_union(members)
        missing = [k for k in produced if k not in got]
        if not missing:
            break
        if time.monotonic() > deadline:
            by_part: Dict[int, List[int]] = {}
            for t, p, o in missing:
                by_part.setdefault(p, []).append(o)
            summary = {p: (len(os_), min(os_), max(os_)) for p, os_ in sorted(by_part.items())}
            state = "\n".join(f"  {m.describe()}: alive={m.alive()} assigned="
                              f"{sorted(p for _, p in m.assigned)} records={len(m.records)} "
                              f"commit_errors={len(m.commit_errors)} {m.commit_errors[-3:]} errors={m.errors[-3:]}"
                              for m in members)
            printed = printed_union(members)
            uncommitted = sorted(k for k in missing if k in printed)
            raise AssertionError(f"{len(missing)} of {len(produced)} produced records never consumed {what} "
                                 f"(partition: (count, first, last)) {summary}; {len(uncommitted)} of them "
                                 f"printed but never committed, first {uncommitted[:3]}\n{state}")
        time.sleep(0.1)
    printed = printed_union(members)
    wrong = [(k, produced[k], printed[k]) for k in printed if k in produced and printed[k] != produced[k]]
    assert not wrong, f"consumed values differ from produced ones: {wrong[:5]}"
    extra = [k for k in printed if k not in produced]
    assert not extra, f"consumed records nobody produced: {sorted(extra)[:5]}"
    return got


def assert_exclusive_ownership(members: Sequence[Member]):
    """No partition was held by two members of one group at any moment of
    the run: their assignment intervals (`Member.ownership`) for each
    partition are disjoint in time. Under the eager protocol a member's
    revocation comes before it rejoins, and the next owner's assignment after
    every member has rejoined, so one interval ends before the next begins.
    They may touch: kafkajs stamps whole milliseconds, which keeps the order
    of a revocation and a later assignment but may give both the same stamp."""
    spans: Dict[TP, List[Tuple[float, float, str]]] = {}
    for m in members:
        for tp, intervals in m.ownership().items():
            spans.setdefault(tp, []).extend((start, end, m.name) for start, end in intervals)
    overlaps = []
    for tp, items in sorted(spans.items()):
        items.sort()
        for i, (start, end, name) in enumerate(items):
            for other_start, other_end, other in items[i + 1:]:
                if other_start >= end:
                    break
                if other != name:
                    overlaps.append(f"{tp}: {name} held it {start:.3f}..{end:.3f}, "
                                    f"{other} {other_start:.3f}..{other_end:.3f}")
    assert not overlaps, "partitions held by two members at once:\n" + "\n".join(overlaps[:20])


# Commit failures a member may meet, by kind. The eager protocol ends a
# generation while members process: a commit that races the rebalance fails,
# and the records it covered are read again by their next owner.
COMMIT_RACED_REBALANCE = ("REBALANCE_IN_PROGRESS", "RebalanceInProgress", "group is rebalancing",
                          "ILLEGAL_GENERATION", "IllegalGeneration", "generation id is not valid")
# After a broker restart: shardlog does not persist group membership, so the
# first commit names a member the coordinator does not know; it rejoins.
COMMIT_AFTER_RESTART = ("UNKNOWN_MEMBER_ID", "UnknownMemberId", "not aware of this member")
# Consumer errors while the broker restarts: its connections are refused.
BROKER_RESTARTING = ("KafkaJSNoBrokerAvailableError", "KafkaJSConnectionError", "_TRANSPORT", "_ALL_BROKERS_DOWN")


def assert_member_errors(members: Iterable[Member], commit_errors: Sequence[str] = (),
                         errors: Sequence[str] = ()):
    """Every error the members reported is of an expected kind: each commit
    error contains one of `commit_errors`, each consumer error one of
    `errors` (none expected when empty)."""
    unexpected = []
    for m in members:
        with m.cond:
            unexpected += [f"{m.describe()}: commit failed: {e}" for e in m.commit_errors
                           if not any(kind in e for kind in commit_errors)]
            unexpected += [f"{m.describe()}: {e}" for e in m.errors if not any(kind in e for kind in errors)]
    assert not unexpected, "member errors of unexpected kinds:\n" + "\n".join(unexpected[:20])


# --------------------------------------------------------------------------
# Producing
# --------------------------------------------------------------------------

def produce_values(bootstrap: str, topic: str, partitions: int, count: int, start: int = 0,
                   prefix: str = "v") -> Dict[Tuple[str, int, int], str]:
    """Produce `count` records (value f"{prefix}-{i}", partition i % partitions), acks=all.
    Returns {(topic, partition, offset): value} from the delivery reports."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                  "message.timeout.ms": 60000})
    out: Dict[Tuple[str, int, int], str] = {}
    errors = []

    def cb(err, msg):
        if err is not None:
            errors.append(err)
        else:
            out[(msg.topic(), msg.partition(), msg.offset())] = msg.value().decode()

    for i in range(start, start + count):
        while True:
            try:
                p.produce(topic, value=f"{prefix}-{i}".encode(), partition=i % partitions, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0, "records undelivered after flush"
    assert not errors, f"delivery errors: {errors[:5]}"
    assert len(out) == count
    return out


class BackgroundProducer:
    """Writes value f"{prefix}-{i}" to partition i % partitions at about `rate`
    records/s on a thread until stop(), which flushes and returns
    {(topic, partition, offset): value} for every delivered record."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float = 300.0, prefix: str = "bg"):
        from confluent_kafka import Producer

        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.prefix = prefix
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                                  "message.timeout.ms": 60000})
        self.delivered: Dict[Tuple[str, int, int], str] = {}
        self.errors: List[str] = []
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bg-producer")
        self._thread.start()

    def _cb(self, err, msg):
        if err is not None:
            self.errors.append(str(err))
        else:
            self.delivered[(msg.topic(), msg.partition(), msg.offset())] = msg.value().decode()

    def _run(self):
        t0 = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - t0) * self.rate)
            while self.sent < due:
                try:
                    self.producer.produce(self.topic, value=f"{self.prefix}-{self.sent}".encode(),
                                          partition=self.sent % self.partitions, on_delivery=self._cb)
                except BufferError:
                    break
                self.sent += 1
            self.producer.poll(0.02)

    def stop(self) -> Dict[Tuple[str, int, int], str]:
        self._stop.set()
        self._thread.join(10)
        assert self.producer.flush(60) == 0, "background records undelivered after flush"
        assert not self.errors, f"background producer delivery errors: {self.errors[:5]}"
        assert len(self.delivered) == self.sent
        return dict(self.delivered)


# --------------------------------------------------------------------------
# The broker's view
# --------------------------------------------------------------------------

def describe_group(bootstrap: str, group: str, timeout: float = 10.0):
    """DescribeGroups through confluent-kafka's AdminClient:
    (state name, {member_id: frozenset of (topic, partition)})."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    desc = admin.describe_consumer_groups([group], request_timeout=timeout)[group].result(timeout)
    members = {m.member_id: frozenset((tp.topic, tp.partition) for tp in m.assignment.topic_partitions)
               for m in desc.members}
    return desc.state.name, members


def parse_describe(text: str, topic: str) -> Dict[int, Tuple[str, str, str]]:
    """`shardlog group describe` rows for `topic`: {partition: (committed, end, lag)}."""
    rows = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 5 and fields[0] == topic:
            rows[int(fields[1])] = (fields[2], fields[3], fields[4])
    return rows
