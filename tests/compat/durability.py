"""Durability checks with real clients, real disks and real kill -9 (issue 33).

Shared by test_durability.py and tests/durability/kill_loop.py (the long run).
Nothing here uses pytest fixtures; failures come back as lists of problems
(strings) so the test can assert on them and the script can print them.

The rule every check enforces: a record whose delivery report said "acknowledged
at partition P, offset O" is read back at exactly (P, O) with exactly that
value, after a full disk, after kill -9, after a clean restart; no offset is
handed to two different values; a value is stored at most once.

Pieces:
  AckLog                 what the delivery reports acknowledged, and what failed
  read_partitions        read a topic from offset 0 to its high watermark
  check_*                compare what was read with what was acknowledged
  loop_mounted_ext4      a small ext4 file system on a loop device, always torn down
  kill9                  SIGKILL the broker, after checking it had not died already
  ContinuousProducer     an idempotent acks=all producer on a thread, rate-limited
  run_kill_loop          produce while SIGKILLing and restarting the broker
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

SEED_ENV = "SHARDLOG_TEST_SEED"

# How many problems a failure message lists (the counts cover all of them).
PROBLEMS_SHOWN_MAX = 15

TopicPartitionOffset = Tuple[str, int, int]


def seed_from_env() -> int:
    """SHARDLOG_TEST_SEED when set (to replay a run), else a fresh seed."""
    env = os.environ.get(SEED_ENV)
    if env:
        return int(env)
    return random.SystemRandom().randrange(1 << 32)


def short(value: Optional[bytes]) -> str:
    if value is None:
        return "None"
    return repr(value[:48]) + ("..." if len(value) > 48 else "")


# --------------------------------------------------------------------------
# What the producer was told
# --------------------------------------------------------------------------

class AckLog:
    """Every delivery report of one or more producers, thread-safe.

    Give the Producer `on_delivery=acks.on_delivery, error_cb=acks.on_error`
    (idempotent_producer_config does). An offset acknowledged for two
    different values (offset reuse) is recorded in `reused` as soon as the
    second report arrives."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: Dict[TopicPartitionOffset, bytes] = {}
        self.reused: List[str] = []
        self.failed: List[Tuple[str, int, bytes, str]] = []
        self.failed_by_error: collections.Counter = collections.Counter()
        self.fatal: Optional[str] = None
        self.fatal_is_bare = False
        self.client_errors: collections.Counter = collections.Counter()
        self.ack_count = 0
        self.last_ack_at = 0.0  # time.monotonic() of the latest acknowledgement

    def on_delivery(self, err, msg) -> None:
        now = time.monotonic()
        with self.lock:
            if err is not None:
                self.failed.append((msg.topic(), msg.partition(), msg.value(), err.name()))
                self.failed_by_error[err.name()] += 1
                if err.fatal() or err.code() == KafkaError._FATAL:
                    self._note_fatal(err, "fatal delivery error")
                return
            key = (msg.topic(), msg.partition(), msg.offset())
            previous = self.acked.get(key)
            if previous is not None and previous != msg.value():
                self.reused.append(f"REUSED {key[0]}[{key[1]}] offset {key[2]} acknowledged twice: "
                                   f"first {short(previous)}, then {short(msg.value())}")
            self.acked[key] = msg.value()
            self.ack_count += 1
            self.last_ack_at = now

    def on_error(self, err) -> None:
        with self.lock:
            self.client_errors[err.name()] += 1
            if err.fatal():
                self._note_fatal(err, "fatal producer error")

    def note_exception(self, exc: BaseException) -> None:
        """A KafkaException from produce/poll/flush: fatal ones end the producer.

        confluent-kafka sometimes raises it as the cause of a SystemError (a
        delivery callback ran with the exception pending)."""
        if isinstance(exc, SystemError) and isinstance(exc.__cause__, KafkaException):
            exc = exc.__cause__
        err = exc.args[0] if exc.args else None
        with self.lock:
            if isinstance(err, KafkaError) and (err.fatal() or err.code() == KafkaError._FATAL):
                self._note_fatal(err, "fatal producer error")
            else:
                self.client_errors[f"exception {exc!r}"] += 1

    def _note_fatal(self, err: KafkaError, what: str) -> None:
        """Keep the first fatal error that names its cause: produce() may report
        a bare _FATAL ("Unable to produce message") before error_cb has the why."""
        if self.fatal is None or (self.fatal_is_bare and err.code() != KafkaError._FATAL):
            self.fatal = f"{what}: {err}"
            self.fatal_is_bare = err.code() == KafkaError._FATAL

    def acks_since(self, moment: float) -> bool:
        with self.lock:
            return self.last_ack_at > moment

    def acked_in(self, topic: str) -> Dict[int, Dict[int, bytes]]:
        """partition -> offset -> acknowledged value, for one topic."""
        out: Dict[int, Dict[int, bytes]] = collections.defaultdict(dict)
        with self.lock:
            for (t, p, o), v in self.acked.items():
                if t == topic:
                    out[p][o] = v
        return out

    def summary(self) -> str:
        with self.lock:
            return (f"acknowledged {self.ack_count}, failed {len(self.failed)} "
                    f"{dict(self.failed_by_error)}, client errors {dict(self.client_errors)}"
                    + (f", {self.fatal}" if self.fatal else ""))


# --------------------------------------------------------------------------
# What the broker has
# --------------------------------------------------------------------------

@dataclass
class TopicContents:
    topic: str
    # partition -> (low, high) watermarks when the read started
    watermarks: Dict[int, Tuple[int, int]]
    # partition -> [(offset, value)] in the order read
    records: Dict[int, List[Tuple[int, bytes]]]

    def count(self) -> int:
        return sum(len(r) for r in self.records.values())


def read_partitions(bootstrap: str, topic: str, partitions: int, timeout_s: float = 90.0) -> TopicContents:
    """Read every partition of `topic` from offset 0 to its high watermark.

    Manual assignment at offset 0 with auto.offset.reset=error, so a log that
    no longer starts at 0 is an error, not a silent skip; CRCs are checked."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"durability-reader-{random.randrange(1 << 30):x}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "enable.partition.eof": True,
        "check.crcs": True,
        "fetch.wait.max.ms": 100,
        "topic.metadata.refresh.interval.ms": 1000,
    })
    try:
        deadline = time.monotonic() + timeout_s
        watermarks = {p: _watermarks(consumer, topic, p, deadline) for p in range(partitions)}
        records: Dict[int, List[Tuple[int, bytes]]] = {p: [] for p in range(partitions)}
        next_offset = {p: 0 for p in range(partitions)}
        pending = {p for p in range(partitions) if watermarks[p][1] > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in sorted(pending)])
        while pending:
            if time.monotonic() > deadline:
                progress = {p: f"{next_offset[p]}/{watermarks[p][1]}" for p in sorted(pending)}
                raise AssertionError(f"reading {topic} timed out after {timeout_s}s at {progress}")
            for m in consumer.consume(num_messages=2000, timeout=0.5):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if m.offset() >= watermarks[m.partition()][1]:
                            pending.discard(m.partition())
                        continue
                    if err.retriable() or err.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
                        continue  # the client retries; the deadline bounds it
                    # A CRC error, or the offset out of range (auto.offset.reset=error).
                    raise AssertionError(f"reading {topic}[{m.partition()}] failed: {err}")
                p = m.partition()
                if m.offset() >= watermarks[p][1]:
                    pending.discard(p)
                    continue
                records[p].append((m.offset(), m.value()))
                next_offset[p] = m.offset() + 1
                if next_offset[p] >= watermarks[p][1]:
                    pending.discard(p)
        return TopicContents(topic, watermarks, records)
    finally:
        consumer.close()


def _watermarks(consumer: Consumer, topic: str, partition: int, deadline: float) -> Tuple[int, int]:
    """ListOffsets, retried while the broker is coming up or the topic's metadata settles."""
    last = None
    while time.monotonic() < deadline:
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=5)
        except Exception as exc:  # KafkaException: not ready yet
            last = exc
            time.sleep(0.2)
    raise AssertionError(f"no watermarks for {topic}[{partition}]: {last}")


# --------------------------------------------------------------------------
# Checks: each returns a list of problems, empty when all is well
# --------------------------------------------------------------------------

def check_acknowledged(acked: Dict[int, Dict[int, bytes]], contents: TopicContents) -> List[str]:
    """Every acknowledged record is at its acknowledged offset with its value;
    no acknowledged offset holds another value (an offset reused).

    One problem per run of consecutive offsets that fail the same way."""
    at: Dict[int, Dict[int, bytes]] = {}
    where: Dict[bytes, List[Tuple[int, int]]] = collections.defaultdict(list)
    for p, recs in contents.records.items():
        at[p] = {}
        for o, v in recs:
            at[p][o] = v
            where[v].append((p, o))
    problems = []
    for p in sorted(acked):
        low, high = contents.watermarks.get(p, (None, None))
        run: Optional[List] = None  # [kind, first offset, last offset, first description]
        for o in sorted(acked[p]):
            want = acked[p][o]
            got = at.get(p, {}).get(o)
            if got == want:
                kind = None
            else:
                found = where.get(want)
                found_text = f"the value is at {found}" if found else "the value is nowhere in the topic"
                if got is None:
                    kind = "LOST"
                    text = f"acknowledged {short(want)} is missing; {found_text}"
                else:
                    kind = "REUSED"
                    text = f"acknowledged {short(want)}, holds {short(got)}; {found_text}"
            if run is not None and (kind != run[0] or o != run[2] + 1):
                problems.append(_run_problem(contents.topic, p, low, high, run))
                run = None
            if kind is not None:
                if run is None:
                    run = [kind, o, o, text]
                else:
                    run[2] = o
        if run is not None:
            problems.append(_run_problem(contents.topic, p, low, high, run))
    return problems


def _run_problem(topic: str, partition: int, low, high, run: List) -> str:
    kind, first, last, text = run
    span = f"offset {first}" if first == last else f"offsets {first}-{last} ({last - first + 1} acknowledged records)"
    return f"{kind} {topic}[{partition}] {span}, log [{low}, {high}): first: {text}"


def check_unique(contents: TopicContents) -> List[str]:
    """No value is stored twice (the idempotent producer's promise)."""
    seen: Dict[bytes, Tuple[int, int]] = {}
    problems = []
    for p, recs in sorted(contents.records.items()):
        for o, v in recs:
            if v in seen:
                problems.append(f"DUPLICATE {contents.topic}: {short(v)} at {seen[v]} and at {(p, o)}")
            else:
                seen[v] = (p, o)
    return problems


def check_dense(contents: TopicContents) -> List[str]:
    """Each partition holds every offset from 0 to its high watermark, once, in order."""
    problems = []
    for p, recs in sorted(contents.records.items()):
        low, high = contents.watermarks[p]
        offsets = [o for o, _ in recs]
        if low != 0:
            problems.append(f"LOG-START {contents.topic}[{p}] starts at {low}, not 0")
        if offsets != list(range(0, high)):
            problems.append(f"GAP {contents.topic}[{p}]: {_describe_gaps(offsets, high)}")
    return problems


def check_in_order(contents: TopicContents, sequence_of: Callable[[bytes], Tuple[int, int]]) -> List[str]:
    """Within a partition, the values a producer sent appear in send order.

    `sequence_of(value)` -> (partition it was sent to, sequence number)."""
    problems = []
    for p, recs in sorted(contents.records.items()):
        previous = None
        for o, v in recs:
            try:
                sent_to, seq = sequence_of(v)
            except ValueError:
                problems.append(f"FOREIGN {contents.topic}[{p}] offset {o}: {short(v)} was never sent")
                continue
            if sent_to != p:
                problems.append(f"MISPLACED {contents.topic}[{p}] offset {o}: {short(v)} was sent to {sent_to}")
            if previous is not None and seq <= previous[1]:
                problems.append(f"REORDERED {contents.topic}[{p}] offset {o}: sequence {seq} "
                                f"after {previous[1]} (offset {previous[0]})")
            previous = (o, seq)
    return problems


def _describe_gaps(offsets: Sequence[int], high: int) -> str:
    present = set(offsets)
    missing = [o for o in range(0, high) if o not in present]
    extra = len(offsets) - len(present)
    ranges = []
    for o in missing:
        if ranges and ranges[-1][1] == o - 1:
            ranges[-1][1] = o
        else:
            ranges.append([o, o])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges[:10])
    more = f" (+{len(ranges) - 10} more ranges)" if len(ranges) > 10 else ""
    return (f"{len(offsets)} records below high watermark {high}; missing offsets {text or 'none'}{more}"
            + (f"; {extra} offsets read twice" if extra else ""))


def describe_problems(problems: Sequence[str]) -> str:
    kinds = collections.Counter(p.split(" ", 1)[0] for p in problems)
    head = "\n  ".join(problems[:PROBLEMS_SHOWN_MAX])
    more = f"\n  ... and {len(problems) - PROBLEMS_SHOWN_MAX} more" if len(problems) > PROBLEMS_SHOWN_MAX else ""
    return f"{len(problems)} problems {dict(kinds)}:\n  {head}{more}"


# --------------------------------------------------------------------------
# A real, small, fillable disk
# --------------------------------------------------------------------------

class MissingTool(Exception):
    """The machine lacks what a test needs (a loop device, mkfs.ext4, root)."""


def loop_disk_problem() -> Optional[str]:
    """Why a loop-mounted ext4 cannot be made here, or None."""
    missing = [tool for tool in ("truncate", "mkfs.ext4", "mount", "umount", "losetup") if shutil.which(tool) is None]
    if missing:
        return f"missing tools: {', '.join(missing)} (apt-get install e2fsprogs mount util-linux)"
    if os.geteuid() != 0:
        return "mounting a loop device needs root; run the test as root"
    if not Path("/dev/loop-control").exists():
        return "/dev/loop-control is missing: no loop device support (modprobe loop, or a privileged container)"
    return None


@contextlib.contextmanager
def loop_mounted_ext4(workdir: Path, size: str = "300M") -> Iterator[Path]:
    """An ext4 file system of `size` in workdir/disk.img, loop-mounted on workdir/mnt.

    Unmounted and its loop device detached on exit, also when the body raised;
    stop whatever has files open on it first."""
    problem = loop_disk_problem()
    if problem:
        raise MissingTool(problem)
    img = workdir / "disk.img"
    mnt = workdir / "mnt"
    mnt.mkdir(parents=True, exist_ok=True)
    _run(["truncate", "-s", size, str(img)])
    _run(["mkfs.ext4", "-q", "-F", str(img)])
    try:
        _run(["mount", "-o", "loop", str(img), str(mnt)])
    except MissingTool:
        _detach_loops(img)
        raise
    try:
        yield mnt
    finally:
        _unmount(mnt)
        _detach_loops(img)
        img.unlink(missing_ok=True)


def _run(cmd: List[str]) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise MissingTool(f"`{' '.join(cmd)}` failed ({res.returncode}): {res.stderr.strip() or res.stdout.strip()}")


def _unmount(mnt: Path) -> None:
    for _ in range(50):
        res = subprocess.run(["umount", str(mnt)], capture_output=True, text=True, timeout=60)
        if res.returncode == 0 or not os.path.ismount(mnt):
            return
        time.sleep(0.2)  # busy: a just-killed process may still hold files
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=60)


def _detach_loops(img: Path) -> None:
    res = subprocess.run(["losetup", "-j", str(img)], capture_output=True, text=True, timeout=60)
    for line in res.stdout.splitlines():
        device = line.split(":", 1)[0]
        if device.startswith("/dev/loop"):
            subprocess.run(["losetup", "-d", device], capture_output=True, timeout=60)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


# --------------------------------------------------------------------------
# The broker process (conftest.Broker), killed for real
# --------------------------------------------------------------------------

def kill9(broker, kill_number: int) -> None:
    """SIGKILL a running broker and reap it; it must not have died on its own first."""
    rc = broker.proc.poll()
    if rc is not None:
        raise AssertionError(f"broker exited with {rc} before kill #{kill_number} (a crash, not our kill)\n"
                             f"{broker.log_tail()}")
    broker.proc.send_signal(signal.SIGKILL)
    rc = broker.proc.wait()
    if rc != -signal.SIGKILL:
        raise AssertionError(f"broker exit status {rc} at kill #{kill_number}, expected -9 (SIGKILL)\n"
                             f"{broker.log_tail()}")
    broker._wait_ports_released()


def stop_quietly(broker) -> None:
    """Teardown: SIGTERM, then SIGKILL after 30 s; never raises."""
    terminate(broker.proc, timeout=30)


def terminate(proc, timeout: float) -> None:
    """SIGTERM a running process, then SIGKILL it after `timeout` s."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------------
# Produce while killing
# --------------------------------------------------------------------------

def idempotent_producer_config(bootstrap: str, acks: AckLog, **overrides) -> dict:
    config = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "message.timeout.ms": 120000,
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 500,
        "queue.buffering.max.kbytes": 32768,
        "on_delivery": acks.on_delivery,
        "error_cb": acks.on_error,
    }
    config.update(overrides)
    return config


def flush(producer: Producer, acks: AckLog, timeout_s: float) -> int:
    """producer.flush() that notes a fatal error instead of raising; returns
    how many records still have no delivery report."""
    deadline = time.monotonic() + timeout_s
    for _ in range(5):
        try:
            return producer.flush(max(0.0, deadline - time.monotonic()))
        except (KafkaException, SystemError) as exc:
            acks.note_exception(exc)
    return len(producer)


def kill_loop_value(partition: int, seq: int, rng: random.Random) -> bytes:
    """`partition/seq/` padded to 16..120 bytes, so batch boundaries fall everywhere."""
    head = f"{partition}/{seq}/".encode()
    return head + b"x" * max(0, rng.randrange(16, 120) - len(head))


# Small batches, one record each: a recovery scan then crosses many batch
# boundaries, and a batch starts near every read-chunk boundary of the scan.
KILL_LOOP_PRODUCER_CONFIG = {"linger.ms": 0, "batch.num.messages": 1}


def kill_loop_sequence(value: bytes) -> Tuple[int, int]:
    parts = value.split(b"/", 2)
    if len(parts) != 3:
        raise ValueError(value)
    return int(parts[0]), int(parts[1])


class ContinuousProducer:
    """One idempotent acks=all producer on its own thread, round-robin over
    explicit partitions at about `rate_per_s` records a second, until stop()."""

    TICK_S = 0.01

    def __init__(self, bootstrap: str, topic: str, partitions: int, acks: AckLog,
                 rate_per_s: int, seed: int, **config) -> None:
        self.topic = topic
        self.partitions = partitions
        self.acks = acks
        self.rate_per_s = rate_per_s
        self.rng = random.Random(seed)
        self.producer = Producer(idempotent_producer_config(bootstrap, acks, **config))
        self.sent = 0
        self.unflushed = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="continuous-producer", daemon=True)
        self.error: Optional[BaseException] = None

    def start(self) -> None:
        self.thread.start()

    def stop(self, flush_timeout_s: float = 90.0) -> None:
        """Stop producing and wait for every outstanding delivery report."""
        self.stopping.set()
        self.thread.join()
        self.unflushed = flush(self.producer, self.acks, flush_timeout_s)

    def _run(self) -> None:
        try:
            seq = {p: 0 for p in range(self.partitions)}
            per_tick = max(1, int(self.rate_per_s * self.TICK_S))
            next_tick = time.monotonic()
            while not self.stopping.is_set():
                for _ in range(per_tick):
                    p = self.sent % self.partitions
                    value = kill_loop_value(p, seq[p], self.rng)
                    while not self.stopping.is_set():
                        try:
                            self.producer.produce(self.topic, value=value, partition=p)
                            break
                        except BufferError:
                            self.producer.poll(0.05)
                    else:
                        return
                    seq[p] += 1
                    self.sent += 1
                next_tick += self.TICK_S
                # poll() returns early once it served a report: wait out the tick.
                while not self.stopping.is_set():
                    left_s = next_tick - time.monotonic()
                    self.producer.poll(max(0.0, left_s))
                    if left_s <= 0:
                        break
        except (KafkaException, SystemError) as exc:
            self.acks.note_exception(exc)
        except BaseException as exc:  # surfaced by run_kill_loop
            self.error = exc


@dataclass
class KillLoopResult:
    seed: int
    kills: int = 0
    acked: int = 0
    sent: int = 0
    read: int = 0
    acks: Optional[AckLog] = None
    problems: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        head = (f"seed {self.seed} (replay: {SEED_ENV}={self.seed}): {self.kills} kills, "
                f"{self.sent} sent, {self.acks.summary() if self.acks else ''}, {self.read} read back")
        return head if self.ok else head + "\n" + describe_problems(self.problems)


# Wait this long after a restart for the producer's first acknowledgement.
RESUME_TIMEOUT_S = 30.0


def run_kill_loop(broker, topic: str, partitions: int, kills: int, seed: int, rate_per_s: int = 10000,
                  log: Callable[[str], None] = lambda _: None, **producer_config) -> KillLoopResult:
    """Produce continuously to `topic` while SIGKILLing the broker `kills` times
    at moments drawn from `seed` (1-3 s apart, and never before the producer
    got an acknowledgement since the last restart), restarting it on the same
    data each time; then read everything back and check it.

    The broker must be running, with `topic` created. It is running again on return."""
    rng = random.Random(seed)
    acks = AckLog()
    result = KillLoopResult(seed=seed, acks=acks)
    producer = ContinuousProducer(broker.bootstrap, topic, partitions, acks, rate_per_s, rng.randrange(1 << 32),
                                  **producer_config)
    producer.start()
    finished = False
    try:
        restarted_at = time.monotonic()
        for kill_number in range(1, kills + 1):
            delay_s = rng.uniform(1.0, 3.0)
            if not _wait_for_ack_since(acks, restarted_at, producer):
                if not (acks.fatal or producer.error):  # those are reported below
                    result.problems.append(
                        f"STALLED no acknowledgement within {RESUME_TIMEOUT_S}s of "
                        + ("the start" if kill_number == 1 else f"restart #{kill_number - 1}")
                        + f" ({acks.summary()})")
                break
            time.sleep(max(0.0, restarted_at + delay_s - time.monotonic()))
            kill9(broker, kill_number)
            result.kills = kill_number
            log(f"kill #{kill_number} after {delay_s:.2f}s: {acks.ack_count} acknowledged so far")
            broker.start()
            restarted_at = time.monotonic()
        if not (result.problems or acks.fatal or producer.error) and not _wait_for_ack_since(
                acks, restarted_at, producer):
            result.problems.append(f"STALLED no acknowledgement within {RESUME_TIMEOUT_S}s of the last restart "
                                   f"({acks.summary()})")
        finished = True
    finally:
        # On the way out of a failure the broker may be down, and after a fatal
        # error some records never get a report: do not wait long then.
        producer.stop(flush_timeout_s=90.0 if finished and not acks.fatal else 5.0)
    result.sent = producer.sent
    result.acked = acks.ack_count
    if producer.error is not None:
        result.problems.append(f"PRODUCER thread failed: {producer.error!r}")
    if acks.fatal:
        result.problems.append(f"FATAL {acks.fatal}")
    if producer.unflushed:
        result.problems.append(f"UNFLUSHED {producer.unflushed} records had no delivery report at the end")
    result.problems += acks.reused
    contents = read_partitions(broker.bootstrap, topic, partitions)
    result.read = contents.count()
    result.problems += check_acknowledged(acks.acked_in(topic), contents)
    result.problems += check_dense(contents)
    result.problems += check_unique(contents)
    result.problems += check_in_order(contents, kill_loop_sequence)
    return result


def _wait_for_ack_since(acks: AckLog, moment: float, producer: ContinuousProducer) -> bool:
    deadline = time.monotonic() + RESUME_TIMEOUT_S
    while time.monotonic() < deadline:
        if acks.acks_since(moment):
            return True
        if acks.fatal or producer.error is not None:
            return False
        time.sleep(0.02)
    return False
