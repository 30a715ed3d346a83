"""A grouped run (`request.group`, job/groups.py) killed with SIGKILL again and again, then run identically,
against a target that dedups by Idempotency-Key and counts what it applied: every group is applied once,
as one request carrying all its rows, and every row is journaled once, with its group's outcome."""

from __future__ import annotations

import csv
import random
from collections import Counter, defaultdict
from pathlib import Path

import orjson
import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.store.journal import read_journal
from tests.clirun import run_cli
from tests.spawnedruns import kill_9_loop
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

GROUPS = 240
KILLS = 5
JOB = """\
version: 1
name: orders-grouped
input: { file: lines.csv, key: line_id }
request:
  method: PUT
  url: "TARGET/orders/{order_id}"
  group: { by: order_id }
  idempotency_key: { header: Idempotency-Key }
  json:
    order: { from: order_id }
    lines: { rows: { sku: { from: sku }, qty: { from: qty, type: integer } } }
execution: { concurrency: 4, rate_limit: { requests_per_second: 60 } }
"""


def _write(tmp_path: Path, url: str) -> tuple[Path, dict[str, int]]:
    """The job and a CSV of GROUPS orders of 1 to 5 lines each; the size of each order."""
    rng = random.Random(42)
    sizes = {f"O{n:04d}": rng.randint(1, 5) for n in range(1, GROUPS + 1)}
    with (tmp_path / "lines.csv").open("w", newline="") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["line_id", "order_id", "sku", "qty"])
        line = 0
        for order, size in sizes.items():
            for n in range(size):
                line += 1
                writer.writerow([line, order, f"SKU{line}", n + 1])
    job = tmp_path / "job.yaml"
    job.write_text(JOB.replace("TARGET", url))
    return job, sizes


def test_kill_9_loop_over_a_grouped_run_applies_each_group_once(tmp_path: Path) -> None:
    with TargetProcess({"dedup": True, "rules": [{"delay_ms": 30}]}) as target:
        job, sizes = _write(tmp_path, target.url)
        rows = sum(sizes.values())
        kill_9_loop(tmp_path, job, KILLS, random.Random(7))
        final = run_cli("run", job, "--budget", "0", cwd=tmp_path, timeout=120)
        requests = target.requests()
    assert final.exit_code == ExitCode.SUCCESS, final.envelope
    entries = list(read_journal(Path(final.data["run_dir"]) / "results.jsonl"))
    assert Counter(e.row_number for e in entries) == Counter(range(1, rows + 1))  # each row once
    assert all(e.success and e.batch is not None for e in entries)
    assert sorted(e.batch["size"] for e in entries if e.batch is not None) == sorted(
        size for size in sizes.values() for _ in range(size)
    )  # each row journaled with its whole group's request
    applied = Counter(r["path"] for r in requests if not r["duplicate"] and r["status"] == 200)
    assert applied == Counter({f"/orders/{order}": 1 for order in sizes})  # every group applied once
    bodies: dict[str, set[str]] = defaultdict(set)
    for request in requests:
        bodies[request["idempotency_key"]].add(request["body"])
    assert all(len(sent) == 1 for sent in bodies.values())  # a group resent after a kill: the same bytes
    for request in requests:
        order = request["path"].rsplit("/", 1)[1]
        assert len(orjson.loads(request["body"])["lines"]) == sizes[order]


def test_retry_failed_sends_a_failed_group_again_whole(tmp_path: Path) -> None:
    plan = {"rules": [{"match": {"path_contains": "/orders/O0003"}, "status": 422}]}
    with TargetProcess(plan) as target:
        job, sizes = _write(tmp_path, target.url)
        first = run_cli("run", job, "--budget", "0", cwd=tmp_path, timeout=120)
        assert first.exit_code == ExitCode.PARTIAL_FAILURE, first.envelope
        target.set_plan({})
        target.reset()
        again = run_cli("retry-failed", first.data["run_dir"], "--budget", "0", cwd=tmp_path, timeout=120)
        requests = target.requests()
    assert again.exit_code == ExitCode.SUCCESS, again.envelope
    assert [r["path"] for r in requests] == ["/orders/O0003"]  # the failed group alone, once
    assert len(orjson.loads(requests[0]["body"])["lines"]) == sizes["O0003"]  # with all its rows


def test_the_shards_of_a_grouped_run_own_whole_groups(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job, sizes = _write(tmp_path, target.url)
        for shard in ("0/2", "1/2"):
            result = run_cli("run", job, "--shard", shard, "--budget", "0", cwd=tmp_path, timeout=120)
            assert result.exit_code == ExitCode.SUCCESS, result.envelope
        requests = target.requests()
    sent = Counter(request["path"] for request in requests)
    assert sent == Counter({f"/orders/{order}": 1 for order in sizes})  # each group once, by one shard
    for request in requests:
        assert len(orjson.loads(request["body"])["lines"]) == sizes[request["path"].rsplit("/", 1)[1]]
