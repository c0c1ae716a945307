#!/usr/bin/env bash
# Installs what tests/run-all.sh needs, or says in one line what is missing
# and the command that installs it. The one place that installs: run-all.sh
# sources it (and .ci/run runs run-all.sh); `bash tests/setup.sh` runs it alone.
# Quick when everything is there: it only looks, and asks apt, pip or npm
# for nothing.
#
# Sets COMPAT_PYTHON: the Python that runs tests/compat. That is
# tests/compat/.venv's when that exists or python3 lacks the pinned clients
# (then the virtual environment is made and filled from requirements.txt),
# else python3 itself.
#
# Needs a Rust toolchain (https://rustup.rs). The rest comes from apt as
# root: kcat (compat suite); systemd (systemd-analyze, operability tests);
# e2fsprogs and mount (mkfs.ext4, mount, losetup: the loop-mounted file
# systems of the disk-fault and durability tests, which also need root);
# iperf3 and fio (perf/ scripts); python3, python3-venv, nodejs and npm
# where missing. (The raft crate's build needs protoc: .cargo/protoc uses
# the one the protoc-bin-vendored crate ships when none is installed.)
set -euo pipefail

setup_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
setup_compat="$setup_repo/tests/compat"
setup_venv="$setup_compat/.venv"

setup_fail() {
  echo "tests/setup.sh: $*" >&2
  exit 1
}

# "command package" pairs: a command the tests run and the Debian package
# that has it.
setup_tools=(
  "kcat kcat"
  "systemd-analyze systemd"
  "mkfs.ext4 e2fsprogs"
  "mount mount"
  "losetup mount"
  "iperf3 iperf3"
  "fio fio"
  "nft nftables"
  "ip iproute2"
  "python3 python3"
  "node nodejs"
  "npm npm"
)

setup_missing_packages() {
  local entry tool package missing=()
  for entry in "${setup_tools[@]}"; do
    read -r tool package <<<"$entry"
    # sbin is not on every user's PATH; the tools there are still installed.
    if ! PATH="$PATH:/usr/sbin:/sbin" command -v "$tool" >/dev/null 2>&1; then
      missing+=("$package")
    fi
  done
  if command -v python3 >/dev/null 2>&1 && [ ! -x "$setup_venv/bin/python" ] \
    && ! setup_python_has_clients python3 && ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    missing+=(python3-venv)
  fi
  printf '%s\n' "${missing[@]}" | sort -u | grep -v '^$' || true
}

# Whether $1 has every client pinned in requirements.txt, at its version.
setup_python_has_clients() {
  "$1" - "$setup_compat/requirements.txt" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import PackageNotFoundError, version
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    name, _, pinned = line.partition("==")
    try:
        if version(name) != pinned:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
EOF
}

setup_apt() {
  local missing
  missing="$(setup_missing_packages | tr '\n' ' ')"
  missing="${missing% }"
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    setup_fail "missing packages: $missing; install them with: sudo apt-get install -y $missing"
  fi
  echo "tests/setup.sh: installing $missing" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086 # one word per package
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
}

setup_python() {
  if [ ! -x "$setup_venv/bin/python" ] && setup_python_has_clients python3; then
    COMPAT_PYTHON=python3
    return 0
  fi
  if [ ! -x "$setup_venv/bin/python" ]; then
    echo "tests/setup.sh: making $setup_venv for the Python clients" >&2
    python3 -m venv "$setup_venv" ||
      setup_fail "cannot make a virtual environment; install it with: sudo apt-get install -y python3-venv"
  fi
  COMPAT_PYTHON="$setup_venv/bin/python"
  if ! setup_python_has_clients "$COMPAT_PYTHON"; then
    echo "tests/setup.sh: installing tests/compat/requirements.txt into $setup_venv" >&2
    "$COMPAT_PYTHON" -m pip install -q -r "$setup_compat/requirements.txt" ||
      setup_fail "pip could not install tests/compat/requirements.txt (above); retry with: $COMPAT_PYTHON -m pip install -r tests/compat/requirements.txt"
  fi
}

setup_kafkajs() {
  local dir="$setup_compat/kafkajs" wanted installed
  wanted="$(node -p "require('$dir/package.json').dependencies.kafkajs")"
  installed="$(node -p "require('$dir/node_modules/kafkajs/package.json').version" 2>/dev/null || true)"
  [ "$installed" = "$wanted" ] && return 0
  echo "tests/setup.sh: installing kafkajs $wanted (npm ci in tests/compat/kafkajs)" >&2
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) ||
    setup_fail "npm could not install kafkajs (above); retry with: (cd tests/compat/kafkajs && npm ci)"
}

command -v cargo >/dev/null 2>&1 ||
  setup_fail "cargo is missing; install Rust with: curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh"
setup_apt
setup_python
setup_kafkajs
export COMPAT_PYTHON
