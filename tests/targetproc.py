"""The embedded target in its own process, for tests that need a separate server (crash tests, CLI runs).

    with TargetProcess({"rules": [{"status": 503, "times": 3}]}) as target:
        ... relay to target.url ...
        assert target.stats()["requests"] == 10
        rows = target.requests()

The control API is reached with urllib, so the helper is usable from sync and async tests alike
(from async tests, keep calls short: they block the loop for a loopback round trip).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.zygoteclient import Zygote

_START_TIMEOUT = 15.0
_zygote = Zygote("target")


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
        self._pid = _zygote.start({"op": "start", "argv": command[3:], "log": str(workdir / "target.log")})
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
