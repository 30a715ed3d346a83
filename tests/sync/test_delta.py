"""Delta sync with real processes: the target's request log proves which rows each night sent."""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.job.config import RequestConfig
from bulkrelay.job.digest import RequestDigester
from bulkrelay.job.records import Record
from bulkrelay.job.request import RequestRenderer
from bulkrelay.ops.results import RunResult
from bulkrelay.store.journal import decode_line, encode_line, is_commit_marker, read_journal
from bulkrelay.store.manifest import RunManifest
from bulkrelay.store.rundir import RunDir, RunState
from bulkrelay.sync import linescan
from bulkrelay.sync.state import SyncState, job_identity, rebuilt_items
from tests.clirun import cli_env, run_cli, start_cli
from tests.gatedruns import GATE, GATED_JOB, OPEN, delivered_ids, run_changing_the_input
from tests.jobfiles import make_rows, write_csv, write_job
from tests.runfiles import metric, read_metrics
from tests.runplans import delivered_entry, run_plan
from tests.runsteps import resume, rewrite_job, run_here, sent_ids
from tests.sync.nights import DELTA, mirror_job, run_night
from tests.targetproc import TargetProcess

# real processes: outside the fast lane (`-m "not slow"`)
pytestmark = [pytest.mark.slow, pytest.mark.target_plan({"dedup": True})]

ROWS = 500
CHANGED = (7, 99, 250, 251, 480)  # 1% of the rows


def _rows_with_changes(changed: tuple[int, ...], tag: str = "-v2") -> list[dict[str, str]]:
    rows = make_rows(ROWS)
    for n in changed:
        rows[n - 1]["email"] = f"user{n}{tag}@example.com"
    return rows


def _state(cwd: Path) -> list[tuple[str, bytes, str]]:
    runs_dir = cwd / ".bulkrelay" / "runs"
    with SyncState.for_job(runs_dir, job_identity("test-job", cwd / "job.yaml")) as state:
        return list(state.items())


def _rebuilt(cwd: Path) -> list[tuple[str, bytes, str]]:
    return list(rebuilt_items(cwd / ".bulkrelay" / "runs", job_identity("test-job", cwd / "job.yaml")))


def test_night_1_sends_all_and_night_2_sends_exactly_the_changed_rows(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS, **DELTA)
    first = run_night(tmp_path, job)
    assert sent_ids(target) == Counter({str(n): 1 for n in range(1, ROWS + 1)})
    assert first.data["summary"]["skipped_unchanged"] == 0

    target.reset()
    write_csv(tmp_path / "data.csv", _rows_with_changes(CHANGED))
    second = run_night(tmp_path, job, "--metrics-file", str(tmp_path / "delta.prom"))
    assert sent_ids(target) == Counter({str(n): 1 for n in CHANGED})
    assert second.data["summary"]["skipped_unchanged"] == ROWS - len(CHANGED)
    samples = read_metrics(tmp_path / "delta.prom")
    assert metric(samples, "bulkrelay_rows_skipped_unchanged") == ROWS - len(CHANGED)
    assert metric(samples, "bulkrelay_rows", outcome="succeeded") == len(CHANGED)
    assert second.data["progress"]["total"] == len(CHANGED)
    status = run_cli("status", second.data["run_dir"], cwd=tmp_path)
    assert status.data["sync"]["skipped_unchanged"] == ROWS - len(CHANGED)
    exported = run_cli("export", second.data["run_dir"], "--format", "jsonl", cwd=tmp_path)
    assert exported.data["skipped_unchanged"] == ROWS - len(CHANGED)
    lines = [orjson.loads(line) for line in Path(exported.data["output"]).read_bytes().splitlines()]
    outcome = {line["record"]["id"]: line["result"]["classification"] for line in lines}
    assert outcome == {str(n): "success" if n in CHANGED else "skipped_unchanged" for n in range(1, ROWS + 1)}

    target.reset()
    run_night(tmp_path, job)  # nothing changed since: nothing is sent
    assert target.requests() == []
    assert _state(tmp_path) == _rebuilt(tmp_path)
    assert len(_state(tmp_path)) == ROWS


def test_in_two_shards_night_2_sends_exactly_the_changed_rows_once(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS, **DELTA)
    for k in range(2):
        run_night(tmp_path, job, "--shard", f"{k}/2")
    assert sent_ids(target) == Counter({str(n): 1 for n in range(1, ROWS + 1)})

    target.reset()
    write_csv(tmp_path / "data.csv", _rows_with_changes(CHANGED))
    nights = [run_night(tmp_path, job, "--shard", f"{k}/2").data for k in range(2)]
    assert sent_ids(target) == Counter({str(n): 1 for n in CHANGED})
    assert sum(night["progress"]["total"] for night in nights) == len(CHANGED)
    # Each shard skips only its own unchanged rows: together, every unchanged row once.
    assert sum(night["summary"]["skipped_unchanged"] for night in nights) == ROWS - len(CHANGED)
    assert _state(tmp_path) == _rebuilt(tmp_path)


def test_rotating_a_token_or_reordering_the_body_sends_nothing_but_a_new_url_sends_all(
    tmp_path: Path, target: TargetProcess
) -> None:
    headers = {"headers": {"Authorization": "Bearer ${API_TOKEN}"}}
    job = write_job(tmp_path, target.url, rows=ROWS, **{**DELTA, "request": {**DELTA["request"], **headers}})
    assert run_cli("run", job, "--budget", "0", cwd=tmp_path, env=cli_env(API_TOKEN="one")).exit_code == 0
    target.reset()
    rewrite_job(job, request={"json": {"name": {"from": "name"}, "email": {"from": "email"}}})
    again = run_cli("run", job, "--budget", "0", cwd=tmp_path, env=cli_env(API_TOKEN="two"))
    assert again.exit_code == 0, again.envelope
    assert target.requests() == []
    assert again.data["summary"]["skipped_unchanged"] == ROWS

    rewrite_job(job, request={"url": f"{target.url}/v2/items/{{id}}"})
    moved = run_cli("run", job, "--budget", "0", cwd=tmp_path, env=cli_env(API_TOKEN="two"))
    assert moved.exit_code == 0, moved.envelope
    assert sent_ids(target) == Counter({str(n): 1 for n in range(1, ROWS + 1)})
    assert {r["path"].rsplit("/", 1)[0] for r in target.requests()} == {"/v2/items"}


def test_full_sends_every_row_once_and_refreshes_the_state(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS, **DELTA)
    run_night(tmp_path, job)
    target.reset()
    write_csv(tmp_path / "data.csv", _rows_with_changes(CHANGED))
    full = run_night(tmp_path, job, "--full")
    assert sent_ids(target) == Counter({str(n): 1 for n in range(1, ROWS + 1)})
    assert full.data["summary"]["skipped_unchanged"] == 0
    target.reset()
    run_night(tmp_path, job)  # the full run refreshed the state: the changed rows are known now
    assert target.requests() == []


def _committed_lines(journal: Path) -> int:
    if not journal.exists():
        return 0
    count = 0
    for line in journal.read_bytes().splitlines(keepends=True):
        if is_commit_marker(line):
            continue
        try:
            decode_line(line)
        except ValueError:
            break
        count += 1
    return count


def _kill_after_commits(cwd: Path, job: Path, commits: int) -> Path:
    """Start night 2, wait until `commits` rows are in its journal, kill -9 it; its run directory."""
    runs = cwd / ".bulkrelay" / "runs"
    before = set(runs.iterdir())
    proc = start_cli("run", job, "--budget", "0", cwd=cwd, output="discarded")
    deadline = time.monotonic() + 60
    try:
        while True:
            assert proc.poll() is None, f"night 2 ended on its own (exit {proc.returncode})"
            assert time.monotonic() < deadline, "night 2 never committed enough rows"
            fresh = [d for d in runs.iterdir() if d not in before and d.is_dir()]
            if fresh and _committed_lines(fresh[0] / "results.jsonl") >= commits:
                proc.send_signal(signal.SIGKILL)
                return fresh[0]
            time.sleep(0.01)
    finally:
        proc.kill()
        proc.wait()


def test_kill_9_in_night_2_then_the_identical_command_delivers_each_changed_row_once(
    tmp_path: Path,
) -> None:
    changed = tuple(range(3, ROWS, 10))  # 50 rows
    # The first changed row is sent first and its first answer never comes (until the 30 s read
    # timeout): night 2 cannot finish before the kill, and the row is in flight when it comes.
    stalled = f"user{changed[0]}-v2@"
    plan = {"dedup": True, "rules": [{"match": {"body_contains": stalled}, "delay_ms": 600_000, "times": 1}]}
    with TargetProcess(plan) as target:
        job = write_job(tmp_path, target.url, rows=ROWS, **DELTA)
        run_night(tmp_path, job)
        target.reset()
        write_csv(tmp_path / "data.csv", _rows_with_changes(changed))
        run_dir = _kill_after_commits(tmp_path, job, commits=20)
        after = run_night(tmp_path, job)
        assert after.data["run_id"] == run_dir.name  # the identical command continued the killed run

        delivered = Counter(str(e.key) for e in read_journal(run_dir / "results.jsonl"))
        assert delivered == Counter({str(n): 1 for n in changed})
        sent = sent_ids(target)
        assert set(sent) == {str(n) for n in changed}  # no unchanged row went out
        assert target.stats()["effects"] == len(changed)  # each changed row took effect once
    assert _state(tmp_path) == _rebuilt(tmp_path)


def test_a_row_that_failed_is_not_delivered_and_goes_again_the_next_night(tmp_path: Path) -> None:
    failing = {"match": {"body_contains": f"user{CHANGED[0]}-v2@"}, "status": 422, "times": 1}
    with TargetProcess({"rules": [failing]}) as target:
        job = write_job(tmp_path, target.url, rows=ROWS, **DELTA)
        run_night(tmp_path, job)
        target.reset()
        write_csv(tmp_path / "data.csv", _rows_with_changes(CHANGED))
        second = run_cli("run", job, "--budget", "0", cwd=tmp_path)
        assert second.exit_code == ExitCode.PARTIAL_FAILURE, second.envelope
        target.set_plan({})
        target.reset()
        third = run_night(tmp_path, job)
        assert sent_ids(target) == Counter({str(CHANGED[0]): 1})
        assert third.data["summary"]["skipped_unchanged"] == ROWS - 1


def test_sync_state_rebuild_equals_the_live_state_and_verify_names_a_difference(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS, **DELTA)
    run_night(tmp_path, job)
    write_csv(tmp_path / "data.csv", _rows_with_changes(CHANGED))
    run_night(tmp_path, job)
    live = _state(tmp_path)
    verified = run_cli("sync-state", "verify", job, cwd=tmp_path)
    assert verified.exit_code == ExitCode.SUCCESS, verified.envelope
    assert verified.data["keys"] == ROWS

    state_file = Path(verified.data["state"])
    with sqlite3.connect(state_file) as db:  # the state drifts from its journals
        db.execute("UPDATE delivered SET digest = zeroblob(16) WHERE key = '99'")
        db.execute("DELETE FROM delivered WHERE key = '7'")
    db.close()
    drifted = run_cli("sync-state", "verify", job, cwd=tmp_path)
    assert drifted.exit_code == ExitCode.PRECONDITION, drifted.envelope
    assert drifted.error_code == "SYNC_STATE_MISMATCH"
    context = drifted.envelope["error"]["context"]
    assert (context["missing"], context["extra"], context["different"]) == (1, 0, 1)
    assert {e["key"] for e in context["examples"]} == {"7", "99"}

    state_file.unlink()
    rebuilt = run_cli("sync-state", "rebuild", job, cwd=tmp_path)
    assert rebuilt.exit_code == ExitCode.SUCCESS, rebuilt.envelope
    assert (rebuilt.data["runs"], rebuilt.data["keys"]) == (2, ROWS)
    assert _state(tmp_path) == live
    assert run_cli("sync-state", "verify", job, cwd=tmp_path).exit_code == ExitCode.SUCCESS


def test_mirror_deletes_exactly_the_missing_keys_and_halts_over_max_deletes(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS, **mirror_job(target, "1%"))  # 5 of 500
    run_night(tmp_path, job)
    target.reset()
    gone = {12, 13, 300, 499}
    rows = [row for row in _rows_with_changes(CHANGED[:1]) if int(row["id"]) not in gone]
    write_csv(tmp_path / "data.csv", rows)
    second = run_night(tmp_path, job)
    sent = Counter((r["method"], r["path"].rsplit("/", 1)[-1]) for r in target.requests())
    assert sent == Counter({("POST", str(CHANGED[0])): 1, **{("DELETE", str(n)): 1 for n in gone}})
    assert second.data["mirror"]["deletions"] == len(gone)
    mirror = second.data["mirror"]  # the deletion run, named in the night's envelope in this order
    assert list(mirror) == ["deletions", "run_id", "run_dir", "state", "progress", "after_run"]
    assert (mirror["state"], mirror["progress"]["total"]) == ("completed", len(gone))
    assert mirror["after_run"] == second.data["run_id"] and mirror["run_id"] != second.data["run_id"]
    assert {key for key, _, _ in _state(tmp_path)} == {str(n) for n in range(1, ROWS + 1)} - {
        str(n) for n in gone
    }
    assert _state(tmp_path) == _rebuilt(tmp_path)

    target.reset()
    run_night(tmp_path, job)  # the deleted keys are gone from the state: nothing is sent again
    assert target.requests() == []

    write_csv(tmp_path / "data.csv", rows[10:])  # a bad export: 10 more keys missing, 1% allows 4
    halted = run_cli("run", job, "--budget", "0", cwd=tmp_path)
    assert halted.exit_code == ExitCode.PRECONDITION, halted.envelope
    assert halted.error_code == "TOO_MANY_DELETES"
    context = halted.envelope["error"]["context"]
    assert (context["deletions"], context["limit"]) == (10, 4)
    assert target.requests() == []  # halted before sending anything


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"execution": {"sync": "delta"}}, "needs input.key"),
        ({"input": {"key": "id"}, "execution": {"sync": "mirror"}}, "go together"),
        (
            {"input": {"key": "id"}, "mirror": {"url": "http://127.0.0.1:9/{name}", "max_deletes": 1}},
            "go together",
        ),
        (
            {
                "input": {"key": "id"},
                "execution": {"sync": "mirror"},
                "mirror": {"url": "http://127.0.0.1:9/{name}", "max_deletes": 1},
            },
            "only the key field {id}",
        ),
        (
            {
                "input": {"key": "id"},
                "execution": {"sync": "mirror"},
                "mirror": {"url": "http://127.0.0.1:9/{id}", "max_deletes": "half"},
            },
            "expected a count (like 100) or a percentage",
        ),
    ],
)
def test_delta_and_mirror_settings_are_checked_with_the_line(
    tmp_path: Path, overrides: dict[str, Any], message: str
) -> None:
    job = write_job(tmp_path, "http://127.0.0.1:9", rows=3, **overrides)
    result = run_cli("validate", job, cwd=tmp_path)
    assert result.exit_code == ExitCode.ARG_ERROR, result.envelope
    assert result.error_code == "CONFIG_INVALID"
    assert message in result.envelope["error"]["message"]


def test_a_delta_run_resumes_and_retries_its_failed_rows_like_any_run(tmp_path: Path) -> None:
    changed = tuple(range(3, ROWS, 10))  # 50 rows
    # The first changed row's first answer never comes: it fails on the 2 s read timeout.
    stalled = {"match": {"body_contains": f"user{changed[0]}-v2@"}, "delay_ms": 600_000, "times": 1}
    with TargetProcess({"rules": [stalled]}) as target:
        job = write_job(tmp_path, target.url, rows=ROWS, **DELTA)
        run_night(tmp_path, job)
        target.reset()
        write_csv(tmp_path / "data.csv", _rows_with_changes(changed))
        rewrite_job(
            job, execution={"rate_limit": {"requests_per_second": 20}, "timeout": {"read_seconds": 2}}
        )
        stopped = run_cli("run", job, "--budget", "0", "--timeout", "1s", cwd=tmp_path)
        assert stopped.exit_code == ExitCode.TIMEOUT, stopped.envelope
        assert stopped.data["progress"]["done"] < stopped.data["progress"]["total"] == len(changed)

        resumed = run_cli("resume", stopped.data["run_dir"], "--budget", "0", cwd=tmp_path)
        assert resumed.exit_code == ExitCode.PARTIAL_FAILURE, resumed.envelope  # the stalled row
        assert resumed.data["progress"]["done"] == len(changed)
        retried = run_cli("retry-failed", stopped.data["run_dir"], "--budget", "0", cwd=tmp_path)
        assert retried.exit_code == ExitCode.SUCCESS, retried.envelope
        assert retried.data["progress"]["total"] == 1

        # The log keeps answered requests (the stalled first try never was); arrivals count it too.
        assert sent_ids(target) == Counter({str(n): 1 for n in changed})
        assert target.stats()["requests"] == len(changed) + 1
        assert _state(tmp_path) == _rebuilt(tmp_path)
        target.reset()
        run_night(tmp_path, job)  # every changed row, the retried one included, is in the state
        assert target.requests() == []


def _padded(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """Rows of 3 KB: the rows after the first megabyte are read only when the relay reaches them."""
    return [{**row, "note": "x" * 3000} for row in rows]


def _rewrite_every_row(data: Path) -> None:
    write_csv(data, make_rows(ROWS, tag="-new"))  # the same file, other bytes, another size


def _change_an_unsent_row_keeping_size_and_time(data: Path) -> None:
    """The last changed row, not read yet (the 4 workers hold the first 4, and it is past the first
    megabyte), altered in place: size and modification time stay as preflight saw them, so only the
    check of its region's bytes (and behind it, the row's own) can tell."""
    before = data.stat()
    body = data.read_bytes()
    old = f"user{CHANGED[-1]}-v2@".encode()
    assert body.count(old) == 1
    data.write_bytes(body.replace(old, f"user{CHANGED[-1]}-v3@".encode()))
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        (_rewrite_every_row, "data.csv changed during the run: size"),
        (_change_an_unsent_row_keeping_size_and_time, "data.csv changed during the run: bytes "),
    ],
    ids=["rewrite", "same_size_row"],
)
def test_an_input_changed_between_preflight_and_send_stops_a_run_that_reads_it_again(
    tmp_path: Path, change: Callable[[Path], None], detail: str
) -> None:
    """A mirror night reads its changed rows from the input again (a delta night keeps them, below):
    the bytes it reads must be the ones preflight chose them from."""
    with TargetProcess(OPEN) as target:
        mirror = mirror_job(target, 0)
        job = write_job(tmp_path, target.url, rows=_padded(make_rows(ROWS)), **{**mirror, **GATED_JOB})
        run_night(tmp_path, job)
        night_2 = write_csv(tmp_path / "data.csv", _padded(_rows_with_changes(CHANGED))).read_bytes()
        target.reset()
        target.set_plan(GATE)

        exit_code, envelope = run_changing_the_input(tmp_path, job, target, change)

        assert exit_code == ExitCode.PRECONDITION, envelope
        assert envelope["error"]["code"] == "INPUT_CHANGED"
        assert detail in envelope["error"]["detail"]
        assert envelope["data"]["state"] == "stopped"
        assert envelope["data"]["progress"]["done"] < envelope["data"]["progress"]["total"] == len(CHANGED)
        delivered = [r["body"] for r in target.requests() if r["status"] == 200]
        assert not any("-new" in body or "-v3" in body for body in delivered)  # nothing read after the change
        assert set(sent_ids(target)) < {str(n) for n in CHANGED}  # and no row preflight did not choose

        (tmp_path / "data.csv").write_bytes(night_2)
        resumed = resume(tmp_path, Path(envelope["data"]["run_dir"]))
        assert resumed.exit_code == ExitCode.SUCCESS, resumed.envelope
        assert delivered_ids(target) == Counter({str(n): 1 for n in CHANGED})
    assert _state(tmp_path) == _rebuilt(tmp_path)


@pytest.mark.parametrize("change", [_rewrite_every_row, _change_an_unsent_row_keeping_size_and_time])
def test_a_delta_night_sends_the_rows_preflight_chose_as_it_read_them_whatever_the_input_becomes(
    tmp_path: Path, change: Callable[[Path], None]
) -> None:
    """A delta night keeps its few changed rows from preflight and reads nothing again: an input
    rewritten while the relay sends changes nothing it sends."""
    with TargetProcess(OPEN) as target:
        job = write_job(tmp_path, target.url, rows=_padded(make_rows(ROWS)), **{**DELTA, **GATED_JOB})
        run_night(tmp_path, job)
        write_csv(tmp_path / "data.csv", _padded(_rows_with_changes(CHANGED)))
        target.reset()
        target.set_plan(GATE)

        exit_code, envelope = run_changing_the_input(tmp_path, job, target, change)

        assert exit_code == ExitCode.SUCCESS, envelope
        assert envelope["data"]["state"] == "completed"
        delivered = [r["body"] for r in target.requests() if r["status"] == 200]
        assert len(delivered) == len(CHANGED)
        assert all("-v2@" in body for body in delivered)  # as preflight read them
        assert not any("-new" in body or "-v3" in body for body in delivered)
        assert delivered_ids(target) == Counter({str(n): 1 for n in CHANGED})
    assert _state(tmp_path) == _rebuilt(tmp_path)


def _digest(
    request: dict[str, Any], fields: dict[str, Any], token: str = "one", *, wire: bool = True
) -> bytes:
    """`wire`: the renderer writes the JSON body sorted (a delta job), so the digest takes it as is;
    else the digest sorts it itself. Both give the same digest."""
    config = RequestConfig.model_validate(request)
    renderer = RequestRenderer.from_config(config, {"API_TOKEN": token}, sorted_json=wire)
    record = Record(row_number=1, line=2, fields=fields)
    digester = RequestDigester(config, renderer.redactor, sorted_json=wire)
    return digester.digest(renderer.render(record), fields)


def test_the_digest_is_of_the_request_as_it_means_not_as_it_is_spelled() -> None:
    base = {
        "method": "POST",
        "url": "http://127.0.0.1:9/items/{id}?token=${API_TOKEN}",
        "headers": {"Authorization": "Bearer ${API_TOKEN}", "X-Tenant": "{tenant}"},
        "json": {"a": {"from": "a"}, "b": {"from": "b", "type": "json"}},
        "idempotency_key": {"header": "Idempotency-Key"},
    }
    fields = {"id": "7", "tenant": "acme", "a": "x", "b": '{"k": 1, "j": 2}'}
    digest = _digest(base, fields)
    assert _digest(base, fields, wire=False) == digest
    reordered_plain = {**base, "json": {"b": {"from": "b", "type": "json"}, "a": {"from": "a"}}}
    assert _digest(reordered_plain, {**fields, "b": '{"j": 2, "k": 1}'}, wire=False) == digest
    assert _digest(base, fields, token="two") == digest  # a rotated secret sends nothing
    reordered = {**base, "json": {"b": {"from": "b", "type": "json"}, "a": {"from": "a"}}}
    assert _digest(reordered, {**fields, "b": '{"j": 2, "k": 1}'}) == digest  # canonical JSON
    assert _digest({**base, "idempotency_key": {"header": "X-Key"}}, fields) == digest
    assert _digest(base, {**fields, "a": "y"}) != digest
    assert _digest(base, {**fields, "tenant": "other"}) != digest  # a header taken from a field
    assert _digest({**base, "method": "PUT"}, fields) != digest
    assert _digest({**base, "url": "http://127.0.0.1:9/v2/items/{id}?token=${API_TOKEN}"}, fields) != digest
    auth = {**base, "headers": {"Authorization": "Token ${API_TOKEN}", "X-Tenant": "{tenant}"}}
    assert _digest(auth, fields) != digest  # the header as written changed


def _target_digest(url: str, base: str) -> bytes:
    config = RequestConfig.model_validate({"method": "PUT", "url": url, "json": {"a": {"from": "a"}}})
    env = {"API_BASE": base, "API_TOKEN": "tok-123456"}
    renderer = RequestRenderer.from_config(config, env, sorted_json=True)
    digester = RequestDigester(config, renderer.redactor, sorted_json=True, env=env)
    fields = {"id": "7", "a": "x"}
    return digester.digest(renderer.render(Record(row_number=1, line=2, fields=fields)), fields)


def test_a_variable_naming_the_target_is_digested_by_its_scheme_host_and_port() -> None:
    url = "${API_BASE}/items/{id}?token=${API_TOKEN}"
    here = _target_digest(url, "https://api.example.com")
    assert _target_digest(url, "https://user:pw@api.example.com") == here  # credentials are not the target
    assert _target_digest(url, "https://api2.example.com") != here
    assert _target_digest(url, "https://api.example.com:8443") != here
    assert _target_digest(url, "http://api.example.com") != here
    # A variable past the host (a token in the path) stays hashed as written: rotating it sends nothing.
    path = "https://api.example.com/hooks/${API_BASE}/{id}"
    assert _target_digest(path, "one") == _target_digest(path, "two")
    # A field in the host too: the target is taken from each row's URL.
    per_row = "https://{id}.${API_BASE}/items"
    assert _target_digest(per_row, "a.example") != _target_digest(per_row, "b.example")


def _journaled_run(runs_dir: Path, run_id: str, created_at: str, digest: str) -> None:
    run = runs_dir / run_id
    run.mkdir(parents=True)
    plan = run_plan("/job.yaml", name="test-job")
    manifest = RunManifest(run_id, RunState.COMPLETED, created_at, created_at, "0.1.0", plan)
    (run / "run.json").write_bytes(orjson.dumps(manifest.to_json()))
    entry = delivered_entry(1, key="k", digest=digest)
    (run / "results.jsonl").write_bytes(encode_line(1, entry))


def test_of_two_runs_made_in_the_same_second_the_later_one_wins_whatever_their_ids(tmp_path: Path) -> None:
    # The ids sort the other way round from the creation times (their random suffixes).
    _journaled_run(tmp_path, "20261201T030000Z-ffffffff", "2026-12-01T03:00:00.100000Z", "11" * 16)
    _journaled_run(tmp_path, "20261201T030000Z-00000000", "2026-12-01T03:00:00.900000Z", "22" * 16)
    identity = job_identity("test-job", "/job.yaml")
    assert [(k, d.hex()) for k, d, _ in rebuilt_items(tmp_path, identity)] == [("k", "22" * 16)]


def _delivered_keys(runs_dir: Path, delivered: dict[str, bytes]) -> SyncState:
    """A sync state holding `delivered` (key: digest), applied from a completed run's journal."""
    run = runs_dir / "20261201T030000Z-00000000"
    run.mkdir(parents=True)
    created_at = "2026-12-01T03:00:00.000000Z"
    manifest = RunManifest(
        run.name, RunState.COMPLETED, created_at, created_at, "0.1.0", run_plan("/job.yaml")
    )
    (run / "run.json").write_bytes(orjson.dumps(manifest.to_json()))
    with (run / "results.jsonl").open("wb") as journal:
        for row, (key, digest) in enumerate(delivered.items(), start=1):
            entry = delivered_entry(row, key=key, digest=digest.hex())
            journal.write(encode_line(row, entry))
    state = SyncState.for_job(runs_dir, job_identity(None, "/job.yaml"))
    state.apply_run(RunDir.open(run))
    return state


def test_a_batch_compared_in_sqlite_names_exactly_the_keys_not_delivered_with_their_digest(
    tmp_path: Path,
) -> None:
    same, other = b"s" * 16, b"o" * 16
    delivered = {"plain": same, 'quo"te\\': same, "ünï": same, "a": same, "a\0b": other}
    with _delivered_keys(tmp_path, delivered) as state:
        keys = ["plain", 'quo"te\\', "ünï", "a", "never-sent", "plain"]
        digests = [same, other, same, same, same, other]
        assert state.changed_among(keys, b"".join(digests)) == [1, 4, 5]
        # A key holding a NUL: SQLite's JSON would cut it to "a" and find "a"'s digest.
        keys = ["a\0b", "a\0b", "a", "plain"]
        digests = [other, same, same, other]
        assert state.changed_among(keys, b"".join(digests)) == [1, 3]


def test_a_plain_json_request_has_the_digest_stored_in_existing_states() -> None:
    # Pinned: sync states and journals already hold this value. A delta job's usual request takes a
    # shorter path to it (a sorted JSON body, no secret in the URL or body, no header from a field).
    request = {
        "method": "PUT",
        "url": "http://127.0.0.1:9/v1/customers/{id}",
        "headers": {"Authorization": "Bearer ${API_TOKEN}"},
        "json": {"email": {"from": "email"}, "age": {"from": "age", "type": "integer"}},
        "idempotency_key": {"header": "Idempotency-Key"},
    }
    fields = {"id": "42", "email": "a@example.org", "age": "7"}
    assert _digest(request, fields).hex() == "2565dd0c31b60930f04be20a0051c90f"
    assert _digest(request, fields, wire=False) == _digest(request, fields)  # the general path


def test_many_batches_of_look_ups_select_exactly_the_changed_rows_and_a_bad_input_stops_them(
    tmp_path: Path, target: TargetProcess
) -> None:
    # 6,000 rows are 7 batches of key look-ups, more than are ever in flight on the look-up thread.
    rows, changed = 6_000, (1, 999, 1_000, 4_321, 6_000)
    job = write_job(tmp_path, target.url, rows=rows, **DELTA)
    run_night(tmp_path, job)
    state = _state(tmp_path)
    bad = make_rows(rows)
    for n in changed:
        bad[n - 1]["email"] = f"user{n}-v2@example.com"
    bad[5_500]["id"] = "17"  # a duplicate key: preflight refuses the input after most look-ups ran
    write_csv(tmp_path / "data.csv", bad)
    target.reset()
    refused = run_cli("run", job, "--budget", "0", cwd=tmp_path)
    assert refused.exit_code == ExitCode.ARG_ERROR, refused.envelope
    assert refused.envelope["error"]["code"] == "INPUT_INVALID"
    assert target.requests() == []
    assert _state(tmp_path) == state

    bad[5_500]["id"] = "5501"
    write_csv(tmp_path / "data.csv", bad)
    second = run_night(tmp_path, job)
    assert sent_ids(target) == Counter({str(n): 1 for n in changed})
    assert second.data["summary"]["skipped_unchanged"] == rows - len(changed)


# A line scan that says every line of its first frame is known, then dies: preflight must not keep a
# choice made on its word.
_LYING_SCAN = """
import struct, sys
sys.stdout.buffer.write(struct.pack("<cqI", b"V", 1, 4096) + bytes([1]) * 4096 + bytes(16 * 4096))
sys.stdout.buffer.flush()
sys.exit(3)
"""


def test_a_line_scan_that_fails_after_preflight_trusted_it_leaves_the_choice_to_the_full_rule(
    tmp_path: Path, target: TargetProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS, **DELTA)
    run_night(tmp_path, job)
    write_csv(tmp_path / "data.csv", _rows_with_changes(CHANGED))
    target.reset()
    monkeypatch.setattr(linescan, "_COMMAND", (sys.executable, "-c", _LYING_SCAN))
    monkeypatch.chdir(tmp_path)  # the same working directory: the same invocation, in-process

    result = run_here(job)

    assert result.exit_code == ExitCode.SUCCESS, result.error
    assert sent_ids(target) == Counter({str(n): 1 for n in CHANGED})
    assert isinstance(result.data, RunResult)
    assert result.data.summary.skipped_unchanged == ROWS - len(CHANGED)


def _lines_known(cwd: Path) -> int:
    """How many delivered keys have the digest of the input line their request was read from."""
    runs_dir = cwd / ".bulkrelay" / "runs"
    with SyncState.for_job(runs_dir, job_identity("test-job", cwd / "job.yaml")) as state:
        return int(state._db.execute("SELECT count(line) FROM delivered").fetchone()[0])


def test_each_delivery_teaches_the_state_its_line_and_a_rebuild_forgets_them(
    tmp_path: Path, target: TargetProcess
) -> None:
    """So that the next night settles the row by its bytes alone (sync/linescan.py)."""
    job = write_job(tmp_path, target.url, rows=ROWS, **DELTA)
    run_night(tmp_path, job)
    assert _lines_known(tmp_path) == ROWS
    write_csv(tmp_path / "data.csv", _rows_with_changes(CHANGED))
    target.reset()

    second = run_night(tmp_path, job)

    assert sent_ids(target) == Counter({str(n): 1 for n in CHANGED})
    assert second.data["summary"]["skipped_unchanged"] == ROWS - len(CHANGED)
    assert _lines_known(tmp_path) == ROWS  # the changed rows' new lines, learned on delivery
    rebuilt = run_cli("sync-state", "rebuild", job, cwd=tmp_path)
    assert rebuilt.exit_code == ExitCode.SUCCESS, rebuilt.envelope
    assert _lines_known(tmp_path) == 0  # the journals hold requests, not lines
    target.reset()

    third = run_night(tmp_path, job)  # the full rule again, learning every line

    assert sent_ids(target) == Counter()
    assert third.data["summary"]["skipped_unchanged"] == ROWS
    assert _lines_known(tmp_path) == ROWS


def test_a_state_busy_with_another_writer_keeps_no_lines_and_fails_nothing(tmp_path: Path) -> None:
    """Shards of one job write its state at once: learning lines is a cache, and waits for none."""
    path = tmp_path / "state.sqlite"
    with SyncState(path, "job") as state:
        state.learn_lines(["k1"], bytes(16), b"\x01" * 16)
        state._db.execute("PRAGMA busy_timeout = 50")
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")

        assert state.keep_lines() is False

        other.execute("ROLLBACK")
        other.close()
        assert state.keep_lines() is True
        pending = state._db.execute("SELECT key, line FROM pending_lines").fetchall()
        assert pending == [("k1", b"\x01" * 16)]


_STATE_BEFORE_LINES = """
CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (
    id INTEGER PRIMARY KEY, run_id TEXT UNIQUE NOT NULL, at INTEGER NOT NULL, applied_offset INTEGER NOT NULL
);
CREATE TABLE delivered (
    key TEXT PRIMARY KEY, digest BLOB NOT NULL, run INTEGER NOT NULL, at INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO meta VALUES ('job', 'job');
INSERT INTO runs VALUES (1, 'run-1', 1, 0);
INSERT INTO delivered VALUES ('k1', x'00112233445566778899aabbccddeeff', 1, 1);
"""


def test_a_state_written_before_line_digests_keeps_its_deliveries_and_learns_lines(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    with sqlite3.connect(path) as old:
        old.execute("PRAGMA journal_mode=WAL")
        old.executescript(_STATE_BEFORE_LINES)
    old.close()

    with SyncState(path, "job") as state:
        assert list(state.items()) == [("k1", bytes.fromhex("00112233445566778899aabbccddeeff"), "run-1")]
        state.learn_lines(["k1"], bytes.fromhex("00112233445566778899aabbccddeeff"), b"\x02" * 16)
        assert state.keep_lines() is True
        assert state._db.execute("SELECT line FROM delivered").fetchall() == [(b"\x02" * 16,)]
        assert state._db.execute("PRAGMA auto_vacuum").fetchone() == (2,)  # pages can be given back
