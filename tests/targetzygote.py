"""One process per test session worker that has imported the embedded target once, and forks a fresh
target process for each test that asks (tests/targetproc.py).

A target started as `python -m bulkrelay.demo.target` spends about 0.5 s of CPU importing aiohttp,
pydantic and the demo's modules before it serves; the suite starts some 380 of them, a sixth of its
CPU. A fork of this process starts the same code with all of that imported: the target is still a
process of its own per test (its own state, port, pid and log, killable), only its imports are shared.

The protocol is a JSON line each way on the zygote's stdin and stdout:

    {"op": "start", "argv": [...], "log": PATH}   -> {"pid": N}
    {"op": "wait", "pid": N, "timeout": S}        -> {"exit": null | CODE}   (null: still running)

A child is reaped only when a `wait` reports its exit, so until then its pid cannot be given
to another process (pid_max is 32,768 here): signalling a pid the zygote has not reported ended is
always signalling the target. The zygote ends when its stdin does (its test process ended).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any


def _serve_child(argv: list[str], log: str) -> None:
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


def _wait(pid: int, timeout: float | None) -> int | None:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(0.01)


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    op = request["op"]
    if op == "start":
        if threading.active_count() != 1:  # a fork beside another thread could copy a held lock
            return {"error": "the zygote runs more than one thread"}
        pid = os.fork()
        if pid == 0:
            _serve_child([str(a) for a in request["argv"]], str(request["log"]))
        return {"pid": pid}
    if op == "wait":
        timeout = request["timeout"]
        return {"exit": _wait(int(request["pid"]), None if timeout is None else float(timeout))}
    return {"error": f"no op {op!r}"}


def main() -> None:
    import bulkrelay.demo.target  # noqa: F401 - the imports every forked target shares

    gc.collect()
    gc.freeze()  # the imported objects stay out of every child's collections (and its copied pages)
    for line in sys.stdin.buffer:
        try:
            reply = _answer(json.loads(line))
        except Exception as exc:  # a bad request is answered, never the end of the zygote
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
