#!/usr/bin/env python3
"""Idempotent producers over many partitions: the broker's upkeep cost.

An idempotent client (the Java client's default since Kafka 3.0;
confluent-kafka with enable.idempotence) gives every partition producer
state, which the broker snapshots to disk. This starts a one-core broker
(pinned to CPU 0, this script on CPU 1), creates a topic with PARTITIONS
partitions, sends one 100-byte message to each partition every second with
confluent-kafka and `enable.idempotence`, and after a 5 s warm-up reports the
broker's CPU seconds per second and the disk's completed writes per second
(/proc/diskstats, device DEVICE) over the next 15 s.

Usage: perf/idempotent-partitions.py [BINARY] [PARTITIONS] [DEVICE]
       (defaults: target/release/shardlog 10000 vda)
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

WARMUP_S = 5
MEASURE_S = 15


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def disk_writes(device):
    for line in open("/proc/diskstats"):
        fields = line.split()
        if fields[2] == device:
            return int(fields[7])
    raise SystemExit(f"no device {device} in /proc/diskstats")


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/shardlog"
    partitions = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    device = sys.argv[3] if len(sys.argv) > 3 else "vda"
    data = tempfile.mkdtemp(prefix="shardlog-idem-")
    port = free_port()
    broker = subprocess.Popen(
        [binary, "serve", "--data", data, "--port", str(port), "--cores", "1", "--log-level", "warn",
         "--flush", "never"])
    try:
        os.sched_setaffinity(0, {1})
        bootstrap = f"127.0.0.1:{port}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        deadline = time.time() + 30
        while True:
            try:
                admin.create_topics([NewTopic("idem", partitions, 1)])["idem"].result(timeout=60)
                break
            except Exception:
                if time.time() > deadline:
                    raise
                time.sleep(0.5)
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
        start = time.time()
        mark = None
        while time.time() - start < WARMUP_S + MEASURE_S:
            second = time.time()
            for partition in range(partitions):
                producer.produce("idem", b"x" * 100, partition=partition)
                if partition % 1000 == 0:
                    producer.poll(0)
            producer.flush(5)
            if mark is None and time.time() - start >= WARMUP_S:
                mark = (time.time(), cpu_seconds(broker.pid), disk_writes(device))
            time.sleep(max(0.0, 1 - (time.time() - second)))
        end = (time.time(), cpu_seconds(broker.pid), disk_writes(device))
        seconds = end[0] - mark[0]
        print(f"{binary}: {partitions} partitions, broker {(end[1] - mark[1]) / seconds:.3f} CPU-s/s, "
              f"disk writes {(end[2] - mark[2]) / seconds:.0f}/s over {seconds:.1f} s")
    finally:
        broker.terminate()
        broker.wait()
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
