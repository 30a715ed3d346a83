"""The commands that only read runs, `status` and `runs`: loaded without the job file's schema, the relay
or the background runtime, so that an agent or a shell prompt polling them pays about a third of the
start-up of a command that relays (tests/cli/test_startup_imports.py keeps it so)."""

from __future__ import annotations

from bulkrelay.background.call import RunsArgs, StatusArgs
from bulkrelay.envelope import Result
from bulkrelay.ops import status
from bulkrelay.store.runs import default_runs_dir, resolve_run

Query = StatusArgs | RunsArgs


def run_query(options: Query) -> Result:
    if isinstance(options, StatusArgs):
        return status.status(resolve_run(options.run_dir, options.runs_dir))
    return status.runs(default_runs_dir(options.runs_dir))
