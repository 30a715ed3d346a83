"""`--help` and `--version` answer a person without loading the human views (rich, the result types,
asyncio through the rate limiter): what keeps them under the 0.1 s bar of benchmarks/bench_startup.py.
Checked by the modules loaded, not by a timing, so it holds on a busy machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from bulkrelay.errors import ExitCode

# real processes: outside the fast lane (`-m "not slow"`)
pytestmark = pytest.mark.slow

_LOADED = """\
import sys, runpy
sys.argv = ["bulkrelay", *sys.argv[1:]]
try:
    runpy.run_module("bulkrelay", run_name="__main__")
except SystemExit:
    pass
names = ("rich", "bulkrelay.cli.human", "bulkrelay.ops.results", "asyncio")
heavy = sorted(name for name in names if name in sys.modules)
sys.stderr.write("LOADED " + ",".join(heavy) + "\\n")
"""


@pytest.mark.parametrize(("args", "shown"), [(["--help"], "usage: bulkrelay"), (["--version"], "bulkrelay ")])
def test_help_and_version_for_a_person_load_no_rich(args: list[str], shown: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _LOADED, *args, "--human"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.stdout.startswith(shown)
    loaded = [line for line in done.stderr.splitlines() if line.startswith("LOADED ")]
    assert loaded == ["LOADED "]


_JOB = """\
version: 1
name: plain
input: { file: in.csv, key: id }
request:
  method: POST
  url: "http://127.0.0.1:9/v1/x"
  json: { id: { from: id }, email: { from: email } }
"""


def test_a_job_without_liquid_or_jwt_loads_neither(tmp_path: Path) -> None:
    """python-liquid (with Babel) and PyJWT (with cryptography) cost about 100 ms of every command's
    start-up, a cron run's and each `job status` an agent polls with: they load at the first Liquid
    leaf or JWT key, not before."""
    (tmp_path / "in.csv").write_text("id,email\n1,a@example.com\n")
    (tmp_path / "job.yaml").write_text(_JOB)
    imported = _imported(["validate", "job.yaml"], tmp_path)
    assert "bulkrelay.job.config" in imported
    assert not {name for name in imported if name.split(".")[0] in ("liquid", "jwt", "cryptography", "babel")}


_HEAVY = ("pydantic", "yaml", "bulkrelay.job.config", "bulkrelay.relay.engine", "pyreqwest", "asyncio")


def _python(args: list[str], cwd: Path, state: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`python ARGS` in `cwd`, with background jobs kept in `state`."""
    environment = os.environ if state is None else {**os.environ, "BULKRELAY_STATE_DIR": str(state)}
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=cwd,
        env=environment,
    )


def _imported(command: list[str], cwd: Path, state: Path | None = None) -> set[str]:
    """The modules a `bulkrelay` command loaded (read from -X importtime: the command ends by os._exit)."""
    done = _python(["-X", "importtime", "-m", "bulkrelay", *command], cwd, state)
    assert orjson.loads(done.stdout)["ok"] is not None  # one envelope, whatever the job's answer
    return {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}


def test_status_runs_and_job_status_load_no_job_schema_nor_relay(tmp_path: Path) -> None:
    """`status`, `runs` and `job status` watch what exists: an agent or a prompt polling them does not
    pay for the job file's schema, YAML, the HTTP client or the event loop (0.15 s of every such call)."""
    (tmp_path / "in.csv").write_text("id,email\n1,a@example.com\n")
    (tmp_path / "job.yaml").write_text(_JOB + "retry: { max_attempts: 1 }\n")
    ran = _python(["-m", "bulkrelay", "run", "job.yaml", "--budget", "0", "--runs-dir", "runs"], tmp_path)
    assert ran.returncode == ExitCode.PARTIAL_FAILURE, ran.stdout  # its row refused: failed
    for command in (["status", "latest", "--runs-dir", "runs"], ["runs", "--runs-dir", "runs"]):
        loaded = _imported(command, tmp_path)
        assert "bulkrelay.ops.status" in loaded
        assert not loaded.intersection(_HEAVY), command
    state = tmp_path / "state"  # a background job to ask about: handed off at once, it ends on its own
    handed = _python(
        ["-m", "bulkrelay", "run", "job.yaml", "--budget", "1", "--runs-dir", "runs"], tmp_path, state
    )
    job_id = orjson.loads(handed.stdout)["meta"]["job_id"]
    loaded = _imported(["job", "status", job_id], tmp_path, state)
    assert "bulkrelay.background.reach" in loaded
    assert not loaded.intersection(_HEAVY)


_FROZEN = """\
import gc, os, sys, runpy
real_exit = os._exit
def _exit(code):
    sys.stderr.write(f"FROZEN {gc.get_freeze_count()} ENABLED {gc.isenabled()}\\n")
    real_exit(code)
os._exit = _exit
sys.argv = ["bulkrelay", *sys.argv[1:]]
runpy.run_module("bulkrelay", run_name="__main__")
"""


def test_the_imported_commands_are_frozen_out_of_collections(tmp_path: Path) -> None:
    """The commands' modules, classes and job schema live as long as the process: frozen once imported,
    no collection walks them again (the first young collection after the import and the full one
    before relaying each took 20-28 ms of every command's start-up), and collection stays on."""
    (tmp_path / "in.csv").write_text("id,email\n1,a@example.com\n")
    (tmp_path / "job.yaml").write_text(_JOB)
    done = _python(["-c", _FROZEN, "validate", "job.yaml"], tmp_path)
    assert done.returncode == 0, done.stdout
    frozen = [line.split() for line in done.stderr.splitlines() if line.startswith("FROZEN ")]
    assert len(frozen) == 1, done.stderr
    assert int(frozen[0][1]) > 50_000  # the commands' import alone makes some 90,000 objects
    assert frozen[0][3] == "True"
