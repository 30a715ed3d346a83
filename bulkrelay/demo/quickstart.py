"""`bulkrelay demo`: the main job end to end, against an embedded target on a loopback port.

It writes an example job and input under `.bulkrelay/demo/`, starts the target (in a thread
of this process) with a plan that rejects a few rows (422) and makes a few retry (503 once),
runs the job with the ordinary run machinery, and returns the run's result.
"""

from __future__ import annotations

import asyncio
import csv
import os
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from bulkrelay.demo.target import start_target
from bulkrelay.envelope import Result
from bulkrelay.errors import ExitCode
from bulkrelay.job.config import load_job
from bulkrelay.ops.launch import RunRequest
from bulkrelay.ops.launch import run as launch_run
from bulkrelay.ops.lifecycle import RunObserver, RunOptions
from bulkrelay.ops.results import DemoFacts, DemoResult, RunResult
from bulkrelay.private import make_private_dir
from bulkrelay.store.rundir import RunState
from bulkrelay.store.runs import default_runs_dir

TOKEN_VARIABLE = "BULKRELAY_DEMO_TOKEN"
REJECT_EVERY = 500  # rows whose email the target rejects with 422
FLAKY_EVERY = 250  # rows the target answers 503 once, so they need a retry

_PLAN = {
    "record": False,
    "rules": [
        {
            "match": {"body_field": "email", "contains": "not-an-email"},
            "status": 422,
            "body": {"error": "email is invalid"},
        },
        {
            "match": {"body_field": "note", "equals": "flaky"},
            "first_attempts": 1,
            "status": 503,
            "retry_after": "0",
        },
    ],
}

_JOB = """\
version: 1
name: demo-customers
input:
  file: customers.csv
  key: customer_id
request:
  method: POST
  url: "{url}/v1/customers/{{customer_id}}"
  headers:
    Authorization: "Bearer ${{{token}}}"
  json:
    email: {{ from: email }}
    name: {{ from: name }}
    age: {{ from: age, type: integer }}
    note: {{ from: note }}
    source: {{ value: bulkrelay-demo }}
  idempotency_key: {{ header: Idempotency-Key }}
response:
  capture: {{ remote_id: /id }}
execution:
  concurrency: 32
  rate_limit: {{ requests_per_second: 2000 }}
retry:
  max_attempts: 3
  initial_backoff_seconds: 0.1
"""


def write_example(folder: Path, url: str, rows: int) -> Path:
    """The demo's job file and CSV input; returns the job file's path."""
    make_private_dir(folder)  # .bulkrelay/ too, when the demo is the first to make it
    with (folder / "customers.csv").open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["customer_id", "email", "name", "age", "note"])
        for n in range(1, rows + 1):
            email = "not-an-email" if n % REJECT_EVERY == 3 else f"customer{n}@example.org"
            note = "flaky" if n % FLAKY_EVERY == 7 else ""
            writer.writerow([f"C{n:06d}", email, f"Customer {n}", 20 + n % 60, note])
    job = folder / "job.yaml"
    job.write_text(_JOB.format(url=url, token=TOKEN_VARIABLE))
    return job


class _TargetThread:
    """The embedded target, served by its own event loop in a daemon thread."""

    def __init__(self, plan: dict[str, Any]) -> None:
        self._plan = plan
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self.url = ""

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        target = await start_target(self._plan)
        self.url = target.url
        self._ready.set()
        await self._stopped.wait()
        await target.stop()

    def __enter__(self) -> _TargetThread:
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the demo target did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(5)


def run_demo(rows: int, runs_dir: Path | None, observers: tuple[RunObserver, ...] = ()) -> Result:
    """The quickstart's run; `observers` (the run log) hear it as they hear any run, so its run
    directory is like any other's and `bulkrelay report latest` has its time series."""
    folder = Path(".bulkrelay") / "demo"
    os.environ.setdefault(TOKEN_VARIABLE, "demo-secret-token")  # shows how a secret is kept out of files
    with _TargetThread(_PLAN) as target:
        job = load_job(write_example(folder, target.url, rows))
        request = RunRequest(
            job=job,
            input_path=None,
            from_stdin=False,
            runs_dir=default_runs_dir(runs_dir),
            idempotency_key=None,
            options=RunOptions(observers=observers),
        )
        result = launch_run(request)
    if not isinstance(result.data, RunResult):
        return result
    facts = DemoFacts(
        job=str(job.path),
        input=str(folder.resolve() / "customers.csv"),
        target=target.url,
        rejected=len(range(3, rows + 1, REJECT_EVERY)),
        retried=len(range(7, rows + 1, FLAKY_EVERY)),
    )
    shown = replace(result, data=DemoResult(result.data, facts))
    finished = result.data.state in (RunState.COMPLETED, RunState.COMPLETED_WITH_FAILURES)
    if finished and result.data.progress.failed == facts.rejected:
        shown.exit_code = ExitCode.SUCCESS  # the rejected rows are part of the show; any other is not
        shown.error = None
    return shown
