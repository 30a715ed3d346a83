"""Loopback servers a benchmark starts in processes of their own: the built-in target (recording off)
and a throwaway redis-server. Benchmarks never import `tests/` (tests/test_architecture.py): what they
share with the tests is the product (`python -m bulkrelay.demo.target`), not the tests' helpers.

    with builtin_target() as url: ...
    with redis_server() as redis_url: ...
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

_START_S = 15.0  # seconds a server has to answer before the benchmark gives up


@contextlib.contextmanager
def builtin_target() -> Iterator[str]:
    """The URL of `python -m bulkrelay.demo.target --no-record` on a free loopback port."""
    with tempfile.TemporaryDirectory(prefix="bulkrelay-bench-target-") as tmp:
        port_file = Path(tmp) / "port"
        command = [sys.executable, "-m", "bulkrelay.demo.target", "--port", "0", "--no-record"]
        proc = subprocess.Popen(
            [*command, "--port-file", str(port_file)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            _wait(port_file.exists, proc, "the built-in target")
            port = int(port_file.read_text())
            _wait(lambda: _answers(port, b""), proc, "the built-in target")
            yield f"http://127.0.0.1:{port}"
        finally:
            _stop(proc)


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """The URL of a redis-server on a free loopback port, with no persistence."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (Debian: apt-get install redis-server)")
    with tempfile.TemporaryDirectory(prefix="bulkrelay-bench-redis-") as tmp:
        port = _free_port()
        command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        proc = subprocess.Popen(
            [*command, "--dir", tmp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            _wait(lambda: _answers(port, b"PING\r\n"), proc, "redis-server")
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            _stop(proc)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(port: int, hello: bytes) -> bool:
    """The server accepts a connection (and answers `hello`, when there is one)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            if hello:
                conn.sendall(hello)
                return bool(conn.recv(64))
            return True
    except OSError:
        return False


def _wait(ready: Callable[[], bool], proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + _START_S
    while not ready():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer within {_START_S:.0f} s")
        time.sleep(0.02)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
