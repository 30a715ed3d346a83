"""Human output on a terminal: the same typed result the envelope carries, shown with rich.

Each result type has one view here, chosen by the value's type."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.rule import Rule
from rich.table import Table

from bulkrelay.background.reach import BackgroundJobEnded, BackgroundJobGoesOn
from bulkrelay.cli.parser import HelpText, VersionInfo
from bulkrelay.envelope import CommandData, ErrorInfo, Result
from bulkrelay.ops.results import (
    DemoResult,
    FailuresResult,
    HistoryResult,
    PruneResult,
    RenderResult,
    ReportResult,
    RunResult,
    RunsResult,
    StatusResult,
    ValidateResult,
)
from bulkrelay.relay.progress import pace_text
from bulkrelay.relay.ratelimit import Pace
from bulkrelay.safetext import isolated, visible
from bulkrelay.store.summary import RunSummary


class _Console(Console):
    """A reader that went away (EPIPE) is for the CLI's one catch site (`main.emit`: the answer is lost,
    the exit code stands); rich's own handling would exit 1 in the middle of printing."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more for a reader that has gone
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    def print(self, *objects: Any, **options: Any) -> None:
        """Text as it is, never markup (`bulkrelay[postgres]`, `user[email]` stay), its control and
        bidi formatting characters shown as escapes (an ESC from a row never reaches the terminal).
        A line styled on purpose says `markup=True` and passes its values through `_value`."""
        if options.setdefault("markup", False):  # its values came through _value: shown already
            super().print(*objects, **options)
            return
        super().print(*(visible(o) if isinstance(o, str) else o for o in objects), **options)


def _value(value: object) -> str:
    """A value for a line printed with `markup=True`: its brackets escaped, right-to-left text isolated."""
    return escape(isolated(str(value)))


def _cells(*cells: object) -> list[str]:
    """A table's cells: no markup read in them (the console's setting), control characters shown."""
    return [visible("" if cell is None else str(cell)) for cell in cells]


# Off a terminal (cron mail, `--human | cat`) rich would wrap at 80 columns and break a command, a hint or
# a JSON body in two: there the lines are as long as their text, and tables as wide as their cells.
_UNWRAPPED = 100_000
_RULE_WIDTH = 80  # a rule spans the terminal, or this off one


def _console_for(*, stderr: bool = False) -> _Console:
    console = _Console(stderr=stderr, markup=False)
    if console.is_terminal:
        return console
    return _Console(stderr=stderr, width=_UNWRAPPED, soft_wrap=True, markup=False)


_console = _console_for()
_err = _console_for(stderr=True)


def print_human(result: Result, envelope: dict[str, Any]) -> None:
    for warning in envelope["warnings"]:
        _err.print(f"[yellow]warning[/] {_value(warning['code'])}: {_value(warning['message'])}", markup=True)
    data = result.data
    if isinstance(data, dict) and result.kind in _STORED:  # a background job's result, read back
        data = _STORED[result.kind](data)
    view = _VIEWS.get(type(data))
    if view is not None:
        view(data)
    elif data is not None:  # a result with no view of its own (export, sync-state) or an error's data
        _console.print_json(data=envelope["data"])
    if result.error is not None:
        _print_error(result.error)


def _print_error(error: ErrorInfo) -> None:
    _err.print(f"[bold red]error[/] {error.code}: {_value(error.message)}", markup=True, highlight=False)
    for problem in (error.context or {}).get("problems", [])[1:]:
        where = ", ".join(f"{k} {v}" for k, v in problem.items() if k != "message")
        _err.print(f"  {where}: {problem['message']}", highlight=False)
    if error.suggestion:
        _err.print(f"[dim]hint:[/] {_value(error.suggestion)}", markup=True, highlight=False)


def _validate(valid: ValidateResult) -> None:
    _console.print(
        f"[green]valid[/] {_value(valid.job)}: {valid.record_count} records ({valid.format}"
        f"{', gzip' if valid.gzip else ''}) from {_value(valid.input.path)}",
        markup=True,
        highlight=False,
    )
    _console.print(f"input sha256 {valid.input.sha256}  config sha256 {valid.config_sha256}")
    if valid.auth is not None:
        _console.print(
            f"[green]token endpoint accepts the client[/] ({_value(valid.auth['token_url'])})",
            markup=True,
            highlight=False,
        )


def _render(rendered: RenderResult) -> None:
    if rendered.curl:  # one command line per request, never wrapped: it is pasted into a shell
        for request in rendered.requests:
            _console.print(request.curl, markup=False, highlight=False, soft_wrap=True)
        return
    for request in rendered.requests:
        if request.batch is not None:
            rows = request.batch["rows"]
            title = f"batch {request.batch['seq']}: rows {rows[0]}-{rows[-1]}, {len(rows)} items"
        else:
            title = f"row {request.row_number} (line {request.line})"
        _console.print(Rule(title), width=_console.width if _console.is_terminal else _RULE_WIDTH)
        _console.print(f"[bold]{request.method}[/] {_value(request.url)}", markup=True, highlight=False)
        for name, value in request.headers:
            _console.print(f"{name}: {value}", highlight=False)
        if request.body is not None:
            _console.print()
            _console.print(request.body, highlight=False)


def _summary_table(summary: RunSummary) -> Table:
    table = Table(title="summary", show_header=False)
    table.add_row("rows", f"{summary.rows_done} of {summary.rows_total} done")
    table.add_row("succeeded", str(summary.succeeded))
    table.add_row("failed", str(summary.failed))
    table.add_row("attempts / retries", f"{summary.attempts} / {summary.retries}")
    table.add_row("by status", ", ".join(f"{k}: {v}" for k, v in summary.by_status.items()))
    table.add_row("by classification", ", ".join(f"{k}: {v}" for k, v in summary.by_classification.items()))
    latency = summary.latency_ms
    table.add_row("latency ms p50/p95/p99", " / ".join(_ms(latency.get(p)) for p in ("p50", "p95", "p99")))
    if summary.this_call is not None:
        table.add_row("rate", f"{summary.this_call.rows_per_second} rows/s")
    return table


def _ms(value: object) -> str:
    return "-" if value is None else str(value)  # no rows yet: no latency, never "None"


def _status(status: StatusResult) -> None:
    summary = RunSummary.from_json(status.summary) if status.summary else None  # summary.json, as read
    _run_lines(summary, status.run_id, status.state, status.run_dir, status.continue_command)
    line = f"liveness: {status.liveness}"
    if status.pid:
        line += f" (pid {status.pid})"
    if status.stop_reason:
        line += f"; stop reason: {status.stop_reason}"
    _console.print(line, highlight=False)
    if status.rate:  # as the checkpoint or the summary holds it
        rate = status.rate
        _console.print(
            f"pace: {pace_text(Pace.from_dict(rate), rate.get('rows_per_second'))}", highlight=False
        )
    if status.report:
        _console.print(f"report: {status.report}", highlight=False)


def _run(run: RunResult) -> None:
    _run_lines(run.summary, run.run_id, run.state, run.run_dir, run.continue_command)
    if run.report:
        _console.print(f"report: {run.report}", highlight=False)


def _history(written: HistoryResult) -> None:
    bad = f", {len(written.bad_nights)} bad" if written.bad_nights else ""
    _console.print(
        f"history of {written.job} ({written.nights} nights{bad}): {written.output}",
        markup=False,
        highlight=False,
    )


def _report(written: ReportResult) -> None:
    if written.output == "-":
        return  # the page itself went to stdout
    _console.print(
        f"report of run {written.run_id} ({written.state}, {written.rows_done} of {written.rows_total} rows):"
        f" {written.output}",
        highlight=False,
    )
    for missing in written.missing:
        _console.print(f"  not in it: {missing}", highlight=False)


def _run_lines(
    summary: RunSummary | None, run_id: str, state: str, run_dir: str, continue_command: str | None
) -> None:
    """A run's summary table, its state and where it lives, and how to continue it."""
    if summary:
        _console.print(_summary_table(summary))
    _console.print(f"run {run_id}: [bold]{state}[/]  ({_value(run_dir)})", markup=True, highlight=False)
    if continue_command:
        _console.print(f"continue with: {continue_command}", highlight=False)


def _runs(listed: RunsResult) -> None:
    from bulkrelay.report.words import duration  # loaded only for this table

    columns = ("run_id", "state", "started (UTC)", "ended (UTC)", "took", "done", "total", "failed", "name")
    table = Table(title=f"runs in {listed.runs_dir}")
    for column in columns:
        table.add_column(column, no_wrap=column != "name", min_width=6 if column == "name" else None)
    for run in listed.runs:
        started, ended = _to_the_second(run.created_at), _to_the_second(run.ended_at)
        took = duration(run.duration_seconds)
        cells = (run.run_id, run.state, started, ended, took, run.done, run.total, run.failed, run.name)
        table.add_row(*_cells(*cells))
    _console.print(table)


def _to_the_second(stamp: str | None) -> str:
    """`2026-12-05T02:13:20.123456Z` as `2026-12-05 02:13:20` (UTC, as run.json keeps it)."""
    return "—" if stamp is None else stamp[:19].replace("T", " ")


def _rows(count: int) -> str:
    return f"{count} row" if count == 1 else f"{count} rows"


def _demo(shown: DemoResult) -> None:
    _run(shown.run)
    demo = shown.demo
    _console.print(
        f"The demo target at {demo.target} rejected {_rows(demo.rejected)} on purpose (422) and "
        f"answered 503 once to {_rows(demo.retried)}, which succeeded on retry.",
        highlight=False,
    )
    _console.print(f"job file: {demo.job}\ninput:    {demo.input}", highlight=False)
    _console.print(f"look inside: bulkrelay status {shown.run.run_dir}", highlight=False)


def _failures(found: FailuresResult) -> None:
    table = Table(title=f"{found.failed} failed rows in run {found.run_id}")
    for column in ("count", "status", "classification", "examples (row: error, body)"):
        table.add_column(column, overflow="fold")
    for group in found.groups:
        examples = "\n".join(
            f"{e.row_number}: {e.error}" + (f", {e.body[:120]}" if e.body else "") for e in group.examples
        )
        status = "-" if group.status_code is None else str(group.status_code)
        table.add_row(*_cells(group.count, status, group.classification, examples))
    _console.print(table)


def _prune(pruned: PruneResult) -> None:
    verb = "would remove" if pruned.dry_run else "removed"
    _console.print(f"{verb} {len(pruned.removed)} runs, kept {pruned.kept} in {pruned.runs_dir}")
    for run_id in pruned.removed:
        _console.print(f"  {run_id}", highlight=False)
    if pruned.spools_removed:
        count = len(pruned.spools_removed)
        _console.print(f"{verb} {count} abandoned spool files ({pruned.spool_bytes} bytes)", highlight=False)


def _help(answer: HelpText) -> None:
    _console.print(answer.help, markup=False, highlight=False, soft_wrap=True, end="")


def _job_goes_on(job: BackgroundJobGoesOn) -> None:
    """A background job still at work (exit 14): where it is, and the commands that reach it."""
    done, total = job.progress.get("done", 0), job.progress.get("total")
    where = f"{done:,} of {'?' if total is None else f'{total:,}'} rows done"
    if job.rows_read is not None:  # still in preflight
        where = f"{job.rows_read:,} rows read"
    _console.print(
        f"job {job.job_id}: [bold]{job.state}[/] ({job.stage}), {where}", markup=True, highlight=False
    )
    if job.run_dir:
        _console.print(f"run dir: {job.run_dir}", markup=False, highlight=False)
    _console.print(f"wait with:   {job.continue_command}\ncancel with: {job.cancel_command}", highlight=False)


def _job_ended(job: BackgroundJobEnded) -> None:
    """`job cancel` of a job that has ended: how it ended, and its run."""
    ended = f"job {job.job_id}: [bold]{job.state}[/]"
    if job.run_state is not None:
        ended += f", its run {job.run_state}"
    if job.job_exit_code is not None:
        ended += f" (exit {job.job_exit_code})"
    _console.print(ended, markup=True, highlight=False)
    if job.run_dir:
        _console.print(f"run dir: {job.run_dir}", markup=False, highlight=False)


def _version(answer: VersionInfo) -> None:
    _console.print(f"{answer.name} {answer.version}", highlight=False)


# One view per result type.
_VIEWS: dict[type, Callable[[Any], None]] = {
    HelpText: _help,
    VersionInfo: _version,
    ValidateResult: _validate,
    RenderResult: _render,
    StatusResult: _status,
    RunsResult: _runs,
    FailuresResult: _failures,
    PruneResult: _prune,
    ReportResult: _report,
    HistoryResult: _history,
    RunResult: _run,
    DemoResult: _demo,
    BackgroundJobGoesOn: _job_goes_on,
    BackgroundJobEnded: _job_ended,
}

# The results a background job hands back as its stored envelope's data, by the kind stored with it.
_STORED: dict[str, Callable[[dict[str, Any]], CommandData]] = {RunResult.kind: RunResult.from_data}
