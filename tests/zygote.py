"""One process per test session worker and kind that has done a kind's imports once, and forks a fresh
process of that kind for each test that asks: `python tests/zygote.py target` forks embedded targets
(tests/targetproc.py), `python tests/zygote.py cli` forks `bulkrelay` commands (tests/clirun.py).

A target started as `python -m bulkrelay.demo.target` spends about 0.5 s of CPU importing aiohttp,
pydantic and the demo's modules before it serves, and a `bulkrelay` command 0.4 to 0.65 s importing
its own; the suite starts some 380 targets and 1,500 commands, most of its CPU. A fork of this process
runs the same code with the imports done: each is still a process of its own (its own state, pid,
streams and exit, killable), only its imports are shared. A command is forked with only what every
command imports anyway (`bulkrelay.cli.commands`) and third-party libraries, so a module a command
forgot to import fails here as it would for a user.

The protocol is a JSON line each way on the zygote's stdin and stdout:

    {"op": "start", "argv": [...], "log": PATH}                   -> {"pid": N}   (a target)
    {"op": "cli", "argv": [...], "cwd": DIR, "env": {...}, "umask": N,
     "stdout": FIFO, "stderr": FIFO}                              -> {"pid": N}   (a command)
    {"op": "wait", "pid": N, "timeout": S}                        -> {"exit": null | CODE}

(null: still running). A command's stdin is a pipe at its end, as `subprocess.run(input=b"")` gives;
its stdout and stderr are the FIFOs, opened here before the fork so the reader never sees an end
before the command has them. A child is reaped only when a `wait` reports its exit, so until then its
pid cannot be given to another process: signalling a pid the zygote has not reported ended is always
signalling the child. The zygote ends when its stdin does (its test process ended).
"""

from __future__ import annotations

import gc
import io
import json
import os
import runpy
import signal
import sys
import threading
import time
import traceback
from typing import Any


class _Forked(Exception):
    """Raised in a forked command to leave the zygote's loop: the command then runs as the program, and
    the interpreter ends as it would after `python -m bulkrelay` (its threads joined, atexit run)."""

    def __init__(self, request: dict[str, Any]) -> None:
        super().__init__()
        self.request = request


def _serve_target(argv: list[str], log: str) -> None:
    """In the forked child: the streams a `python -m` target would have, then the target itself."""
    try:
        null = os.open(os.devnull, os.O_RDWR)
        err = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(err, 2)
        os.closerange(3, 1024)  # the zygote's pipes above all: its parent must see them end with it
        # sys.stderr and sys.stdout write to descriptors 2 and 1, now the log and /dev/null
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from bulkrelay.demo import target

        target.main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stderr.flush()
    os._exit(code)


def _run_command(request: dict[str, Any]) -> None:
    """In the forked child: the process `python -m bulkrelay ARGV` would be, then the command. It
    never returns: the command ends by SystemExit, as the program does."""
    reading, writing = os.pipe()
    os.close(writing)
    stdout, stderr = request["fds"]
    for fd, target in ((reading, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
    os.closerange(3, 1024)  # as subprocess's close_fds: the zygote's pipes, the FIFOs' first descriptors
    # New stream objects, made as the interpreter makes them at start: the zygote's hold its own
    # protocol's read-ahead and writes.
    for fd, name, errors in ((0, "stdin", None), (1, "stdout", None), (2, "stderr", "backslashreplace")):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "r" if fd == 0 else "w", closefd=False)
        buffered = io.BufferedReader(raw) if fd == 0 else io.BufferedWriter(raw)
        stream = io.TextIOWrapper(
            buffered, encoding=old.encoding, errors=errors or old.errors, line_buffering=fd == 2
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.environ.clear()
    os.environ.update(request["env"])
    time.tzset()  # TZ was read when `time` was imported
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = ["-m", *request["argv"]]  # runpy puts the program's path first, as `python -m` does
    runpy.run_module("bulkrelay", run_name="__main__", alter_sys=True)


def _wait(pid: int, timeout: float | None) -> int | None:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(0.01)


def _fork() -> int:
    if threading.active_count() != 1:  # a fork beside another thread could copy a held lock
        raise RuntimeError("the zygote runs more than one thread")
    sys.stdout.flush()
    return os.fork()


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    op = request["op"]
    if op == "start":
        pid = _fork()
        if pid == 0:
            _serve_target([str(a) for a in request["argv"]], str(request["log"]))
        return {"pid": pid}
    if op == "cli":
        return {"pid": _fork_command(request)}
    if op == "wait":
        timeout = request["timeout"]
        return {"exit": _wait(int(request["pid"]), None if timeout is None else float(timeout))}
    return {"error": f"no op {op!r}"}


def _fork_command(request: dict[str, Any]) -> int:
    ends = [os.open(request[stream], os.O_WRONLY | os.O_NONBLOCK) for stream in ("stdout", "stderr")]
    try:
        for fd in ends:
            os.set_blocking(fd, True)  # a pipe's writer blocks when the pipe is full
        pid = _fork()
    except BaseException:
        _close(ends)
        raise
    if pid == 0:
        raise _Forked({**request, "fds": ends})
    _close(ends)  # the child's are its own
    return pid


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _preload(kind: str) -> None:
    if kind == "target":
        import bulkrelay.demo.target
    else:
        import anyio._backends._asyncio  # noqa: F401 - what every command imports, and libraries
        import jinja2  # noqa: F401

        import bulkrelay.cli.commands
        import bulkrelay.cli.main
        import bulkrelay.relay.transport.reqwest  # noqa: F401


def _serve() -> None:
    for line in sys.stdin.buffer:
        try:
            reply = _answer(json.loads(line))
        except _Forked:
            raise
        except Exception as exc:  # a bad request is answered, never the end of the zygote
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


def main() -> None:
    _preload(sys.argv[1])
    gc.collect()
    gc.freeze()  # the imported objects stay out of every child's collections (and its copied pages)
    command = None
    try:
        _serve()
    except _Forked as forked:
        command = forked.request
    if command is not None:  # outside the `except`: the command runs with no exception being handled
        _run_command(command)


if __name__ == "__main__":
    main()
