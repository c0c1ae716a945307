#!/usr/bin/env bash
# Build shardlog, run its Rust tests, then the real-client compatibility suite
# (confluent-kafka, kafka-python, kcat, kafkajs). Any failure, including a
# missing client, exits non-zero. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1

cargo build --release
cargo test --release
python3 -m pytest -q tests/compat "$@"
