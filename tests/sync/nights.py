"""The nights of a delta or mirror sync through the real CLI, shared by tests/sync's real-process tests.

job = write_job(tmp_path, target.url, rows=ROWS, **DELTA)  # tests/jobfiles.py
run_night(tmp_path, job)  # `bulkrelay run job.yaml --budget 0` in tmp_path, which must succeed
job = write_job(tmp_path, target.url, rows=ROWS, **mirror_job(target, "1%"))

Against a key-value target that keeps idempotency keys (`TargetProcess(KEEPS_KEYS)`), a scenario ends
with the target holding exactly its input, and the sync state agreeing with the journals:

assert target.store() == holding(rows)
verified(tmp_path, job)  # `bulkrelay sync-state verify job.yaml` exits 0
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bulkrelay.errors import ExitCode
from tests.clirun import CliResult, run_cli
from tests.targetproc import TargetProcess

# A key-value store that keeps idempotency keys (bulkrelay/demo/target.py): an applied write sets the
# record at its path, and a request under a key it answered before gets the stored answer again and
# changes nothing, as Stripe-style APIs do.
KEEPS_KEYS: dict[str, Any] = {"dedup": True, "store": True}

DELTA: dict[str, Any] = {
    "input": {"key": "id"},
    "request": {"idempotency_key": {"header": "Idempotency-Key"}},
    "execution": {"concurrency": 4, "sync": "delta"},
}


def run_night(cwd: Path, job: Path, *extra: str, env: dict[str, str] | None = None) -> CliResult:
    """One night's run in `cwd`; it must succeed."""
    result = run_cli("run", job, "--budget", "0", *extra, cwd=cwd, env=env)
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    return result


def mirror_job(target: TargetProcess, max_deletes: int | str) -> dict[str, Any]:
    """The job sections of a mirror sync deleting `<target>/items/{id}`, at most `max_deletes`."""
    return {
        **DELTA,
        "execution": {"concurrency": 4, "sync": "mirror"},
        "mirror": {"url": f"{target.url}/items/{{id}}", "max_deletes": max_deletes},
    }


def holding(rows: list[dict[str, str]]) -> dict[str, Any]:
    """What the target holds once it is in step with `rows` (tests/jobfiles.py's job: `/items/{id}`)."""
    return {f"/items/{row['id']}": {"email": row["email"], "name": row["name"]} for row in rows}


def verified(cwd: Path, job: Path) -> None:
    """`sync-state verify` agrees: the job's sync state is what its journals say."""
    result = run_cli("sync-state", "verify", job, cwd=cwd)
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
