"""A job of tagged records, run through the real CLI with its runs next to the job file, and readers
of what the journal and the target saw.

    job = write_job(tmp_path, target.url, rows=30, tags={3: "bad"})
    result = run_job(job)  # `bulkrelay run job.yaml --budget 0 --runs-dir <job's folder>/runs`
    assert target_ids(target) == ... and journal(result.data["run_dir"]) == ...

The job POSTs each row's `id`, `email` and `tag` as JSON to `<target_url>/v1/items`; a row's tag is a
word the target's rules match on (`tag_rule("bad", status=422)`). For a job that POSTs to
`/items/{id}` (the target's path names the row), see `tests/jobfiles.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import yaml

from bulkrelay.store.journal import read_journal
from tests.clirun import CliResult, run_cli
from tests.jobfiles import merge
from tests.targetproc import TargetProcess


def write_job(
    tmp_path: Path,
    target_url: str,
    rows: int = 20,
    *,
    tags: dict[int, str] | None = None,
    **overrides: Any,
) -> Path:
    """A CSV of `rows` records (id, email, tag) and a job POSTing each to the target.

    `tags` marks rows (by number, from 1) with a word the target's rules can match on
    (`{"match": {"body_field": "tag", "equals": "bad"}}`); `overrides` merge into the job's sections.
    """
    tags = tags or {}
    lines = ["id,email,tag"] + [f"{n},user{n}@example.com,{tags.get(n, 'plain')}" for n in range(1, rows + 1)]
    (tmp_path / "records.csv").write_text("\n".join(lines) + "\n")
    job: dict[str, Any] = {
        "version": 1,
        "name": "test-job",
        "input": {"file": "records.csv", "key": "id"},
        "request": {
            "method": "POST",
            "url": f"{target_url}/v1/items",
            "json": {
                "id": {"from": "id", "type": "integer"},
                "email": {"from": "email"},
                "tag": {"from": "tag"},
            },
        },
        "execution": {"concurrency": 4},
        "retry": {"initial_backoff_seconds": 0.01, "max_backoff_seconds": 0.05, "jitter_ratio": 0},
    }
    job = merge(job, overrides)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def run_job(job: Path, *extra: str | Path, env: dict[str, str] | None = None) -> CliResult:
    """`bulkrelay run JOB --budget 0` (synchronous) with its runs in `runs/` beside the job file."""
    runs = job.parent / "runs"
    return run_cli("run", job, "--budget", "0", "--runs-dir", runs, *extra, cwd=job.parent, env=env)


def journal(run_dir: str | Path) -> list[dict[str, Any]]:
    return [entry.as_dict() for entry in read_journal(Path(run_dir) / "results.jsonl")]


def target_ids(target: TargetProcess) -> list[int]:
    """The `id` of every request the target answered, in arrival order (repeats included)."""
    return [int(orjson.loads(r["body"])["id"]) for r in target.requests() if r["status"] is not None]


def tag_rule(tag: str, **answer: Any) -> dict[str, Any]:
    return {"match": {"body_field": "tag", "equals": tag}, **answer}
