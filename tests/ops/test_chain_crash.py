"""examples/chain/ (accounts -> contacts -> deals) against the demo target's CRM endpoints, each job
killed with SIGKILL at random moments and then invoked again identically: every contact carries its
account's id, every deal both, the target creates no record twice, and the results table holds each
row's final outcome exactly once. (`KILLS` a job here; the issue's 20 kills are this loop run longer.)"""

from __future__ import annotations

import csv
import io
import random
import shutil
import signal
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from bulkrelay.store.journal import read_journal
from tests.clirun import cli_env, run_cli, start_cli
from tests.targetproc import TargetProcess
from tests.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.target_plan({"dedup": True})]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "chain"
KILLS = 2
ROWS = {"accounts": 20, "contacts": 60, "deals": 60}


def _committed(runs: Path) -> int:
    return sum(1 for run in runs.glob("*/results.jsonl") for _ in read_journal(run))


def _kill_midway(tmp_path: Path, job: str, env: dict[str, str], rng: random.Random) -> None:
    """Start the job's identical invocation and SIGKILL it once a random number of rows committed."""
    runs = tmp_path / ".bulkrelay" / "runs"
    before = _committed(runs) if runs.exists() else 0
    at = before + rng.randint(1, ROWS[job] // 4)
    proc = start_cli("run", f"{job}.yaml", "--budget", "0", cwd=tmp_path, env=env, output="discarded")
    try:
        wait_for(lambda: proc.poll() is not None or _committed(runs) >= at, what=f"{job}: {at} rows")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"{job} ended before the kill"  # killed mid-run


def _bodies(target: TargetProcess, kind: str) -> list[dict[str, Any]]:
    return [orjson.loads(r["body"]) for r in target.requests() if r["path"].endswith(f"/crm/{kind}")]


def _captured(db: Path, job: str) -> dict[str, str]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT key, captured FROM bulkrelay_results WHERE job = ?", (job,)).fetchall()
    conn.close()
    return {key: orjson.loads(captured)["id"] for key, captured in rows}


def test_the_chain_survives_kills_and_creates_nothing_twice(tmp_path: Path, target: TargetProcess) -> None:
    for source in EXAMPLE.iterdir():
        shutil.copy(source, tmp_path / source.name)
    for job in ROWS:  # slowed down, so that a kill lands while rows are in flight
        path = tmp_path / f"{job}.yaml"
        path.write_text(_slowed(path.read_text()))
    env = cli_env(TARGET_URL=target.url)
    rng = random.Random()
    for job in ("accounts", "contacts", "deals"):
        for _ in range(KILLS):
            _kill_midway(tmp_path, job, env, rng)
        done = run_cli("run", f"{job}.yaml", "--budget", "0", cwd=tmp_path, env=env)
        assert done.exit_code == 0, done.envelope
    crm = target.stats()["crm"]
    assert crm["created"] == ROWS and crm["created_twice"] == [] and crm["refused"] == 0
    db = tmp_path / "results.db"
    with sqlite3.connect(db) as conn:
        held = dict(conn.execute("SELECT job, count(*) FROM bulkrelay_results WHERE success GROUP BY job"))
        total = conn.execute("SELECT count(*) FROM bulkrelay_results").fetchone()[0]
    conn.close()
    assert held == ROWS and total == sum(ROWS.values())  # each row's final outcome, once
    accounts, contacts = _captured(db, "accounts"), _captured(db, "contacts")
    account_of = {row["contact_ext_id"]: row["account_ext_id"] for row in _csv(tmp_path / "contacts.csv")}
    for body in _bodies(target, "contacts"):
        assert body["accountId"] == accounts[account_of[body["externalId"]]]
    for body in _bodies(target, "deals"):
        assert body["contactId"] == contacts[body["externalId"]]
        assert body["accountId"] == accounts[account_of[body["externalId"]]]


def _slowed(text: str) -> str:
    return text.replace(
        "execution: { concurrency: 4 }",
        "execution: { concurrency: 4, rate_limit: { requests_per_second: 40 } }",
    )


def _csv(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text())))
