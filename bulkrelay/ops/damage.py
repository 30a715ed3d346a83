"""What a user can do about a damaged run, told by the command that met the damage.

The store says where a run is damaged (`JOURNAL_CORRUPT`: file, line, byte offset); only the command
knows what the damage stops. A resume cannot go on without knowing which rows were committed; the
readers of results (`export`, `failures`, `retry-failed`) cannot answer until the file is restored.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from bulkrelay.errors import JournalCorrupt
from bulkrelay.store.rundir import RunDir

Command = Literal["resume", "export", "failures", "retry-failed"]

_ADVICE: dict[Command, str] = {
    # `resume` and the identical re-run, which continues the run the same way
    "resume": (
        "the run cannot be continued safely: restore {file} from a backup and run the same command again; "
        "or start over: move {run} aside and run the job again (rows it delivered are delivered again)"
    ),
    "export": (
        "export does not guess the results past the damage: restore {file} from a backup and export "
        "again; meanwhile `bulkrelay status {run}` shows the run's counters"
    ),
    "failures": (
        "the failed rows past the damage cannot be listed: restore {file} from a backup and ask for the "
        "failures again; meanwhile `bulkrelay status {run}` shows the run's counters"
    ),
    "retry-failed": (
        "which rows failed cannot be known past the damage, so nothing was retried: restore {file} from "
        "a backup and retry again, or send the whole input once more with `bulkrelay run` (rows already "
        "delivered are delivered again)"
    ),
}


@contextmanager
def advice_on_damage(run: RunDir, command: Command) -> Iterator[None]:
    """A `JournalCorrupt` raised inside gets the suggestion that fits `command`, naming the damaged file."""
    try:
        yield
    except JournalCorrupt as exc:
        damaged = exc.context.get("file") or exc.context.get("path") or run.journal_path
        exc.suggestion = _ADVICE[command].format(file=damaged, run=shlex.quote(str(run.path)))
        raise
