"""The embedded target in its own process, for tests that need a separate server (crash tests, CLI runs).

    with TargetProcess({"rules": [{"status": 503, "times": 3}]}) as target:
        ... relay to target.url ...
        assert target.stats()["requests"] == 10
        rows = target.requests()

The control API is reached with urllib, so the helper is usable from sync and async tests alike
(from async tests, keep calls short: they block the loop for a loopback round trip).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

_START_TIMEOUT = 15.0
_ZYGOTE = Path(__file__).with_name("targetzygote.py")
# The environment the zygote gets, taken at collection: not whatever a test that happens to start the
# first target has set meanwhile, which every later target would inherit.
_ZYGOTE_ENV = dict(os.environ)


class _Zygote:
    """This test process's one zygote (tests/targetzygote.py), started at the first target: it forks
    each target with the target's imports already done. None of it is needed for a target to work: when
    the zygote cannot start or answer, targets start as `python -m bulkrelay.demo.target`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._broken = False

    def start(self, argv: list[str], log: Path) -> int | None:
        """The pid of a new target process, or None: start it otherwise."""
        reply = self._ask({"op": "start", "argv": argv, "log": str(log)})
        pid = None if reply is None else reply.get("pid")
        return pid if isinstance(pid, int) else None

    def poll(self, pid: int) -> int | None:
        """The target's exit code once it has ended (it is then reaped: never signal it again)."""
        return self.wait(pid, 0)

    def wait(self, pid: int, timeout: float | None) -> int | None:
        bound = None if timeout is None else timeout + _START_TIMEOUT
        reply = self._ask({"op": "wait", "pid": pid, "timeout": timeout}, bound)
        if reply is None:
            raise RuntimeError("the target zygote ended while it held a target")
        code = reply.get("exit")
        return code if isinstance(code, int) else None

    def _ask(self, request: dict[str, Any], bound: float | None = _START_TIMEOUT) -> dict[str, Any] | None:
        """The zygote's reply, or None: it refused, or it is broken (gone, or silent past `bound`
        seconds, when it is killed), and every target from now on starts as a process."""
        with self._lock:
            if self._broken:
                return None
            try:
                proc = self._proc or self._spawn()
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(json.dumps(request).encode() + b"\n")
                proc.stdin.flush()
                if not select.select([proc.stdout], [], [], bound)[0]:
                    proc.kill()
                    raise OSError("the target zygote did not answer")
                reply: dict[str, Any] = json.loads(proc.stdout.readline())
            except (OSError, ValueError):
                self._broken = True
                return None
            return None if "error" in reply else reply

    def close(self) -> None:
        """End the zygote (its stdin's end is its signal to go) and close its pipes."""
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is None:
                return
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(BrokenPipeError):  # a request left unsent to a zygote gone
                        pipe.close()
            proc.wait()

    def _spawn(self) -> subprocess.Popen[bytes]:
        self._proc = subprocess.Popen(
            [sys.executable, str(_ZYGOTE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd="/",
            env=_ZYGOTE_ENV,
        )
        return self._proc


_zygote = _Zygote()
atexit.register(_zygote.close)


class TargetProcess:
    def __init__(self, plan: dict[str, Any] | None = None, *, record: bool = True) -> None:
        self._plan = plan
        self._record = record
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid: int | None = None  # a target forked by the zygote, instead of _proc
        self._exit: int | None = None  # its exit code, once the zygote reaped it
        self._pidfd: int | None = None  # the forked target's process, to signal whoever reaps it
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The target's process while it runs, forked by the zygote or started as a process."""
        if self._proc is not None:
            return self._proc.pid
        return self._pid

    def start(self) -> TargetProcess:
        self._tmp = tempfile.TemporaryDirectory(prefix="bulkrelay-target-")
        workdir = Path(self._tmp.name)
        port_file = workdir / "port"
        command = [
            sys.executable,
            "-m",
            "bulkrelay.demo.target",
            "--port",
            "0",
            "--port-file",
            str(port_file),
        ]
        if self._plan is not None:
            (workdir / "plan.json").write_text(json.dumps(self._plan))
            command += ["--plan", str(workdir / "plan.json")]
        if not self._record:
            command.append("--no-record")
        self._pid = _zygote.start(command[3:], workdir / "target.log")
        if self._pid is not None:  # unreaped until the zygote says it ended: the pid is still its own
            self._pidfd = os.pidfd_open(self._pid)
        else:
            log = (workdir / "target.log").open("wb")
            self._proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
            log.close()
        try:
            self.port = self._wait_for_port(port_file)
            self._wait_until_answering()
        except BaseException:
            self.stop()  # its process and directory go, whatever kept it from serving
            raise
        return self

    def stop(self) -> None:
        if self._pid is not None:
            if self._exit is None:
                self._stop_forked(self._pid)
            self._pid = self._exit = None
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _stop_forked(self, pid: int) -> None:
        """SIGTERM, SIGKILL after 10 s, each through the pidfd taken at the start (it names this process
        alone, whoever reaps it), and the zygote reaps it; a zygote gone meanwhile leaves the kill alone."""
        try:
            self._signal(signal.SIGTERM)
            if _zygote.wait(pid, 10) is None:
                self._signal(signal.SIGKILL)
                _zygote.wait(pid, None)
        except RuntimeError:  # the zygote ended: its children went to init, which reaps them
            self._signal(signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):  # ended already
                signal.pidfd_send_signal(self._pidfd, signum)

    def __enter__(self) -> TargetProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def set_plan(self, plan: dict[str, Any]) -> None:
        self._call("POST", "plan", json.dumps(plan).encode())

    def reset(self) -> None:
        self._call("POST", "reset", b"")

    def release(self) -> None:
        """Answer now every request a delay holds (POST /_control/release)."""
        self._call("POST", "release", b"")

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self._call("GET", "stats"))
        return result

    def store(self) -> dict[str, Any]:
        """The records a `"store": true` target holds, {path: body}."""
        result: dict[str, Any] = json.loads(self._call("GET", "store"))
        return result

    def requests(self) -> list[dict[str, Any]]:
        """Every recorded request, in arrival order."""
        return [json.loads(line) for line in self._call("GET", "requests").splitlines() if line]

    def _call(self, method: str, action: str, body: bytes | None = None) -> bytes:
        request = urllib.request.Request(f"{self.url}/_control/{action}", data=body, method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            data: bytes = response.read()
            return data

    def _wait_for_port(self, port_file: Path) -> int:
        deadline = time.monotonic() + _START_TIMEOUT
        while not port_file.exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError("the target process did not report its port in time")
            time.sleep(0.02)
        return int(port_file.read_text())

    def _wait_until_answering(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            try:
                self.stats()
                return
            except (urllib.error.URLError, ConnectionError):
                self._check_alive()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def _check_alive(self) -> None:
        assert self._tmp is not None
        if self._pid is not None:
            if self._exit is None:
                self._exit = _zygote.poll(self._pid)
            code = self._exit
        else:
            assert self._proc is not None
            code = self._proc.poll()
        if code is not None:
            log = (Path(self._tmp.name) / "target.log").read_text(errors="replace")
            raise RuntimeError(f"the target process exited with {code}:\n{log}")
