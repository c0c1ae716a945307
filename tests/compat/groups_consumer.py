#!/usr/bin/env python3
"""One consumer-group member as its own process, for tests/compat/test_groups.py.

    python3 groups_consumer.py SPEC_JSON

SPEC (a JSON object, given inline on the command line):
  client            "confluent" (confluent-kafka/librdkafka) or "kafka-python"
  bootstrap         "host:port[,host:port]"
  group             group id
  topics            [topic, ...] to subscribe to
  session_timeout_ms, heartbeat_interval_ms   (optional; 6000 / 1000)
  client_id         (optional)
  max_records       (optional) records per poll; default 500

It subscribes with the eager range assignor, and after every poll prints each
record it got, then commits the batch's offsets synchronously (the next
offset per partition). Everything it does is one JSON line on stdout,
flushed at once, with `t` = time.time() when the line was written:

  {"ev": "start"}
  {"ev": "assigned", "parts": [[topic, partition], ...]}   (the whole assignment)
  {"ev": "revoked",  "parts": [...]}   (also on_lost, with "lost": true)
  {"ev": "rec", "topic": T, "p": partition, "o": offset, "v": value (utf-8)}
  {"ev": "committing", "offsets": [[topic, partition, next_offset], ...]}   (about to send)
  {"ev": "commit", "offsets": [[topic, partition, next_offset], ...]}        (the commit succeeded)
  {"ev": "commit_error", "err": "..."}
  {"ev": "error", "err": "..."}   (a non-fatal consumer error)
  {"ev": "closed"}                 (after consumer.close() returned)

SIGTERM (or SIGINT) makes it leave gracefully: the poll loop ends, it prints
{"ev": "revoked", "parts": [...], "closing": true} (it consumes no more) and
calls consumer.close(), which sends LeaveGroup. SIGKILL is the crash case.
"""

import json
import signal
import sys
import threading
import time

_lock = threading.Lock()
_stop = False


def emit(ev, **fields):
    fields = {"ev": ev, "t": time.time(), **fields}
    line = json.dumps(fields, separators=(",", ":"))
    with _lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _on_signal(signum, frame):
    global _stop
    _stop = True


def parts(tps):
    return sorted([tp.topic, tp.partition] for tp in tps)


def run_confluent(spec):
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    conf = {
        "bootstrap.servers": spec["bootstrap"],
        "group.id": spec["group"],
        "client.id": spec.get("client_id", "groups-consumer"),
        "partition.assignment.strategy": "range",
        "session.timeout.ms": spec.get("session_timeout_ms", 6000),
        "heartbeat.interval.ms": spec.get("heartbeat_interval_ms", 1000),
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
        "topic.metadata.refresh.interval.ms": 2000,
    }
    consumer = Consumer(conf)

    def on_assign(c, tps):
        emit("assigned", parts=parts(tps))

    def on_revoke(c, tps):
        emit("revoked", parts=parts(tps))

    def on_lost(c, tps):
        emit("revoked", parts=parts(tps), lost=True)

    consumer.subscribe(spec["topics"], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    max_records = spec.get("max_records", 500)
    while not _stop:
        msgs = consumer.consume(num_messages=max_records, timeout=0.2)
        offsets = {}
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    emit("error", err=str(err))
                continue
            value = m.value()
            emit("rec", topic=m.topic(), p=m.partition(), o=m.offset(),
                 v=value.decode("utf-8", "replace") if value is not None else None)
            offsets[(m.topic(), m.partition())] = m.offset() + 1
        if offsets:
            tps = [TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())]
            emit("committing", offsets=[[t, p, o] for (t, p), o in sorted(offsets.items())])
            try:
                consumer.commit(offsets=tps, asynchronous=False)
                emit("commit", offsets=[[t, p, o] for (t, p), o in sorted(offsets.items())])
            except KafkaException as e:
                emit("commit_error", err=str(e))
    emit("revoked", parts=parts(consumer.assignment()), closing=True)
    consumer.close()
    emit("closed")


def run_kafka_python(spec):
    from kafka import ConsumerRebalanceListener, KafkaConsumer
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.errors import KafkaError
    from kafka.structs import OffsetAndMetadata

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            emit("revoked", parts=parts(revoked))

        def on_partitions_assigned(self, assigned):
            emit("assigned", parts=parts(assigned))

        def on_partitions_lost(self, lost):
            emit("revoked", parts=parts(lost), lost=True)

    consumer = KafkaConsumer(
        bootstrap_servers=spec["bootstrap"].split(","),
        group_id=spec["group"],
        client_id=spec.get("client_id", "groups-consumer"),
        partition_assignment_strategy=[RangePartitionAssignor],
        session_timeout_ms=spec.get("session_timeout_ms", 6000),
        heartbeat_interval_ms=spec.get("heartbeat_interval_ms", 1000),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        metadata_max_age_ms=2000,
        request_timeout_ms=30000,
    )
    consumer.subscribe(spec["topics"], listener=Listener())
    max_records = spec.get("max_records", 500)
    while not _stop:
        batch = consumer.poll(timeout_ms=200, max_records=max_records)
        offsets = {}
        for tp, msgs in sorted(batch.items()):
            for m in msgs:
                emit("rec", topic=m.topic, p=m.partition, o=m.offset,
                     v=m.value.decode("utf-8", "replace") if m.value is not None else None)
                offsets[tp] = m.offset + 1
        if offsets:
            emit("committing", offsets=[[tp.topic, tp.partition, o] for tp, o in sorted(offsets.items())])
            try:
                consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in offsets.items()})
                emit("commit", offsets=[[tp.topic, tp.partition, o] for tp, o in sorted(offsets.items())])
            except KafkaError as e:
                emit("commit_error", err=repr(e))
    emit("revoked", parts=parts(consumer.assignment()), closing=True)
    consumer.close(autocommit=False)
    emit("closed")


def main():
    spec = json.loads(sys.argv[1])
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    emit("start")
    if spec["client"] == "confluent":
        run_confluent(spec)
    elif spec["client"] == "kafka-python":
        run_kafka_python(spec)
    else:
        raise SystemExit(f"unknown client {spec['client']!r}")


if __name__ == "__main__":
    main()
