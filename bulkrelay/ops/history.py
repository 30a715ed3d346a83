"""`report --history JOB_NAME [-o FILE|-] [--nights N]`: the job's last nights on one page (`report/`).

Read from the runs directory alone: each night's `run.json` and `summary.json`, no journal."""

from __future__ import annotations

import re
from pathlib import Path

from bulkrelay.envelope import Result, SideChannel
from bulkrelay.errors import NotFound, StorageFailed, UsageError
from bulkrelay.ops.report import STDOUT, TO_STDOUT_INSTEAD
from bulkrelay.ops.results import HistoryResult
from bulkrelay.report.historypage import history_page
from bulkrelay.report.nights import nights_of
from bulkrelay.store.atomic import file_to_replace, write_atomic
from bulkrelay.store.rundir import utc_now

DEFAULT_NIGHTS = 30


def history(name: str, runs_dir: Path, output: Path | None = None, nights: int = DEFAULT_NIGHTS) -> Result:
    """Write the page of job `name`'s last `nights` nights (default: `history-<name>.html` in the runs
    directory)."""
    to_stdout = output is not None and str(output) == STDOUT  # as `report RUN -o -`: the page on stdout
    target = (
        output if output is not None else runs_dir / f"history-{re.sub(r'[^A-Za-z0-9._-]', '_', name)}.html"
    )
    written = (
        target
        if output is None or to_stdout
        else file_to_replace(output, named="-o", suggestion=TO_STDOUT_INSTEAD)
    )
    shown = nights_of(runs_dir, name)[-nights:]
    if not shown:  # a misspelt name, or the wrong runs directory: a page of nothing would hide it
        raise NotFound(
            f"no night of job {name!r} in {runs_dir}",
            context={"job": name, "runs_dir": str(runs_dir)},
            suggestion="`bulkrelay runs` lists the jobs' names (a job's name:, else its file's stem)",
        )
    html = history_page(name, runs_dir, shown, utc_now())
    bad = tuple(night.run_id for night in shown if night.bad)
    if to_stdout:
        data = HistoryResult(name, str(runs_dir.absolute()), STDOUT, len(shown), bad)
        return Result(data=data, side=SideChannel(stdout_payload=html))
    try:
        write_atomic(written, html.encode())
    except StorageFailed as exc:
        raise UsageError(
            f"cannot write the history page to {target}: {exc.message}",
            context={"output": str(target)},
            suggestion="name with -o a file in a directory you can write to",
        ) from None
    data = HistoryResult(name, str(runs_dir.absolute()), str(target.absolute()), len(shown), bad)
    return Result(data=data)
