"""A real `redis-server` on a free loopback port, for the shared rate limit's tests.

    with RedisProcess() as redis_url: ...

`.ci/run` installs Debian's redis-server when it is missing; where it cannot be installed the tests that
need it are skipped with a message saying so (`require_redis_server()`), never passed.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from types import TracebackType

import pytest

_START_TIMEOUT = 15.0


def require_redis_server() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server; .ci/run does this)")
    return binary


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RedisProcess:
    def __init__(self, *, password: str | None = None) -> None:
        self._password = password
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> str:
        binary = require_redis_server()
        self._tmp = tempfile.TemporaryDirectory()
        for _ in range(5):  # a port free a moment ago may be taken by the time redis binds it
            self.port = _free_port()
            command = [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                *(["--requirepass", self._password] if self._password else []),
            ]
            self._proc = subprocess.Popen(
                [*command, "--dir", self._tmp.name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            if self._wait_ready():
                return self.url
            self._stop()
        raise RuntimeError("redis-server did not start")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(64).startswith((b"+PONG", b"-NOAUTH")):
                        return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def _stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def kill(self) -> None:
        """Take the server away, as a crash or a network partition would."""
        self._stop()

    def hang(self) -> None:
        """Stop the server (SIGSTOP): connections are still accepted by the kernel, nothing answers."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def wake(self) -> None:
        """Let a hung server go on (SIGCONT)."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop()
        if self._tmp is not None:
            self._tmp.cleanup()
