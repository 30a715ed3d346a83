"""Where runs are: the one place that finds run directories, lists them, and says what a command's
`RUN` argument names.

Every command that lists or locates runs goes through here (`runs`, `status`, `resume`,
`retry-failed`, `export`, `failures`, `prune`, `shards`, a delta job's earlier runs, the identical
invocation's run), so a runs directory, `latest` and a run id mean the same thing everywhere:

- the runs directory: `--runs-dir`, else `BULKRELAY_RUNS_DIR`, else `./.bulkrelay/runs`;
- a run: a directory in it holding a `run.json`; hidden ones (`.new-*`: being created) are not runs;
- a listing: newest first by the manifest's `created_at` (ids made in one second sort at random), each
  run once: a symbolic link to a run directory listed beside it is the same run, not a second one;
- `latest`: the newest run, the job's main run: a `sync: mirror` night's deletion run is left out
  (it is the night's second half, not a night of its own);
- an existing directory: that run directory (`./latest` is a path); otherwise a run id: `<runs dir>/<id>`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bulkrelay.errors import BulkRelayError, JournalCorrupt, NotFound, RunsDirUnreadable
from bulkrelay.store.rundir import AlphaRun, RunDir, holds_manifest, is_run_id, open_listed

LATEST = "latest"
_STAMP = len("20261201T023000Z")  # a run id's time of making, to the second


def default_runs_dir(explicit: Path | None) -> Path:
    """`explicit` (`--runs-dir`), else `BULKRELAY_RUNS_DIR`, else `./.bulkrelay/runs`; absolute."""
    if explicit is not None:
        return explicit.resolve()
    env = os.environ.get("BULKRELAY_RUNS_DIR")
    return (Path(env) if env else Path(".bulkrelay") / "runs").resolve()


def is_run_dir(path: Path) -> bool:
    return holds_manifest(path)


def runs_dir_unreadable(path: Path, exc: OSError) -> RunsDirUnreadable:
    """`path` (the runs dir, or something in it every run needs) cannot be read by this user."""
    reason = exc.strerror or str(exc)
    return RunsDirUnreadable(
        f"cannot read {path}: {reason}",
        context={"path": str(path), "reason": reason},
        suggestion="run as the user who owns the runs, or give another --runs-dir (or BULKRELAY_RUNS_DIR)",
    )


def run_paths(runs_dir: Path) -> list[Path]:
    """Every run directory under `runs_dir`, newest id first, each once; nothing is read yet.

    A symbolic link to a directory listed here too is that run again: the directory itself is kept."""
    try:
        if not runs_dir.is_dir():
            return []
        children = sorted(runs_dir.iterdir(), reverse=True)
    except PermissionError as exc:
        raise runs_dir_unreadable(runs_dir, exc) from None
    found = [
        child
        for child in children
        if not child.name.startswith(".") and is_run_dir(child)  # hidden: being created
    ]
    real = {os.path.realpath(child) for child in found if not child.is_symlink()}
    seen: set[str] = set()
    unique = []
    for child in found:
        where = os.path.realpath(child)
        if where in seen or (child.is_symlink() and where in real):
            continue
        seen.add(where)
        unique.append(child)
    return unique


def _created(run: RunDir | AlphaRun) -> tuple[datetime, str]:
    """A run's place in time: its manifest's `created_at` (microseconds), then its id; a run whose
    stamp does not parse counts as the oldest."""
    try:
        stamp = datetime.fromisoformat(run.manifest.created_at or "")
    except ValueError:
        return datetime.min, run.path.name
    if stamp.tzinfo is not None:  # ours end in Z, the alpha's in +00:00: compare them in UTC
        stamp = stamp.astimezone(UTC).replace(tzinfo=None)
    return stamp, run.path.name


def runs_in(runs_dir: Path) -> list[RunDir]:
    """Every run of this version under `runs_dir`, newest id first; the public alpha's are left out.
    A damaged run raises (JOURNAL_CORRUPT naming it): what reads runs to act on them must not guess."""
    listed = (open_listed(path) for path in run_paths(runs_dir))
    return [run for run in listed if isinstance(run, RunDir)]


@dataclass(frozen=True)
class Unreadable:
    """A run directory whose files cannot be read, and why."""

    path: Path
    reason: str


def survey(runs_dir: Path) -> tuple[list[RunDir | AlphaRun], list[Unreadable]]:
    """Every run under `runs_dir` (the alpha's included), newest first by `created_at`, and apart from
    them the directories that cannot be read: a listing shows what it can and names the rest."""
    runs: list[RunDir | AlphaRun] = []
    unreadable: list[Unreadable] = []
    for path in run_paths(runs_dir):
        try:
            runs.append(open_listed(path))
        except BulkRelayError as exc:
            unreadable.append(Unreadable(path, exc.message))
    runs.sort(key=_created, reverse=True)
    return runs, unreadable


def run_by_id(runs_dir: Path, run_id: str) -> RunDir | None:
    """The run `run_id` in `runs_dir`, or None when it is gone."""
    try:
        return RunDir.open(runs_dir / run_id)
    except NotFound:
        return None


def resolve_run(ref: str, runs_dir: Path | None) -> Path:
    """The run directory `ref` names; `NotFound` saying where it looked when there is none.

    `ref` is the argument as typed: a `Path` would make `./latest` into `latest`."""
    text = ref
    if text == LATEST:
        return latest_run(default_runs_dir(runs_dir))
    path = Path(text)
    if _is_dir(path):
        return path
    if "/" not in text and text not in (".", ".."):
        candidate = default_runs_dir(runs_dir) / text
        if _is_dir(candidate):
            return candidate
    raise NotFound(
        f"no run directory or run id {text!r} (looked at {path} and in {default_runs_dir(runs_dir)})",
        context={"run": text, "runs_dir": str(default_runs_dir(runs_dir))},
        suggestion="`bulkrelay runs` lists the runs; `latest` names the newest",
    )


def _is_dir(path: Path) -> bool:
    """Whether `path` is a directory; a path under one this user may not enter cannot be read."""
    try:
        return path.is_dir()
    except PermissionError as exc:
        raise JournalCorrupt(
            f"cannot read {path}: {exc.strerror}", context={"path": str(path), "reason": exc.strerror}
        ) from None


def latest_run(runs_dir: Path) -> Path:
    """The newest main run under `runs_dir` (`survey`'s order: run ids share a second, `created_at`
    decides); a mirror night's deletion run is not `latest`, its night is. When a run that cannot be
    read may be newer (its id, all there is to read, is of the same second or later), `latest` is
    unknown: JOURNAL_CORRUPT names that run, rather than `resume latest` continuing an older one."""
    runs, unreadable = survey(runs_dir)
    main = [run for run in runs if not (isinstance(run, RunDir) and run.plan.mirror_deletes)]
    newest = main[0].path.name[:_STAMP] if main else ""
    maybe_newer = [bad for bad in unreadable if is_run_id(bad.path.name) and bad.path.name[:_STAMP] >= newest]
    if maybe_newer:
        bad = max(maybe_newer, key=lambda found: found.path.name)
        raise JournalCorrupt(
            f"the newest run, {bad.path}, cannot be read ({bad.reason}), so `latest` is unknown",
            context={"run_dir": str(bad.path), "reason": bad.reason},
            suggestion="name the run to use by its id or directory (`bulkrelay runs` lists the runs)",
        )
    if not main:
        raise NotFound(
            f"no runs in {runs_dir}, so there is no `latest`",
            context={"runs_dir": str(runs_dir)},
            suggestion="give --runs-dir (or BULKRELAY_RUNS_DIR) where your runs are",
        )
    return main[0].path
