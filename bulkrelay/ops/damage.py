"""A damaged run found before its journal is read, and what a user can do about it, told by the
command that met the damage.

The store says where a run is damaged (`JOURNAL_CORRUPT`: file, line, byte offset); only the command
knows what the damage stops. A resume cannot go on without knowing which rows were committed; the
readers of results (`export`, `failures`, `retry-failed`, and a job that reads another job's results:
`input.results_of` or a lookup's `results_of`) cannot answer until the file is restored. Every reader
checks the journal here first (`check_committed_journal`), then reads it: none meets damage halfway.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from bulkrelay.errors import JournalCorrupt
from bulkrelay.store.checkpoint import read_checkpoint
from bulkrelay.store.journal import JournalScan, scan_journal
from bulkrelay.store.rundir import JOURNAL, SUMMARY, RunDir
from bulkrelay.store.summary import summarized_outcomes

Command = Literal["resume", "export", "failures", "retry-failed", "results_of"]

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
    # a chained job or a lookup reading this run's results: nothing was sent
    "results_of": (
        "the results past the damage cannot be read, so this job sent nothing: restore {file} from a "
        "backup and run this job again; or move {run} aside (its results are then no longer read)"
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


def require_journal(run: RunDir) -> None:
    """Refuse a run whose journal is gone. The journal is made with the run directory, so without it
    nothing says which rows were committed; starting the rows over would deliver them all again."""
    if run.journal_path.exists():
        return
    raise JournalCorrupt(
        f"{JOURNAL} is missing from run {run.run_id} (state {run.state}): "
        "which rows were committed cannot be known, so the run is not started over",
        context={"run_dir": str(run.path), "file": str(run.journal_path), "offset": 0, "line": 1},
    )  # the suggestion is the caller's: see advice_on_damage


def check_committed_journal(run: RunDir, reader: Command) -> None:
    """Refuse to read a run's results from a journal that is gone or damaged at or before its
    checkpoint: `retry-failed`, `export`, `failures` and a job reading another's results (the `reader`)
    would otherwise take the rows after the damage for unsent (or not failed, or missing) and quietly
    leave them out. Reads only; a torn tail of a run that did not finish is left for resume."""
    scanned_journal(run, run.plan.input.record_count, reader)


def scanned_journal(run: RunDir, record_count: int, command: Command) -> JournalScan:
    """The journal checked against the checkpoint; damage is refused with advice that fits `command`."""
    with advice_on_damage(run, command):
        require_journal(run)
        checkpoint = read_checkpoint(run.path)
        scan = scan_journal(
            run.journal_path,
            committed_seq=checkpoint.seq if checkpoint else 0,
            committed_offset=checkpoint.offset if checkpoint else 0,
            row_count=record_count,
            prefix=checkpoint.prefix if checkpoint else None,
        )
        if checkpoint is None and run.state.final:
            _check_finished_journal(run, scan)
        return scan


def _check_finished_journal(run: RunDir, scan: JournalScan) -> None:
    """A run that completed or was cancelled keeps no checkpoint. A completed run's journal is whole,
    every group committed: a torn end is damage there. (A cancelled run's worker may have died
    mid-write: its torn end is simply not committed.) Either holds the rows its summary counted."""
    counted = summarized_outcomes(run.path, required=run.state.every_row_ended)
    if scan.torn_tail is not None and run.state.every_row_ended:
        torn = scan.torn_tail
        reason = f"{torn.reason}: the run is {run.state}, so its journal must end with a whole group"
        where = {"file": str(run.journal_path), "offset": torn.start, "line": torn.line, "reason": reason}
        raise JournalCorrupt(
            f"{run.journal_path.name} is corrupt at line {torn.line} (byte offset {torn.start}): {reason}",
            context=where,
        )
    if counted is not None and sum(counted) != scan.last_seq:
        reason = f"the journal holds {scan.last_seq} rows, the run's summary counted {sum(counted)}"
        raise JournalCorrupt(
            f"{run.journal_path.name} does not match {SUMMARY}: {reason}",
            context={"file": str(run.journal_path), "offset": scan.valid_end, "line": None, "reason": reason},
        )
