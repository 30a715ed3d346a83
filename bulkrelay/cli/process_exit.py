"""How the `bulkrelay` process ends once its envelope is written: with the exit code the envelope says.

pyreqwest runs its Tokio runtime on threads of its own that live until the process ends; it has no
way to stop them. On CPython before 3.13, such a thread that takes the GIL while the interpreter
finalizes aborts the whole process ("Fatal Python error: PyGILState_Release: thread state ... must be
current when releasing", SIGABRT, exit status -6/134), after the envelope already said 0 or 8: seen
in 6 of 150 `validate --check-auth` calls with a refused secret on a loaded two-core machine. A cron
job or an agent would then read a crash where the run had succeeded.

So when pyreqwest is loaded, the process does what finalization would have done for it and nothing
more: it takes the interpreter's own first step of exiting (`threading._shutdown`: the threading
module's exit hooks, which tell an open thread pool to end, then every non-daemon thread joined), runs
the atexit handlers, flushes stdout and stderr, and ends with `os._exit`, so no Tokio thread ever
meets a half-torn-down interpreter. Without pyreqwest (the httpx client, `--help`), the ordinary
`sys.exit` stays.
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
    # The interpreter's own first step of exiting: the threading module's exit hooks (a thread pool
    # left open is told to end there), then every non-daemon thread joined.
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: what sys.exit would also have lost
            pass
    os._exit(code)
