#!/usr/bin/env bash
# Build shardlog, run its Rust tests, then the real-client compatibility suite
# (confluent-kafka, kafka-python, kcat, kafkajs). First tests/setup.sh
# installs what they need (as root) or says what is missing. Any failure,
# including a missing client, exits non-zero. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1

# shellcheck source=tests/setup.sh
source tests/setup.sh
cargo build --release
cargo test --release
"$COMPAT_PYTHON" -m pytest -q tests/compat "$@"
