"""The commands that watch what exists already, runs and background jobs: `status`, `runs` and
`job wait|status|cancel`. Loaded without the job file's schema, YAML, the relay or the event loop, so
that an agent or a shell prompt polling them pays about a third of the start-up of a command that
relays (tests/cli/test_startup_imports.py keeps it so)."""

from __future__ import annotations

from bulkrelay.background import reach
from bulkrelay.background.call import JobArgs, RunsArgs, StatusArgs
from bulkrelay.envelope import Result
from bulkrelay.ops import status
from bulkrelay.store.runs import default_runs_dir, resolve_run

Watching = StatusArgs | RunsArgs | JobArgs


def watch(command: str, options: Watching) -> Result:
    match options:
        case StatusArgs():
            return status.status(resolve_run(options.run_dir, options.runs_dir))
        case RunsArgs():
            return status.runs(default_runs_dir(options.runs_dir))
    if command == "job wait":
        return reach.background_wait(options.job_id, options.budget)
    if command == "job cancel":
        return reach.background_cancel(options.job_id, options.budget)
    return reach.background_status(options.job_id)
