"""What a command that takes a run means by its argument: a run directory, a run id, or `latest`.

One resolver for every such command (status, resume, retry-failed, export, failures, prune's
neighbours), so `latest` and run ids mean the same thing everywhere:

- `latest`: the newest run (by its manifest's `created_at`) in the runs directory
  (`--runs-dir`, else `BULKRELAY_RUNS_DIR`, else `./.bulkrelay/runs`);
- an existing directory: that run directory;
- otherwise a run id: `<runs dir>/<id>`.
"""

from __future__ import annotations

from pathlib import Path

from bulkrelay.errors import BulkRelayError, NotFound
from bulkrelay.store.atomic import read_json
from bulkrelay.store.rundir import MANIFEST, default_runs_dir, run_dirs

LATEST = "latest"


def resolve_run(ref: Path | str, runs_dir: Path | None) -> Path:
    """The run directory `ref` names; `NotFound` saying where it looked when there is none."""
    text = str(ref)
    if text == LATEST:
        return latest_run(default_runs_dir(runs_dir))
    path = Path(text)
    if path.is_dir():
        return path
    if "/" not in text and text not in (".", ".."):
        candidate = default_runs_dir(runs_dir) / text
        if candidate.is_dir():
            return candidate
    raise NotFound(
        f"no run directory or run id {text!r} (looked at {path} and in {default_runs_dir(runs_dir)})",
        context={"run": text, "runs_dir": str(default_runs_dir(runs_dir))},
        suggestion="`bulkrelay runs` lists the runs; `latest` names the newest",
    )


def latest_run(runs_dir: Path) -> Path:
    """The newest run under `runs_dir`: run ids share a second, so `created_at` decides."""
    newest: tuple[tuple[str, str], Path] | None = None
    for path in run_dirs(runs_dir):
        try:
            created = str(read_json(path / MANIFEST).get("created_at") or "")
        except (BulkRelayError, AttributeError):
            continue  # an unreadable run is not the newest one; `runs` reports it
        if newest is None or (created, path.name) > newest[0]:
            newest = ((created, path.name), path)
    if newest is None:
        raise NotFound(
            f"no runs in {runs_dir}, so there is no `latest`",
            context={"runs_dir": str(runs_dir)},
            suggestion="give --runs-dir (or BULKRELAY_RUNS_DIR) where your runs are",
        )
    return newest[1]
