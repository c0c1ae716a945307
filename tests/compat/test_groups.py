"""Consumer groups with real clients: confluent-kafka, kafka-python, kafkajs, kcat.

Every member is its own process (groups_consumer.py / kafkajs/groups.js, see
groups_common.py) that prints its assignments and consumed records as JSON
lines and commits synchronously after processing each batch, so a test can
SIGKILL one (crash) or SIGTERM it (graceful consumer.close()).

A record counts as consumed only once a commit covers it (what a SIGKILLed
member printed and never committed must be read again by the member that took
over); no partition may be held by two members at any moment of a run, by the
members' own assignment logs; and member errors must be of the expected kinds,
named in groups_common.py.

The broker runs per-core with 2 cores and --group-initial-rebalance-delay-ms 0.
Members use session.timeout.ms 6000 (the broker's minimum) and a 1 s heartbeat.
Rebalance medians over many runs: tests/compat/measure_rebalance.py.
"""

import shutil
import subprocess
import time
from collections import Counter

import pytest

from conftest import unique_topic
from groups_common import (BROKER_RESTARTING, CLIENTS, COMMIT_AFTER_RESTART,
                           COMMIT_RACED_REBALANCE, GROUP_BROKER_ARGS,
                           SESSION_TIMEOUT_MS, BackgroundProducer, Member,
                           assert_exclusive_ownership, assert_member_errors,
                           cleanup_members, describe_group, kafkajs_problem,
                           parse_describe, produce_values, wait_all_consumed,
                           wait_balanced)

KCAT = shutil.which("kcat")
SESSION_S = SESSION_TIMEOUT_MS / 1000
LEAVE_BOUND_S = SESSION_S - 2


@pytest.fixture
def gbroker(broker_factory):
    """A per-core 2-core broker with no initial rebalance delay."""
    return broker_factory("per-core", 2, extra_args=GROUP_BROKER_ARGS)


@pytest.fixture
def members(tmp_path):
    """Factory for member processes; every one still running is SIGKILLed at teardown."""
    started = []

    def make(client, broker, group, topics, name, **kw):
        if client == "kafkajs":
            problem = kafkajs_problem()
            if problem:
                pytest.fail(problem, pytrace=False)
        m = Member(client, broker.bootstrap, group, topics, name, tmp_path, **kw)
        started.append(m)
        return m

    yield make
    cleanup_members(started)


def end_offsets(produced):
    ends = {}
    for t, p, o in produced:
        ends[(t, p)] = max(ends.get((t, p), 0), o + 1)
    return ends


def wait_committed(member, ends, timeout=30.0):
    member.wait_for(lambda m: all(m.committed.get(tp, 0) >= o for tp, o in ends.items()),
                    timeout, f"commits up to {ends}")


# --------------------------------------------------------------------------
# Three members, SIGKILL one, close one
# --------------------------------------------------------------------------

KILL_LEAVE_CASES = [(c, "per-core") for c in CLIENTS] + [("confluent", "shared")]


@pytest.mark.parametrize("client,listener", KILL_LEAVE_CASES, ids=[f"{c}-{l}" for c, l in KILL_LEAVE_CASES])
def test_rebalance_kill_and_leave(broker_factory, members, client, listener):
    gbroker = broker_factory(listener, 2, extra_args=GROUP_BROKER_ARGS)
    partitions = 12
    topic = gbroker.create_topic(unique_topic(f"grp-{client}"), partitions=partitions)
    group = unique_topic(f"g-{client}")
    all_tps = {(topic, p) for p in range(partitions)}
    producer = BackgroundProducer(gbroker.bootstrap, topic, partitions, rate=300)
    try:
        ms = [members(client, gbroker, group, [topic], f"c{i}") for i in range(3)]

        # Every partition owned by exactly one member, 4 each, and the broker agrees.
        wait_balanced(ms, all_tps, timeout=40, what="with 3 members")
        assert sorted(len(m.assigned) for m in ms) == [4, 4, 4]
        state, described = describe_group(gbroker.bootstrap, group)
        assert state == "STABLE"
        assert sorted(described.values(), key=sorted) == sorted((m.assigned for m in ms), key=sorted)
        for m in ms:
            m.wait_for(lambda m: len(m.records) > 0, 30, "a first record")

        # SIGKILL: the partitions move within the session timeout plus a rebalance.
        victim, leaver, last = ms
        t_kill = victim.kill()
        t_done = wait_balanced([leaver, last], all_tps, timeout=SESSION_S + 20, what="after SIGKILL")
        kill_s = t_done - t_kill
        print(f"\n[{client}] rebalance after SIGKILL: {kill_s:.2f}s (session.timeout.ms {SESSION_TIMEOUT_MS})")
        assert kill_s < SESSION_S + 10, f"SIGKILLed member's partitions took {kill_s:.1f}s to move"
        assert sorted(len(m.assigned) for m in (leaver, last)) == [6, 6]
        state, described = describe_group(gbroker.bootstrap, group)
        assert state == "STABLE" and len(described) == 2, (state, described)

        # Graceful close: LeaveGroup makes the rebalance immediate.
        t_leave = leaver.terminate()
        t_done = wait_balanced([last], all_tps, timeout=SESSION_S + 20, what="after graceful close")
        leave_s = t_done - t_leave
        print(f"[{client}] rebalance after graceful close: {leave_s:.2f}s")
        # Expiry takes >= the session timeout (6 s); a LeaveGroup rebalance is
        # about one heartbeat interval (median ~0.5 s, kafkajs seen up to 2.6 s).
        assert leave_s < LEAVE_BOUND_S, \
            f"graceful close took {leave_s:.1f}s to move partitions: LeaveGroup not acted on?"
        leaver.wait_closed()

        time.sleep(1.0)
    finally:
        produced = producer.stop()
    assert len(produced) > 1000

    # At least once: every produced record was consumed (committed) by some
    # member; what the SIGKILLed one printed without committing, its
    # successor read again.
    wait_all_consumed(ms, produced, timeout=40, what=f"by {client} group {group}")
    ends = end_offsets(produced)
    wait_committed(last, ends)
    last.terminate()
    last.wait_closed()
    # Over the whole run, not only at the samples above: never two owners.
    assert_exclusive_ownership(ms)
    assert_member_errors(ms, commit_errors=COMMIT_RACED_REBALANCE)

    out = gbroker.cli("group", "describe", group, "-b", gbroker.bootstrap).stdout
    rows = parse_describe(out, topic)
    assert sorted(rows) == list(range(partitions)), out
    for p, (committed, end, lag) in rows.items():
        assert (int(committed), int(end), lag) == (ends[(topic, p)], ends[(topic, p)], "0"), out


# --------------------------------------------------------------------------
# Committed offsets survive a broker restart
# --------------------------------------------------------------------------

@pytest.mark.parametrize("client", CLIENTS)
def test_commits_survive_restart(gbroker, members, client):
    partitions = 6
    topic = gbroker.create_topic(unique_topic(f"grp-rs-{client}"), partitions=partitions)
    group = unique_topic(f"g-rs-{client}")

    first = produce_values(gbroker.bootstrap, topic, partitions, 600, prefix="a")
    a = members(client, gbroker, group, [topic], "a")
    a.wait_for(lambda m: len(m.records) >= len(first), 40, "the first 600 records")
    before = end_offsets(first)
    wait_committed(a, before)

    # A member that stays up across a clean broker restart loses nothing and
    # never goes back behind its last commit. (shardlog does not persist group
    # membership, so the member's first commit after the restart fails with
    # UNKNOWN_MEMBER_ID and it rejoins; what it fetched in between it reads again,
    # from its committed offsets. Kafka keeps members across a coordinator restart.)
    gbroker.restart()
    second = produce_values(gbroker.bootstrap, topic, partitions, 600, start=600, prefix="a")
    both = {**first, **second}
    wait_all_consumed([a], both, timeout=60, what="across the restart")
    wait_committed(a, end_offsets(both))
    seen = Counter(a.offsets_seen())
    twice = sorted(k for k, n in seen.items() if n > 1)
    behind = [k for k in twice if k[2] < before[(k[0], k[1])]]
    assert not behind, f"read again below the last commit before the restart: {behind[:5]} ({len(behind)})"
    print(f"\n[{client}] live member across restart: {len(twice)} records read again "
          f"(fetched after the restart, before its failed commit)")

    # Crash the member after its synchronous commits, restart the broker: a new
    # member of the group resumes exactly after the last commit, nothing read twice.
    a.kill()
    gbroker.restart()
    third = produce_values(gbroker.bootstrap, topic, partitions, 300, start=1200, prefix="a")
    b = members(client, gbroker, group, [topic], "b")
    wait_all_consumed([b], third, timeout=60, what="by the new member")
    time.sleep(1.0)
    seen = b.offsets_seen()
    assert sorted(seen) == sorted(third), \
        f"new member read {len(seen)} records, expected exactly the {len(third)} after the last commit " \
        f"(first: {sorted(seen)[:3]})"
    b.terminate()
    b.wait_closed()
    assert_exclusive_ownership([a, b])
    assert_member_errors([a, b], commit_errors=COMMIT_AFTER_RESTART + COMMIT_RACED_REBALANCE,
                         errors=BROKER_RESTARTING)


# --------------------------------------------------------------------------
# Independent groups on one topic
# --------------------------------------------------------------------------

def test_independent_groups(gbroker, members):
    partitions = 6
    topic = gbroker.create_topic(unique_topic("grp-multi"), partitions=partitions)
    groups = {client: unique_topic(f"g-multi-{client}") for client in CLIENTS}
    producer = BackgroundProducer(gbroker.bootstrap, topic, partitions, rate=300)
    try:
        by_group = {
            "confluent": [members("confluent", gbroker, groups["confluent"], [topic], f"m{i}") for i in range(2)],
            "kafka-python": [members("kafka-python", gbroker, groups["kafka-python"], [topic], "m0")],
            "kafkajs": [members("kafkajs", gbroker, groups["kafkajs"], [topic], "m0")],
        }
        all_tps = {(topic, p) for p in range(partitions)}
        for ms in by_group.values():
            wait_balanced(ms, all_tps, timeout=40)
        time.sleep(2.0)
    finally:
        produced = producer.stop()
    for client, ms in by_group.items():
        wait_all_consumed(ms, produced, timeout=40, what=f"by group {groups[client]}")

    listed = gbroker.cli("group", "list", "-b", gbroker.bootstrap).stdout
    listed_groups = dict(line.split("\t") for line in listed.splitlines() if "\t" in line)
    for g in groups.values():
        assert listed_groups.get(g) == "consumer", listed
    for ms in by_group.values():
        for m in ms:
            m.terminate()
        for m in ms:
            m.wait_closed()
        assert_exclusive_ownership(ms)
        assert_member_errors(ms, commit_errors=COMMIT_RACED_REBALANCE)


# --------------------------------------------------------------------------
# kcat balanced consumer
# --------------------------------------------------------------------------

def kcat_group_read(broker, group, topic, timeout=60):
    assert KCAT is not None, "kcat is not installed (apt-get install kcat); tests/setup.sh installs it"
    res = subprocess.run([KCAT, "-b", broker.bootstrap, "-G", group, "-X", "auto.offset.reset=earliest",
                          "-X", "session.timeout.ms=6000", "-e", "-q", "-f", "%t\\t%p\\t%o\\t%s\\n", topic],
                         capture_output=True, timeout=timeout)
    assert res.returncode == 0, f"kcat -G exited {res.returncode}:\n{res.stderr.decode(errors='replace')}"
    out = {}
    for line in res.stdout.decode().splitlines():
        t, p, o, v = line.split("\t")
        key = (t, int(p), int(o))
        assert key not in out, f"kcat read {key} twice"
        out[key] = v
    return out


def test_kcat_balanced_consumer(gbroker):
    partitions = 6
    topic = gbroker.create_topic(unique_topic("grp-kcat"), partitions=partitions)
    group = unique_topic("g-kcat")
    first = produce_values(gbroker.bootstrap, topic, partitions, 1200, prefix="k")
    assert kcat_group_read(gbroker, group, topic) == first

    # kcat committed on exit: the group has no lag, and the next run reads only new records.
    out = gbroker.cli("group", "describe", group, "-b", gbroker.bootstrap).stdout
    rows = parse_describe(out, topic)
    assert sorted(rows) == list(range(partitions)) and all(lag == "0" for _, _, lag in rows.values()), out
    second = produce_values(gbroker.bootstrap, topic, partitions, 300, start=1200, prefix="k")
    assert kcat_group_read(gbroker, group, topic) == second


# --------------------------------------------------------------------------
# shardlog group describe / reset-offsets / delete on a real client's group
# --------------------------------------------------------------------------

def test_group_cli_with_real_client(gbroker, members):
    partitions = 6
    topic = gbroker.create_topic(unique_topic("grp-cli"), partitions=partitions)
    group = unique_topic("g-cli")
    b = gbroker.bootstrap
    early = produce_values(b, topic, partitions, 600, prefix="c")
    time.sleep(0.05)
    mid_ms = int(time.time() * 1000)
    time.sleep(0.05)
    late = produce_values(b, topic, partitions, 600, start=600, prefix="c")
    everything = {**early, **late}
    ends = end_offsets(everything)

    used = []

    def consume_once(name, expected, settle=1.0):
        m = members("confluent", gbroker, group, [topic], name)
        used.append(m)
        wait_balanced([m], {(topic, p) for p in range(partitions)}, timeout=30)
        if expected:
            wait_all_consumed([m], expected, timeout=40, what=f"by {name}")
        time.sleep(settle)
        seen = m.offsets_seen()
        assert sorted(seen) == sorted(expected), \
            f"{name} read {len(seen)} records, expected {len(expected)}: first {sorted(seen)[:3]}"
        wait_committed(m, end_offsets(expected))
        return m

    def reset(*how):
        res = gbroker.cli("group", "reset-offsets", group, "--topic", topic, *how, "-b", b)
        return {int(p): int(o) for t, p, o in (line.split("\t") for line in res.stdout.splitlines())}

    def describe():
        return gbroker.cli("group", "describe", group, "-b", b).stdout

    a = consume_once("a", everything)
    # Active group: described Stable with its member; reset and delete refused.
    out = describe()
    assert "state Stable" in out and "protocol consumer range" in out, out
    assert out.count("  member ") == 1 and "client confluent-a" in out, out
    assert {p: r for p, r in parse_describe(out, topic).items()} == \
        {p: (str(ends[(topic, p)]), str(ends[(topic, p)]), "0") for p in range(partitions)}, out
    res = gbroker.cli("group", "reset-offsets", group, "--topic", topic, "--to-earliest", "-b", b, check=False)
    assert res.returncode != 0, f"reset-offsets of an active group succeeded:\n{res.stdout}"
    res = gbroker.cli("group", "delete", group, "-b", b, check=False)
    assert res.returncode != 0, f"delete of an active group succeeded:\n{res.stdout}"
    a.terminate()
    a.wait_closed()

    out = describe()
    assert "state Empty" in out and "  member " not in out, out
    assert all(c == e for c, e, _ in parse_describe(out, topic).values()), out

    # --to-earliest: everything again.
    assert reset("--to-earliest") == {p: 0 for p in range(partitions)}
    m = consume_once("b", everything)
    m.terminate()
    m.wait_closed()

    # --to-offset N.
    assert reset("--to-offset", "150") == {p: 150 for p in range(partitions)}
    m = consume_once("c", {k: v for k, v in everything.items() if k[2] >= 150})
    m.terminate()
    m.wait_closed()

    # --to-datetime: only what was produced after mid_ms.
    moved = reset("--to-datetime", str(mid_ms))
    assert moved == {p: 100 for p in range(partitions)}, moved
    m = consume_once("d", late)
    m.terminate()
    m.wait_closed()

    # --to-latest: only records produced afterwards.
    reset("--to-earliest")
    assert reset("--to-latest") == {p: ends[(topic, p)] for p in range(partitions)}
    newer = produce_values(b, topic, partitions, 60, start=1200, prefix="c")
    m = consume_once("e", newer)
    m.terminate()
    m.wait_closed()

    # delete: gone from the list, its offsets too; a new member starts from earliest.
    gbroker.cli("group", "delete", group, "-b", b)
    listed = gbroker.cli("group", "list", "-b", b).stdout
    assert group not in listed, listed
    res = gbroker.cli("group", "describe", group, "-b", b, check=False)
    assert parse_describe(res.stdout, topic) == {}, res.stdout
    m = consume_once("f", {**everything, **newer})
    m.terminate()
    m.wait_closed()
    assert_exclusive_ownership(used)
    assert_member_errors(used)
