"""`lookups:` through the real CLI: a map from another job's results and one from a query, read by
`{lookup: NAME, key: ..., on_miss: ...}` leaves; misses named by preflight (fail), journaled unsent
(skip) or sent as null; the map frozen in the run, which the identical re-run of a stopped run reads
again (never the newer values), and built afresh after a completed run; a key with two values refused."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from bulkrelay.errors import ExitCode
from bulkrelay.store.journal import read_journal
from tests.clirun import cli_env, run_cli
from tests.damagedjournals import assert_refused_as_corrupt, damage_second_line
from tests.jobfiles import write_csv, write_job
from tests.runsteps import resume, run_job, stop_midway
from tests.targetproc import TargetProcess

pytestmark = [pytest.mark.slow, pytest.mark.shared_target]  # real processes

ACCOUNTS = 30


def _accounts(tmp_path: Path, target: TargetProcess) -> Path:
    return write_job(
        tmp_path,
        target.url,
        ACCOUNTS,
        job_name="accounts.yaml",
        input_name="accounts.csv",
        name="accounts",
        input={"file": "accounts.csv", "key": "id"},
        response={"capture": {"id": "/id"}},
    )


def _contacts(
    tmp_path: Path, target: TargetProcess, refs: list[str], on_miss: str = "fail", **extra: Any
) -> Path:
    write_csv(tmp_path / "contacts.csv", [{"id": f"c{n}", "account": ref} for n, ref in enumerate(refs, 1)])
    lookup = {"lookup": "account_ids", "key": {"from": "account"}, "on_miss": on_miss}
    job = {
        "version": 1,
        "name": "contacts",
        "input": {"file": "contacts.csv", "key": "id"},
        "lookups": {"account_ids": {"results_of": "accounts", "value": "/captured/id"}},
        "request": {"method": "POST", "url": f"{target.url}/contacts/{{id}}", "json": {"accountId": lookup}},
        "execution": {"concurrency": 4},
        **extra,
    }
    path = tmp_path / "contacts.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def _sent(target: TargetProcess) -> dict[str, Any]:
    return {
        r["path"].rsplit("/", 1)[-1]: orjson.loads(r["body"])["accountId"]
        for r in target.requests()
        if r["path"].startswith("/contacts/")
    }


def _header(request: dict[str, Any], name: str) -> str | None:
    return next((v for k, v in request["headers"].items() if k.lower() == name), None)


def _captured_ids(tmp_path: Path, run_dir: str) -> dict[str, str]:
    return {str(e.key): e.captured["id"] for e in read_journal(Path(run_dir) / "results.jsonl") if e.captured}


def test_a_lookup_of_another_jobs_results_sends_each_rows_captured_id(
    tmp_path: Path, target: TargetProcess
) -> None:
    target.reset()
    accounts = run_job(tmp_path, _accounts(tmp_path, target))
    ids = _captured_ids(tmp_path, accounts.data["run_dir"])
    target.reset()
    result = run_job(tmp_path, _contacts(tmp_path, target, ["3", "1", "30"]))
    assert result.exit_code == 0, result.envelope
    assert _sent(target) == {"c1": ids["3"], "c2": ids["1"], "c3": ids["30"]}


def test_misses_fail_in_preflight_naming_rows_and_keys_or_are_skipped_or_null(
    tmp_path: Path, target: TargetProcess
) -> None:
    target.reset()
    run_job(tmp_path, _accounts(tmp_path, target))
    target.reset()
    failed = run_job(tmp_path, _contacts(tmp_path, target, ["1", "nope", "2", "gone"]))
    assert failed.exit_code == ExitCode.ARG_ERROR
    problems = failed.envelope["error"]["context"]["problems"]
    assert [(p["row"], "nope" in p["message"] or "gone" in p["message"]) for p in problems] == [
        (2, True),
        (4, True),
    ]
    assert _sent(target) == {}  # nothing sent
    skipped = run_job(tmp_path, _contacts(tmp_path, target, ["1", "nope"], on_miss="skip"))
    assert skipped.exit_code == ExitCode.PARTIAL_FAILURE
    warned = [w for w in skipped.envelope["warnings"] if w["code"] == "LOOKUP_MISSES_SKIPPED"]
    assert [w["context"]["rows"] for w in warned] == [1]  # preflight counted the miss
    assert set(_sent(target)) == {"c1"}  # the miss was not sent
    entries = {e.row_number: e for e in read_journal(Path(skipped.data["run_dir"]) / "results.jsonl")}
    assert entries[2].classification == "lookup_miss" and not entries[2].success and entries[2].attempts == 0
    target.reset()
    nulls = run_job(
        tmp_path, _contacts(tmp_path, target, ["1", "nope"], on_miss="null", name="contacts-null")
    )
    assert nulls.exit_code == 0 and _sent(target)["c2"] is None


def test_a_stopped_runs_identical_rerun_reads_its_frozen_map_and_a_completed_ones_builds_afresh(
    tmp_path: Path, target: TargetProcess
) -> None:
    target.set_plan({"rules": [{"match": {"path_contains": "/contacts/"}, "delay_ms": 60}]})
    accounts = _accounts(tmp_path, target)
    old = _captured_ids(tmp_path, run_job(tmp_path, accounts).data["run_dir"])
    refs = [str(n) for n in range(1, ACCOUNTS + 1)]
    contacts = _contacts(tmp_path, target, refs)
    first = stop_midway(tmp_path, contacts)
    frozen = Path(first.data["run_dir"]) / "lookups" / "account_ids.jsonl"
    assert frozen.stat().st_mode & 0o777 == 0o600
    recorded = {"sha256": hashlib.sha256(frozen.read_bytes()).hexdigest(), "entries": ACCOUNTS}
    status = run_cli("status", first.data["run_dir"], cwd=tmp_path)
    assert status.data["lookups"] == {"account_ids": recorded}  # the run's record names its map
    new = _captured_ids(tmp_path, run_job(tmp_path, accounts).data["run_dir"])  # the source changes
    assert set(old.values()).isdisjoint(new.values())
    kept = frozen.read_bytes()
    frozen.write_bytes(kept.replace(b'"value":"', b'"value":"x', 1))  # not the map the run sent with
    for refused in (run_job(tmp_path, contacts), resume(tmp_path, first.data["run_dir"])):
        assert refused.error_code == "INPUT_CHANGED", refused.envelope
        assert "lookup account_ids" in refused.envelope["error"]["message"]
    frozen.write_bytes(kept)
    target.reset()
    again = run_job(tmp_path, contacts)
    assert again.exit_code == 0 and again.data["run_id"] == first.data["run_id"]
    assert set(_sent(target).values()) <= set(old.values())  # the frozen map: never the new values
    target.reset()
    fresh = run_job(tmp_path, contacts)
    assert fresh.data["run_id"] != first.data["run_id"]
    assert set(_sent(target).values()) == set(new.values())


def test_a_query_lookup_and_a_key_with_two_values(tmp_path: Path, target: TargetProcess) -> None:
    target.reset()
    with sqlite3.connect(tmp_path / "crm.db") as db:
        db.execute("CREATE TABLE owners (email TEXT, id INTEGER)")
        db.executemany("INSERT INTO owners VALUES (?, ?)", [("a@x.io", 11), ("b@x.io", 12)])
    db.close()
    job = _contacts(tmp_path, target, ["a@x.io", "b@x.io"])
    data = yaml.safe_load(job.read_text())
    data["lookups"] = {
        "account_ids": {"query": "SELECT email, id FROM owners", "database": "sqlite:///crm.db"}
    }
    job.write_text(yaml.safe_dump(data, sort_keys=False))
    assert run_job(tmp_path, job).exit_code == 0
    assert _sent(target) == {"c1": 11, "c2": 12}
    with sqlite3.connect(tmp_path / "crm.db") as db:
        db.execute("INSERT INTO owners VALUES ('a@x.io', 99)")
    db.close()
    twice = run_job(tmp_path, job)
    assert twice.exit_code == ExitCode.ARG_ERROR
    message = twice.envelope["error"]["context"]["problems"][0]["message"]
    assert "a@x.io" in message and "11" in message and "99" in message


def _page(path: str, items: list[tuple[str, int]], next_path: str | None) -> dict[str, Any]:
    body = {"data": [{"code": c, "id": i} for c, i in items], "paging": {"next": next_path}}
    return {"match": {"method": "GET", "path_contains": path}, "status": 200, "body": body}


_PAGES = [
    _page("/countries/p3", [("IT", 5)], None),
    _page("/countries/p2", [("DE", 3), ("ES", 4)], "/countries/p3"),
    _page("/countries", [("FR", 1), ("BE", 2)], "/countries/p2"),
]


def _countries_job(tmp_path: Path, target: TargetProcess, **retry: Any) -> Path:
    job = _contacts(tmp_path, target, ["FR", "IT", "ES"])
    data = yaml.safe_load(job.read_text())
    data["lookups"] = {
        "account_ids": {
            "get": f"{target.url}/countries",
            "items": "/data",
            "key": "/code",
            "value": "/id",
            "next": "/paging/next",
            "max_pages": 10,
        }
    }
    data["retry"] = {"max_attempts": 2, "initial_backoff_seconds": 0.01, **retry}
    job.write_text(yaml.safe_dump(data, sort_keys=False))
    return job


def test_a_paginated_get_lookup_of_three_pages_retried_after_a_500(
    tmp_path: Path, target: TargetProcess
) -> None:
    first_fails = {"match": {"method": "GET", "path_contains": "/countries"}, "status": 500, "times": 1}
    target.set_plan({"rules": [first_fails, *_PAGES]})
    target.reset()
    result = run_job(tmp_path, _countries_job(tmp_path, target))
    assert result.exit_code == 0, result.envelope
    assert _sent(target) == {"c1": 1, "c2": 5, "c3": 4}


def test_a_get_lookups_credentials_never_follow_a_next_page_to_another_origin(
    tmp_path: Path, target: TargetProcess
) -> None:
    """The job's headers (its token) go to the first page's origin; a next page an answer points at on
    another host or port is asked for without them, as a browser or curl would."""
    with TargetProcess({"rules": [_page("/countries/p2", [("ES", 4), ("IT", 5)], None)]}) as elsewhere:
        target.set_plan({"rules": [_page("/countries", [("FR", 1)], f"{elsewhere.url}/countries/p2")]})
        target.reset()
        job = _countries_job(tmp_path, target)
        data = yaml.safe_load(job.read_text())
        data["request"]["headers"] = {"Authorization": "Bearer ${LOOKUP_TOKEN}"}
        job.write_text(yaml.safe_dump(data, sort_keys=False))
        result = run_job(tmp_path, job, env=cli_env(LOOKUP_TOKEN="s3cret-token"))
        assert result.exit_code == 0, result.envelope
        asked_elsewhere = [r for r in elsewhere.requests() if r["path"] == "/countries/p2"]
    first = [r for r in target.requests() if r["path"] == "/countries"]
    assert first and all(_header(r, "authorization") == "Bearer s3cret-token" for r in first)
    assert asked_elsewhere and all(_header(r, "authorization") is None for r in asked_elsewhere)
    assert _sent(target) == {"c1": 1, "c2": 5, "c3": 4}


@pytest.mark.parametrize(
    ("rules", "exit_code", "words"),
    [
        ([_page("/countries", [("FR", 1)], "/countries")], ExitCode.ARG_ERROR, "the pages loop"),
        (
            [{"match": {"method": "GET", "path_contains": "/countries"}, "status": 200, "body": "<html>"}],
            ExitCode.ARG_ERROR,
            "page 1 is not JSON",
        ),
        (
            [{"match": {"method": "GET", "path_contains": "/countries"}, "status": 503}],
            ExitCode.UNAVAILABLE,
            "503",
        ),
    ],
    ids=["loop", "not-json", "down"],
)
def test_a_hostile_get_lookup_fails_clearly_and_sends_nothing(
    tmp_path: Path, target: TargetProcess, rules: list[dict[str, Any]], exit_code: int, words: str
) -> None:
    target.set_plan({"rules": rules})
    target.reset()
    result = run_job(tmp_path, _countries_job(tmp_path, target))
    assert result.exit_code == exit_code, result.envelope
    assert words in orjson.dumps(result.envelope["error"]).decode()
    assert _sent(target) == {}
    assert not list((tmp_path / ".bulkrelay" / "runs").glob("*/run.json"))  # no run was started


def test_retry_failed_sends_a_skipped_row_once_its_key_exists(tmp_path: Path, target: TargetProcess) -> None:
    target.set_plan({})
    target.reset()
    accounts = _accounts(tmp_path, target)
    run_job(tmp_path, accounts)
    contacts = _contacts(tmp_path, target, ["1", "31"], on_miss="skip")  # account 31 does not exist yet
    first = run_job(tmp_path, contacts)
    assert first.exit_code == ExitCode.PARTIAL_FAILURE
    write_csv(
        tmp_path / "accounts.csv", [{"id": str(n), "email": f"u{n}@x.io", "name": "n"} for n in range(1, 32)]
    )
    ids = _captured_ids(tmp_path, run_job(tmp_path, accounts).data["run_dir"])
    target.reset()
    retried = run_cli(
        "retry-failed",
        first.data["run_dir"],
        "--classification",
        "lookup_miss",
        "--budget",
        "0",
        cwd=tmp_path,
    )
    assert retried.exit_code == 0, retried.envelope
    assert _sent(target) == {"c2": ids["31"]}  # the maps built afresh: the new account's id


def test_a_batch_jobs_items_read_a_lookup(tmp_path: Path, target: TargetProcess) -> None:
    """A lookup leaf in request.batch.item: each item carries its account's captured id; a miss with
    `on_miss: fail` is named by preflight with its row, and nothing is sent."""
    target.reset()
    ids = _captured_ids(tmp_path, run_job(tmp_path, _accounts(tmp_path, target)).data["run_dir"])
    contacts = _contacts(tmp_path, target, ["2", "5", "7"])
    job = yaml.safe_load(contacts.read_text())
    lookup = job["request"].pop("json")["accountId"]
    job["request"] |= {"url": f"{target.url}/v1/batch/array", "batch": {"max_items": 10}}
    job["request"]["batch"]["item"] = {"id": {"from": "id"}, "accountId": lookup}
    contacts.write_text(yaml.safe_dump(job, sort_keys=False))
    target.reset()
    sent = run_job(tmp_path, contacts)
    assert sent.exit_code == 0, sent.envelope
    [request] = [orjson.loads(r["body"]) for r in target.requests() if r["path"] == "/v1/batch/array"]
    assert request == [
        {"id": "c1", "accountId": ids["2"]},
        {"id": "c2", "accountId": ids["5"]},
        {"id": "c3", "accountId": ids["7"]},
    ]
    write_csv(tmp_path / "contacts.csv", [{"id": "c1", "account": "1"}, {"id": "c2", "account": "nope"}])
    target.reset()
    failed = run_job(tmp_path, contacts)
    assert failed.exit_code == ExitCode.ARG_ERROR
    [problem] = failed.envelope["error"]["context"]["problems"]
    assert problem["row"] == 2 and "lookup account_ids has no key 'nope'" in problem["message"]
    assert target.requests() == []


def test_a_lookup_of_a_parent_whose_journal_is_corrupt_refuses_before_any_request(
    tmp_path: Path, target: TargetProcess
) -> None:
    target.set_plan({})  # the module shares its target: no delay or failure of an earlier test
    accounts = run_job(tmp_path, _accounts(tmp_path, target))
    assert accounts.exit_code == 0
    journal, offset = damage_second_line(accounts.data["run_dir"])
    target.reset()
    refs = [str(n) for n in range(1, 8)]
    refused = run_job(tmp_path, _contacts(tmp_path, target, refs, on_miss="skip"))
    assert_refused_as_corrupt(refused, accounts.data["run_dir"], journal, offset)
    assert _sent(target) == {}
    assert "Traceback" not in refused.stderr
