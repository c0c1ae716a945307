"""README.md's "Run it" section, run the way a user runs it.

Each test starts `shardlog serve` in an empty working directory with the
default data directory `./data`, or a relative one given by flag,
environment or TOML file (whose path is relative too), then types the
section's kcat commands into a shell and compares what they print with what
the README shows. Only the ports move, through the environment, so the
serve command line stays the README's and other tests on the machine keep
9092 and 9644. The commands and the output are read from README.md itself:
a README that drifts from the broker fails here.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from conftest import BIN, REPO, _require_binary, pick_ports

README = REPO / "README.md"
README_PORT = 9092
START_TIMEOUT_S = 30.0


@dataclass
class TypedCommand:
    """A `$ command` line of the README and the lines shown after it."""
    command: str
    output: List[str]


@dataclass
class RunIt:
    serve_args: List[str]
    commands: List[TypedCommand]


def read_run_it() -> RunIt:
    """The serve command and the kcat session of README.md's "Run it"."""
    text = README.read_text()
    section = text.split("\n## Run it\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    build_and_serve = next(body.strip() for lang, body in blocks if lang == "sh")
    serve = shlex.split(build_and_serve.split("&&")[-1])
    assert serve[0] == "./target/release/shardlog", build_and_serve
    session = next(body for lang, body in blocks if lang == "text")
    commands: List[TypedCommand] = []
    for line in session.splitlines():
        if line.startswith("$ "):
            commands.append(TypedCommand(line[2:], []))
        else:
            commands[-1].output.append(line)
    return RunIt(serve_args=serve[1:], commands=commands)


def cores_online() -> int:
    return len(os.sched_getaffinity(0))


def http_status(port: int, path: str) -> Optional[int]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1) as res:
            return res.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return None


@dataclass
class Place:
    """Where the data should land, and how the broker is told."""
    data: str
    args: List[str]
    env: Dict[str, str]
    files: Dict[str, str]


PLACES = {
    "default": Place("data", [], {}, {}),
    "data-flag": Place("some/dir", ["--data", "some/dir"], {}, {}),
    "data-env": Place("rel", [], {"SHARDLOG_DATA": "rel"}, {}),
    "toml-config-flag": Place("rel", ["--config", "conf/shardlog.toml"], {},
                              {"conf/shardlog.toml": 'data = "rel"\n'}),
    "toml-config-env": Place("rel", [], {"SHARDLOG_CONFIG": "conf/shardlog.toml"},
                             {"conf/shardlog.toml": 'data = "rel"\n'}),
}


@pytest.fixture(autouse=True)
def _require_kcat():
    if shutil.which("kcat") is None:
        pytest.fail("kcat is not installed (apt-get install kcat); tests/setup.sh installs it", pytrace=False)


@pytest.mark.parametrize("place", list(PLACES))
def test_readme_quick_start_serves_kcat_as_shown(tmp_path, place):
    _require_binary()
    run_it = read_run_it()
    where = PLACES[place]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for name, body in where.files.items():
        (cwd / name).parent.mkdir(parents=True, exist_ok=True)
        (cwd / name).write_text(body)
    # Core i listens on port + i; the metrics port follows the last core's.
    port = pick_ports(cores_online() + 1)
    metrics_port = port + cores_online()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDLOG_")}
    env.update(where.env, SHARDLOG_PORT=str(port), SHARDLOG_METRICS_PORT=str(metrics_port))
    log_path = tmp_path / "broker.log"
    command = [str(BIN), *run_it.serve_args, *where.args]
    with open(log_path, "wb") as log:
        broker = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
    try:
        wait_ready(broker, metrics_port, log_path)
        for typed in run_it.commands:
            check_typed(typed, cwd, port, log_path)
    finally:
        if broker.poll() is None:
            broker.send_signal(signal.SIGTERM)
            broker.wait(timeout=30)
    assert broker.returncode == 0, f"exited {broker.returncode} on SIGTERM\n{log_path.read_text()}"
    data = cwd / where.data
    assert (data / "demo-0").is_dir(), f"no demo-0 in {data}: {sorted(os.listdir(cwd))}"
    assert (data / ".lock").is_file()
    if where.data != "data":
        assert not (cwd / "data").exists(), "the default data directory was used instead"


def wait_ready(broker: subprocess.Popen, metrics_port: int, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if broker.poll() is not None:
            pytest.fail(f"`shardlog serve` exited with {broker.returncode} at start:\n{log_path.read_text()}",
                        pytrace=False)
        if http_status(metrics_port, "/v1/ready") == 200:
            return
        time.sleep(0.05)
    pytest.fail(f"`shardlog serve` not ready within {START_TIMEOUT_S}s:\n{log_path.read_text()}", pytrace=False)


def check_typed(typed: TypedCommand, cwd: Path, port: int, log_path: Path) -> None:
    """Runs a README command in a shell, on the test's port, and compares its output."""
    command = typed.command.replace(f"127.0.0.1:{README_PORT}", f"127.0.0.1:{port}")
    res = subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=60)
    context = f"$ {command}\nstdout:\n{res.stdout}stderr:\n{res.stderr}broker log:\n{log_path.read_text()}"
    assert res.returncode == 0, context
    # kcat's `%` lines go to stderr; a terminal shows both streams.
    shown_stdout = [line for line in typed.output if not line.startswith("% ")]
    shown_stderr = [line for line in typed.output if line.startswith("% ")]
    assert res.stdout.splitlines() == shown_stdout, context
    for line in shown_stderr:
        assert line in res.stderr.splitlines(), context
