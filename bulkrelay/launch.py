"""How `run` and `resume` find their run: a fresh one, the identical invocation's unfinished one,
or the run directory named on the command line."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from bulkrelay import progress
from bulkrelay.config import Job
from bulkrelay.delta import open_delta, sync_manifest
from bulkrelay.engine import StartPoint
from bulkrelay.envelope import EnvelopeWarning, Result
from bulkrelay.errors import ConfigChanged, ExitCode, InputChanged, NotFound
from bulkrelay.fingerprint import file_sha256
from bulkrelay.invocation import invocation_key, last_run_id, normalized_path, remember
from bulkrelay.lifecycle import RunOptions, continue_run, start_fresh
from bulkrelay.mirror import check_and_spool, deletion_job, discard, merge_results
from bulkrelay.preflight import Preflight, run_preflight
from bulkrelay.progress import Reporter
from bulkrelay.resume import check_resumable, preflight_for_resume, verify_unchanged
from bulkrelay.rowset import RowSet
from bulkrelay.rundir import FINAL_STATES, RunDir
from bulkrelay.selection import save_selection


@dataclass(frozen=True)
class RunRequest:
    """A `bulkrelay run` invocation, normalized."""

    job: Job
    input_path: Path | None  # a spooled copy when the records came from stdin
    from_stdin: bool
    runs_dir: Path
    idempotency_key: str | None
    options: RunOptions
    full: bool = False  # `--full`: a delta job sends every row once and refreshes its sync state

    def key(self) -> str:
        """The invocation's identity; computable before preflight, so a job can be attached to at once."""
        arguments = {
            "job": normalized_path(self.job.path),
            "input": "-" if self.from_stdin else normalized_path(self.input_path),
            "runs_dir": normalized_path(self.runs_dir),
        }
        if self.full:  # only when given, so the keys of earlier invocations stay what they were
            arguments["full"] = "true"
        stdin_sha256 = None
        if self.from_stdin and self.input_path is not None:
            stdin_sha256 = file_sha256(self.input_path)
        return invocation_key(
            "run", arguments, stdin_sha256=stdin_sha256, idempotency_key=self.idempotency_key
        )


def run(request: RunRequest, reporter: Reporter | None = None) -> Result:
    """Preflight, then continue the identical invocation's unfinished run or start a new one;
    then, for a `sync: mirror` job, send the deletions."""
    preflight, selection, deletions = _preflight(request)
    try:
        result = _night(request, preflight, selection, reporter or progress.for_stderr())
        if deletions is not None:
            result = _send_deletions(request, result, deletions)
    finally:
        discard(deletions[0] if deletions is not None else None)
    return result


def _night(request: RunRequest, preflight: Preflight, selection: RowSet | None, reporter: Reporter) -> Result:
    key = request.key()
    warnings: list[EnvelopeWarning] = []
    previous = _unfinished_run(request.runs_dir, key)
    if previous is not None:
        try:
            verify_unchanged(previous, preflight)
        except (InputChanged, ConfigChanged) as changed:
            warnings.append(
                EnvelopeWarning(
                    "CHECKPOINT_DISCARDED",
                    f"{changed.message}; started over",
                    {"previous_run": previous.run_id, "reason": changed.code},
                )
            )
        else:
            if request.from_stdin and request.input_path is not None:
                request.input_path.unlink()  # the run keeps its own copy of the same bytes
                preflight = _with_input(preflight, Path(previous.manifest["input"]["path"]))
            return continue_run(previous, preflight, request.options, reporter)
    manifest = {
        "invocation_key": key,
        "input_explicit": request.input_path is not None,
        "idempotency_key": request.idempotency_key,
    }
    start = None
    if preflight.digester is not None:
        manifest["sync"] = sync_manifest(request.job, selection, preflight.record_count)
    if selection is not None:  # a delta run: the unchanged rows count as done from the start
        start = StartPoint(done_rows=selection.complement(), total=len(selection))

    def on_created(run: RunDir) -> None:
        remember(request.runs_dir, key, run.run_id)
        if selection is not None:
            save_selection(run.path, selection, run.storage)

    result = start_fresh(
        preflight,
        request.runs_dir,
        request.options,
        reporter,
        manifest=manifest,
        spooled=request.from_stdin,
        on_created=on_created,
        start=start,
    )
    result.warnings[:0] = warnings
    return result


def _preflight(request: RunRequest) -> tuple[Preflight, RowSet | None, tuple[Path, int] | None]:
    """Preflight; for a delta job also the rows that changed since their last delivery, and for a
    mirror job the keys gone from the input (spooled, and checked against `mirror.max_deletes`)."""
    delta = open_delta(request.job, request.runs_dir, full=request.full)
    if delta is None:
        return run_preflight(request.job, request.input_path), None, None
    try:
        preflight = run_preflight(request.job, request.input_path, delta=delta.selector)
        selection = delta.selection(preflight.record_count)
        deletions = None
        if delta.mirror is not None:
            path, count = check_and_spool(delta.state, request.job, request.runs_dir / ".spool")
            deletions = None if path is None else (path, count)
        return preflight, selection, deletions
    finally:
        delta.close()


def _send_deletions(request: RunRequest, night: Result, deletions: tuple[Path, int]) -> Result:
    """After the night's run has finished (all rows with a final result), a run of the deletions."""
    path, count = deletions
    data = night.data if isinstance(night.data, dict) else {}
    if night.exit_code not in (ExitCode.SUCCESS, ExitCode.PARTIAL_FAILURE):
        data["mirror"] = {"deletions": count, "sent": False, "reason": "the run did not finish"}
        return night
    preflight = run_preflight(deletion_job(request.job), path)
    manifest = {"mirror_deletes": True, "mirror_of": data.get("run_id"), "input_explicit": True}
    deleted = start_fresh(
        preflight, request.runs_dir, request.options, progress.for_stderr(), manifest=manifest, spooled=True
    )
    data["mirror"] = merge_results(data, deleted.data if isinstance(deleted.data, dict) else {})
    if night.exit_code == ExitCode.SUCCESS and deleted.exit_code != ExitCode.SUCCESS:
        night.exit_code, night.error = deleted.exit_code, deleted.error
    night.warnings.extend(deleted.warnings)
    return night


def _with_input(preflight: Preflight, path: Path) -> Preflight:
    return replace(preflight, input_spec=replace(preflight.input_spec, path=path))


def _unfinished_run(runs_dir: Path, key: str) -> RunDir | None:
    run_id = last_run_id(runs_dir, key)
    if run_id is None:
        return None
    try:
        run = RunDir.open(runs_dir / run_id)
    except NotFound:
        return None
    return None if run.state in FINAL_STATES else run


def resume(
    run_dir: Path,
    config: Path | None,
    input_path: Path | None,
    options: RunOptions,
    reporter: Reporter | None = None,
) -> Result:
    run = RunDir.open(run_dir)
    check_resumable(run)
    preflight = preflight_for_resume(run, config, input_path)
    return continue_run(run, preflight, options, reporter or progress.for_stderr())
