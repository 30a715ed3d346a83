"""How the `bulkrelay` process ends once its envelope is written: with the exit code the envelope says.

pyreqwest runs its Tokio runtime on threads of its own that live until the process ends; it has no
way to stop them. On CPython before 3.13, such a thread that takes the GIL while the interpreter
finalizes aborts the whole process ("Fatal Python error: PyGILState_Release: thread state ... must be
current when releasing", SIGABRT, exit status -6/134), after the envelope already said 0 or 8: seen
in 6 of 150 `validate --check-auth` calls with a refused secret on a loaded two-core machine. A cron
job or an agent would then read a crash where the run had succeeded.

So when pyreqwest is loaded, the process does what finalization would have done for it and nothing
more: it waits for its other non-daemon threads (as the interpreter does), runs the atexit handlers,
flushes stdout and stderr, and ends with `os._exit`, so no Tokio thread ever meets a half-torn-down
interpreter. Without pyreqwest (the httpx client, `--help`), the ordinary `sys.exit` stays.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_process(code: int) -> NoReturn:
    if "pyreqwest" not in sys.modules:
        sys.exit(code)
    _join_other_threads()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: what sys.exit would also have lost
            pass
    os._exit(code)


def _join_other_threads() -> None:
    """What the interpreter does before finalizing: wait for every non-daemon thread to end."""
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon:
            thread.join()
