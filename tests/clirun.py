"""Run the real `bulkrelay` command in a subprocess and read its JSON envelope."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from tests.zygoteclient import ZYGOTE_ENV, Zygote


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
    command = [sys.executable, "-m", "bulkrelay", *map(str, args)]
    env = env if env is not None else cli_env()
    if not stdin and preexec_fn is None and _starts_alike(env):
        forked = _run_forked(command, Path.cwd() if cwd is None else cwd, env, timeout)
        if forked is not None:
            return forked
    return subprocess.run(
        command,
        cwd=cwd,
        env=env,
        input=stdin if stdin is not None else b"",
        capture_output=True,
        timeout=timeout,
        check=False,
        preexec_fn=preexec_fn,
    )


_commands = Zygote("cli")
# What the interpreter reads as it starts, and a fork of the zygote would not read again.
_READ_AT_START = ("PYTHON", "LC_", "LANG")


def _starts_alike(env: dict[str, str]) -> bool:
    """Whether a command with this environment would start as the zygote did."""
    names = {name for name in (*env, *ZYGOTE_ENV) if name.startswith(_READ_AT_START)}
    return all(env.get(name) == ZYGOTE_ENV.get(name) for name in names)


def _run_forked(
    command: list[str], cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[bytes] | None:
    """`command` as `subprocess.run` runs it (stdin at its end, stdout and stderr piped, killed and
    TimeoutExpired past `timeout`), forked by the CLI zygote; None when the zygote cannot."""
    deadline = time.monotonic() + timeout
    with tempfile.TemporaryDirectory(prefix="bulkrelay-cli-") as fifos:
        paths = [os.path.join(fifos, name) for name in ("stdout", "stderr")]
        for path in paths:
            os.mkfifo(path, 0o600)
        ends = [os.open(path, os.O_RDONLY | os.O_NONBLOCK) for path in paths]
        try:
            request = {"op": "cli", "argv": command[3:], "cwd": str(cwd), "env": env, "umask": _umask()}
            pid = _commands.start({**request, "stdout": paths[0], "stderr": paths[1]})
            if pid is None:
                return None
            stdout, stderr = _read_to_the_end(ends, deadline)
        finally:
            for fd in ends:
                os.close(fd)
    code = _ended(pid, deadline) if stdout is not None else None
    if code is None:
        os.kill(pid, signal.SIGKILL)  # unreaped until the zygote reports it: still the command's pid
        _commands.wait(pid, None)
        raise subprocess.TimeoutExpired(command, timeout, stdout, stderr)
    return subprocess.CompletedProcess(command, code, stdout or b"", stderr)


def _umask() -> int:
    """This process's umask, which a command it started would inherit (the zygote's is its own)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _read_to_the_end(fds: list[int], deadline: float) -> tuple[bytes | None, bytes]:
    """All of stdout and stderr, read together (neither pipe fills while the other is waited on);
    stdout None when the deadline came first."""
    read: dict[int, list[bytes]] = {fd: [] for fd in fds}
    open_fds = set(fds)
    while open_fds:
        left = deadline - time.monotonic()
        ready = select.select(list(open_fds), [], [], max(left, 0))[0] if left > 0 else []
        if not ready:
            return None, b"".join(read[fds[1]])
        for fd in ready:
            chunk = os.read(fd, 65536)
            if chunk:
                read[fd].append(chunk)
            else:
                open_fds.discard(fd)
    return b"".join(read[fds[0]]), b"".join(read[fds[1]])


def _ended(pid: int, deadline: float) -> int | None:
    """The command's exit code once its streams have ended, or None at the deadline. The zygote is
    polled, never asked to wait: another thread of the test may need it meanwhile."""
    while True:
        code = _commands.poll(pid)
        if code is not None or time.monotonic() >= deadline:
            return code
        time.sleep(0.002)
