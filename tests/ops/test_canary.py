"""`bulkrelay run JOB --limit N`, a canary (issue 43 item 5): the first N pending rows are sent for real,
the run stops (state stopped, exit 0, LIMIT_REACHED with the command that continues), and the identical
command without `--limit` continues the same run without resending them. A canary whose rows failed
exits 3 and is a `failure` to `notify:`; a clean one is no failure."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from bulkrelay.errors import ExitCode
from tests.clirun import cli_env
from tests.jobfiles import write_job
from tests.runsteps import assert_each_row_once, run_job, sent_ids
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # real processes

ROWS = 40


def _job(tmp_path: Path, target: TargetProcess) -> Path:
    notify = [{"on": ["failure"], "webhook": "${HOOK_URL}", "format": "json"}]
    return write_job(tmp_path, target.url, rows=ROWS, notify=notify)


def _hooks(target: TargetProcess) -> list[dict[str, object]]:
    return [orjson.loads(str(r["body"])) for r in target.requests() if str(r["path"]).startswith("/hooks")]


def test_a_canary_of_ten_rows_then_the_identical_run_sends_each_row_once(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job = _job(tmp_path, target)
        env = cli_env(HOOK_URL=f"{target.url}/hooks/json")

        canary = run_job(tmp_path, job, "--limit", "10", env=env)

        assert canary.exit_code == ExitCode.SUCCESS, canary.envelope
        assert canary.data["state"] == "stopped" and canary.envelope["error"] is None
        assert canary.data["progress"]["done"] == 10
        assert sorted(map(int, sent_ids(target))) == list(range(1, 11))
        (warning,) = canary.envelope["warnings"]
        assert warning["code"] == "LIMIT_REACHED" and warning["context"]["limit"] == 10
        assert warning["context"]["continue_command"] == canary.data["continue_command"]
        assert str(Path(canary.data["run_dir"]).resolve()) in warning["context"]["continue_command"]
        assert _hooks(target) == []  # a clean canary is no failure

        rest = run_job(tmp_path, job, env=env)

        assert rest.exit_code == ExitCode.SUCCESS, rest.envelope
        assert rest.data["run_id"] == canary.data["run_id"]
        assert rest.data["summary"]["this_call"]["rows_committed"] == ROWS - 10
        assert_each_row_once(rest.data["run_dir"], ROWS)
        assert len(sent_ids(target)) == ROWS and set(sent_ids(target).values()) == {1}


def test_a_canary_whose_rows_failed_exits_3_and_notifies_a_failure(tmp_path: Path) -> None:
    plan = {"rules": [{"match": {"body_contains": "3@example"}, "status": 422}]}
    with TargetProcess(plan) as target:
        job = _job(tmp_path, target)

        canary = run_job(tmp_path, job, "--limit", "5", env=cli_env(HOOK_URL=f"{target.url}/hooks/json"))

        assert canary.exit_code == ExitCode.PARTIAL_FAILURE, canary.envelope
        assert canary.error_code == "PARTIAL_FAILURE" and canary.data["state"] == "stopped"
        assert [w["code"] for w in canary.envelope["warnings"]] == ["LIMIT_REACHED"]
        (hook,) = _hooks(target)
    assert hook["state"] == "stopped" and hook["failed"] == 1 and hook["rows_done"] == 5
    assert "--limit" in str(hook["headline"])
