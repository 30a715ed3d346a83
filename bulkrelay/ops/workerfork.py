"""Worker processes forked from the run's own process, where that is safe (`execution.workers`).

A worker started as a new interpreter (`python -m bulkrelay.ops.relayworker`) first imports what its
parent imported long ago: about half a second of CPU each, which on a run of a few seconds is a large
part of the whole. A fork of the parent has all of it already. A process may fork safely only while it
runs one thread (a lock another thread held at the fork stays held in the child for ever), so the
parent forks its workers before its event loop starts, and only when the kernel says it runs one thread
(`/proc/self/status`); otherwise (threads left by an earlier step, another platform) ops/workers.py
starts new interpreters, as it always could.

The child keeps the parent's memory and nothing else: its standard output and error go to its log, its
input is /dev/null, every other descriptor is closed (a worker holding the run's lock would keep the run
locked for a moment after its parent's kill -9), the parent's signal handlers are undone, no object of
the parent's is ever finalized in it (gc.freeze), and it ends with os._exit, whatever happens. It then
runs exactly what a worker started as an interpreter runs (ops/relayworker.py `serve`).
"""

from __future__ import annotations

import fcntl
import gc
import os
import signal
import socket
import sys
import traceback
from contextlib import suppress
from pathlib import Path
from typing import NoReturn

from bulkrelay.ops.relayworker import serve
from bulkrelay.private import name_this_process, open_private

WORKER_NAME = b"relayworker"  # the forked worker's name in ps and top (/proc/PID/comm)
_SOCKET_FD = 3  # where the child's end of its socket is, before every higher descriptor is closed
_ABOVE_STANDARD = 10  # descriptors are moved here first, clear of 0-3, before they take their places


class ForkedProcess:
    """A forked worker, as subprocess.Popen is a started one: poll, wait, kill and the exit status."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self._reap(os.WNOHANG)

    def wait(self) -> int:
        code = self._reap(0)
        assert code is not None  # waitpid without WNOHANG returns once the process has ended
        return code

    def _reap(self, options: int) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, options)
            except ChildProcessError:  # reaped by someone else: its status is lost (Popen says 0 too)
                pid, status = self.pid, 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def may_fork() -> bool:
    """Whether this process runs one thread, so that a fork of it is whole (Linux only: /proc)."""
    if sys.platform != "linux":
        return False
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return False
    threads = [line.split()[1] for line in status.splitlines() if line.startswith("Threads:")]
    return threads == ["1"]


def fork_workers(log_paths: list[Path]) -> list[tuple[ForkedProcess, socket.socket]]:
    """Workers forked now, each writing to its log and waiting for its handoff at the other end of
    the socket returned with it. The caller checked `may_fork()`; under relay/heap.py's
    `relay_collections` the collection here has next to nothing left to look at."""
    gc.collect()  # no garbage of the parent's is left for a child's collector to finalize (its files)
    return [_fork_worker(path) for path in log_paths]


def _fork_worker(log_path: Path) -> tuple[ForkedProcess, socket.socket]:
    ours, theirs = socket.socketpair()
    log = open_private(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    parent = os.getpid()
    _flush_output()  # what the parent has buffered is the parent's to write, not the child's too
    pid = os.fork()
    if pid == 0:
        _be_worker(theirs.fileno(), log, parent)
    os.close(log)
    theirs.close()
    return ForkedProcess(pid), ours


def _be_worker(sock_fd: int, log_fd: int, parent: int) -> NoReturn:
    code = 1
    try:
        gc.freeze()  # the parent's objects, all reachable (fork_workers), are left alone here
        _keep_only(sock_fd, log_fd)
        _plain_signals()
        name_this_process(WORKER_NAME)
        code = serve(socket.socket(fileno=_SOCKET_FD), parent)
    except BaseException:  # the child ends here, whatever happened (os._exit, below)
        with suppress(Exception):
            traceback.print_exc()
    finally:
        _flush_output()
        os._exit(code)


def _flush_output() -> None:
    for stream in (sys.stdout, sys.stderr):
        with suppress(Exception):  # closed, replaced, or its disk full: nothing to do about it here
            stream.flush()


def _keep_only(sock_fd: int, log_fd: int) -> None:
    """Standard output and error to the log, input from /dev/null, the socket at 3; nothing else open."""
    sock = fcntl.fcntl(sock_fd, fcntl.F_DUPFD, _ABOVE_STANDARD)
    log = fcntl.fcntl(log_fd, fcntl.F_DUPFD, _ABOVE_STANDARD)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.dup2(sock, _SOCKET_FD)
    for name in os.listdir("/proc/self/fd"):  # only those open: the limit may be a million
        if int(name) > _SOCKET_FD:
            with suppress(OSError):
                os.close(int(name))


def _plain_signals() -> None:
    """The signal handling of a new interpreter: the parent's handlers (and its wake-up descriptor)
    are the parent's."""
    with suppress(ValueError):
        signal.set_wakeup_fd(-1)
    for number in signal.valid_signals():
        with suppress(OSError, ValueError):
            handler = signal.getsignal(number)
            if callable(handler) and handler is not signal.default_int_handler:
                signal.signal(number, signal.SIG_DFL)
