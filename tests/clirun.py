"""Run the real `bulkrelay` command in a subprocess and read its JSON envelope."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson


@dataclass
class CliResult:
    exit_code: int
    envelope: dict[str, Any]
    stderr: str
    stdout: bytes

    @property
    def error_code(self) -> str | None:
        error = self.envelope.get("error")
        return None if error is None else str(error["code"])

    @property
    def data(self) -> Any:
        return self.envelope["data"]


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a CLI call: the test's own, less BulkRelay settings but the private state
    and CPU claims dirs."""
    keep = ("BULKRELAY_STATE_DIR", "BULKRELAY_CPU_DIR")
    env = {
        k: v
        for k, v in os.environ.items()
        if k in keep or not k.startswith(("BULKRELAY_", "AGENT_CALL_BUDGET"))
    }
    env.update(extra)
    return env


def run_cli(
    *args: str | Path,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    timeout: float = 120,
    preexec_fn: Callable[[], None] | None = None,
) -> CliResult:
    proc = run_cli_raw(*args, cwd=cwd, env=env, stdin=stdin, timeout=timeout, preexec_fn=preexec_fn)
    envelope = orjson.loads(proc.stdout)
    assert set(envelope) == {"ok", "data", "error", "warnings", "meta"}, envelope
    # Said in full when it fails: a process that ends otherwise than its envelope says (a crash while
    # exiting, say) is seen once in a while under load, and its stderr is what tells why.
    assert envelope["meta"]["exit_code"] == proc.returncode, (proc.returncode, envelope, proc.stderr[-4000:])
    assert envelope["ok"] is (proc.returncode == 0)
    return CliResult(proc.returncode, envelope, proc.stderr.decode(errors="replace"), proc.stdout)


def start_cli(
    *args: str | Path,
    cwd: Path,
    env: dict[str, str] | None = None,
    output: Literal["piped", "stdout", "discarded"] = "piped",
) -> subprocess.Popen[bytes]:
    """The real CLI in a process of its own, for a test that acts on it while it runs (a signal, a
    kill -9, a look at its status). Stdin is closed; `output` says what becomes of stdout and stderr:
    both piped (read them with `communicate()`), stdout alone (stderr discarded), or neither."""
    pipe = {"piped": (subprocess.PIPE, subprocess.PIPE), "stdout": (subprocess.PIPE, subprocess.DEVNULL)}
    stdout, stderr = pipe.get(output, (subprocess.DEVNULL, subprocess.DEVNULL))
    return subprocess.Popen(
        [sys.executable, "-m", "bulkrelay", *map(str, args)],
        cwd=cwd,
        env=env if env is not None else cli_env(),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
    )


def run_cli_peak_rss(*args: str | Path, cwd: Path) -> tuple[int, dict[str, Any], int]:
    """The CLI's exit code, envelope, and peak RSS in bytes (by wait4: of the CLI and of every process
    it waited for, a delta night's line scan among them), for the tests of bounded memory."""
    proc = start_cli(*args, cwd=cwd, output="stdout")
    assert proc.stdout is not None
    with proc.stdout:
        out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, orjson.loads(out), usage.ru_maxrss * 1024


def run_cli_raw(
    *args: str | Path,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    timeout: float = 120,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """The real CLI with no terminal anywhere, its output as it is (for `--quiet`, `--human`)."""
    return subprocess.run(
        [sys.executable, "-m", "bulkrelay", *map(str, args)],
        cwd=cwd,
        env=env if env is not None else cli_env(),
        input=stdin if stdin is not None else b"",
        capture_output=True,
        timeout=timeout,
        check=False,
        preexec_fn=preexec_fn,
    )
