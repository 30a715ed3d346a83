"""`input.results_of` through the real CLI: a chained job's records are its parent's keys, captured
values and input fields, frozen in a snapshot that the identical re-run of a stopped run reads again
(never the parent's newer results); a parent that never ran is exit 5, one still running exit 6."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from bulkrelay.errors import ExitCode
from tests.clirun import start_cli
from tests.damagedjournals import assert_refused_as_corrupt, damage_second_line
from tests.jobfiles import write_job
from tests.runsteps import run_job, stop_midway
from tests.spawnedruns import wait_for_lock
from tests.targetproc import TargetProcess
from tests.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.shared_target]  # real processes

ROWS = 40
_FAIL_ROW_7 = {"rules": [{"match": {"path_contains": "/items/7"}, "status": 422}]}


def _parent(tmp_path: Path, target: TargetProcess, **extra: Any) -> Path:
    return write_job(
        tmp_path,
        target.url,
        ROWS,
        job_name="accounts.yaml",
        name="accounts",
        input={"file": "data.csv", "key": "id"},
        response={"capture": {"id": "/id"}},
        **extra,
    )


def _child(tmp_path: Path, target: TargetProcess, where: str | None = None, **extra: Any) -> Path:
    job = {
        "version": 1,
        "name": "contacts",
        "input": {"results_of": "accounts", "key": "key", **({"where": where} if where else {})},
        "request": {
            "method": "POST",
            "url": f"{target.url}/contacts/{{key}}",
            "json": {"accountId": {"from": "/captured/id"}, "email": {"from": "email"}},
        },
        "execution": {"concurrency": 4},
        **extra,
    }
    path = tmp_path / "contacts.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def _bodies(target: TargetProcess, prefix: str) -> dict[str, Any]:
    return {
        r["path"].rsplit("/", 1)[-1]: orjson.loads(r["body"])
        for r in target.requests()
        if r["path"].startswith(prefix)
    }


def test_a_chained_job_sends_its_parents_keys_captured_values_and_fields(
    tmp_path: Path, target: TargetProcess
) -> None:
    target.set_plan(_FAIL_ROW_7)
    assert run_job(tmp_path, _parent(tmp_path, target)).exit_code == ExitCode.PARTIAL_FAILURE
    target.reset()
    child = run_job(tmp_path, _child(tmp_path, target))
    assert child.exit_code == 0, child.envelope
    sent = _bodies(target, "/contacts/")
    succeeded = [n for n in range(1, ROWS + 1) if n != 7]
    assert sorted(sent, key=int) == [str(n) for n in succeeded]  # where: success (the default)
    assert {key: body["email"] for key, body in sent.items()} == {
        str(n): f"user{n}@example.com"
        for n in succeeded  # the parent's input fields
    }
    assert len({body["accountId"] for body in sent.values()}) == len(succeeded)  # each its own id
    target.reset()
    failed_only = _child(tmp_path, target, where="failed", name="contacts-of-failed")
    rewrite = yaml.safe_load(failed_only.read_text())
    rewrite["request"]["json"] = {"email": {"from": "email"}}  # a failed row captured nothing
    failed_only.write_text(yaml.safe_dump(rewrite, sort_keys=False))
    assert run_job(tmp_path, failed_only).exit_code == 0
    assert list(_bodies(target, "/contacts/")) == ["7"]


def test_the_identical_rerun_of_a_stopped_chained_run_reads_its_frozen_snapshot(
    tmp_path: Path, target: TargetProcess
) -> None:
    target.set_plan({"rules": [{"match": {"path_contains": "/contacts/"}, "delay_ms": 60}]})
    parent = _parent(tmp_path, target)
    assert run_job(tmp_path, parent).exit_code == 0
    child = _child(tmp_path, target)
    first = stop_midway(tmp_path, child)
    frozen = Path(first.data["run_dir"]) / "input.jsonl"
    before = frozen.read_bytes()
    assert run_job(tmp_path, parent).exit_code == 0  # the parent's results change: new ids
    target.reset()
    again = run_job(tmp_path, child)
    assert again.exit_code == 0 and again.data["run_id"] == first.data["run_id"]
    assert frozen.read_bytes() == before
    frozen_ids = {r["key"]: r["captured"]["id"] for r in map(orjson.loads, before.splitlines())}
    for key, body in _bodies(target, "/contacts/").items():
        assert body["accountId"] == frozen_ids[key]  # the frozen values, not the parent's newer ones
    target.reset()
    fresh = run_job(tmp_path, child)  # after a completed run: built afresh from the parent's newest
    assert fresh.data["run_id"] != first.data["run_id"]
    assert {body["accountId"] for body in _bodies(target, "/contacts/").values()}.isdisjoint(
        frozen_ids.values()
    )


def test_a_parent_that_never_ran_is_not_found_and_one_running_is_a_conflict(
    tmp_path: Path, target: TargetProcess
) -> None:
    # The parent's answers are held until it is killed: it is running for as long as the test needs,
    # however slowly a loaded machine starts the child (a 200 ms delay let it end first, once).
    target.set_plan({"rules": [{"delay_ms": 600_000}]})
    child = _child(tmp_path, target)
    never = run_job(tmp_path, child)
    assert never.exit_code == ExitCode.NOT_FOUND and "accounts" in never.envelope["error"]["message"]
    held = {"concurrency": 4, "timeout": {"read_seconds": 900}}
    proc = start_cli("run", _parent(tmp_path, target, execution=held), "--budget", "0", cwd=tmp_path)
    try:
        runs = tmp_path / ".bulkrelay" / "runs"
        run_dir = _first_run_dir(runs)
        wait_for_lock(run_dir, proc)
        running = run_job(tmp_path, child)
        assert running.exit_code == ExitCode.CONFLICT, running.envelope
        assert running.envelope["error"]["context"]["job"] == "accounts"
    finally:
        proc.kill()
        proc.communicate()


def _first_run_dir(runs: Path) -> Path:
    return wait_for(
        lambda: next((p for p in runs.glob("*") if (p / "run.json").is_file()), None), what="a run"
    )


def test_a_parents_corrupt_journal_refuses_the_chained_job_before_any_request(
    tmp_path: Path, target: TargetProcess
) -> None:
    target.set_plan({})  # the module shares its target: no delay or failure of an earlier test
    parent = run_job(tmp_path, _parent(tmp_path, target))
    assert parent.exit_code == 0
    journal, offset = damage_second_line(parent.data["run_dir"])
    target.reset()
    refused = run_job(tmp_path, _child(tmp_path, target, where="all"))
    assert_refused_as_corrupt(refused, parent.data["run_dir"], journal, offset)
    assert _bodies(target, "/contacts/") == {}
    assert "Traceback" not in refused.stderr


def test_a_completed_parents_torn_tail_is_damage_to_a_chained_job(
    tmp_path: Path, target: TargetProcess
) -> None:
    target.set_plan({})  # the module shares its target: no delay or failure of an earlier test
    parent = run_job(tmp_path, _parent(tmp_path, target))
    journal = Path(parent.data["run_dir"]) / "results.jsonl"
    whole = journal.stat().st_size
    with journal.open("ab") as out:
        out.write(b'{"seq":41,"row_number":1,"key":"1","succ')  # a half line past the last group
    target.reset()
    refused = run_job(tmp_path, _child(tmp_path, target))
    assert refused.error_code == "JOURNAL_CORRUPT", refused.envelope
    assert refused.envelope["error"]["context"]["offset"] == whole
    assert _bodies(target, "/contacts/") == {}
