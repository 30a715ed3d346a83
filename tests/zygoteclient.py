"""This test process's zygotes (tests/zygote.py), one a kind, each started at its first use. None of
them is needed for a test to work: when a zygote cannot start or answer, its callers start their
processes as `python -m ...` instead."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

_START_TIMEOUT = 15.0
_SERVER = Path(__file__).with_name("zygote.py")
# The environment the zygotes get, taken at collection: not whatever a test that happens to start the
# first process has set meanwhile, which every later process would inherit.
ZYGOTE_ENV = dict(os.environ)


class Zygote:
    """One zygote of a kind (`target`, `cli`): it forks each process with the kind's imports done."""

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._broken = False
        atexit.register(self.close)

    def start(self, request: dict[str, Any]) -> int | None:
        """The pid of a new process, or None: start it otherwise."""
        reply = self._ask(request)
        pid = None if reply is None else reply.get("pid")
        return pid if isinstance(pid, int) else None

    def poll(self, pid: int) -> int | None:
        """The process's exit code once it has ended (it is then reaped: never signal it again)."""
        return self.wait(pid, 0)

    def wait(self, pid: int, timeout: float | None) -> int | None:
        bound = None if timeout is None else timeout + _START_TIMEOUT
        reply = self._ask({"op": "wait", "pid": pid, "timeout": timeout}, bound)
        if reply is None:
            raise RuntimeError(f"the {self._kind} zygote ended while it held a process")
        code = reply.get("exit")
        return code if isinstance(code, int) else None

    def _ask(self, request: dict[str, Any], bound: float | None = _START_TIMEOUT) -> dict[str, Any] | None:
        """The zygote's reply, or None: it refused, or it is broken (gone, or silent past `bound`
        seconds, when it is killed), and every process from now on starts otherwise."""
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
                    raise OSError(f"the {self._kind} zygote did not answer")
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
            [sys.executable, str(_SERVER), self._kind],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd="/",
            env=ZYGOTE_ENV,
        )
        return self._proc
