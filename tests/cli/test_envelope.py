"""The envelope: five keys always, `ok` iff exit code 0, warnings as code/message/context; human output."""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import orjson
import pytest
from rich.console import Console

from bulkrelay.cli import human
from bulkrelay.envelope import (
    CallMeta,
    CommandData,
    EnvelopeWarning,
    ErrorInfo,
    Result,
    SideChannel,
    dumps_envelope,
    to_envelope,
)
from bulkrelay.errors import ExitCode, NotFound, UsageError
from bulkrelay.ops.results import InputFacts, RunResult, ValidateResult
from bulkrelay.relay.progress import Snapshot
from bulkrelay.store.rundir import RunState
from bulkrelay.store.summary import RunSummary


@pytest.mark.parametrize("code", list(ExitCode))
def test_ok_exactly_when_the_exit_code_is_zero(code: ExitCode) -> None:
    envelope = to_envelope(Result(data={"x": 1}, exit_code=code), duration_ms=5)
    assert set(envelope) == {"ok", "data", "error", "warnings", "meta"}
    assert envelope["ok"] is (code == ExitCode.SUCCESS)
    assert envelope["meta"]["exit_code"] == int(code)
    assert envelope["meta"]["duration_ms"] == 5


def test_an_error_result_carries_code_message_and_context() -> None:
    result = Result.from_error(NotFound("no run directory at /x", context={"run_dir": "/x"}))
    envelope = to_envelope(result, duration_ms=1)
    assert envelope["ok"] is False and envelope["data"] is None
    assert envelope["error"]["code"] == "NOT_FOUND"
    assert envelope["error"]["message"] == "no run directory at /x"
    assert envelope["error"]["context"] == {"run_dir": "/x"}
    assert envelope["meta"]["exit_code"] == ExitCode.NOT_FOUND


def test_warnings_have_code_message_and_optional_context() -> None:
    result = Result(
        warnings=[EnvelopeWarning("TORN_TAIL", "moved aside", {"file": "a"}), EnvelopeWarning("W", "plain")]
    )
    envelope = to_envelope(result, duration_ms=0)
    assert envelope["warnings"] == [
        {"code": "TORN_TAIL", "message": "moved aside", "context": {"file": "a"}},
        {"code": "W", "message": "plain"},
    ]


def test_meta_keeps_extra_fields_and_dumps_as_one_line() -> None:
    envelope = to_envelope(Result(meta=CallMeta(budget_ms=30000)), duration_ms=2)
    assert envelope["meta"] == {"exit_code": 0, "duration_ms": 2, "budget_ms": 30000}
    line = dumps_envelope(envelope)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert orjson.loads(line) == envelope


# ------------------------------------------------------------------------------- human output


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> tuple[io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(human, "_console", Console(file=out, width=120))
    monkeypatch.setattr(human, "_err", Console(file=err, width=120))
    return out, err


def _summary() -> dict[str, Any]:
    return {
        "rows_total": 10,
        "rows_done": 8,
        "rows_pending": 2,
        "by_outcome": {"succeeded": 7, "failed": 1},
        "by_status": {"200": 7, "422": 1},
        "by_classification": {"http_client_error": 1, "success": 7},
        "attempts": 9,
        "retries": 1,
        "latency_ms": {"p50": 1.5, "p95": 3.0, "p99": 4.0, "max": 4.2},
        "this_call": {"rows_committed": 8, "elapsed_seconds": 0.5, "rows_per_second": 16.0},
    }


def _stopped_run() -> RunResult:
    return RunResult(
        run_id="20260101T000000Z-abcd1234",
        run_dir="/runs/20260101T000000Z-abcd1234",
        state=RunState.STOPPED,
        progress=Snapshot(total=10, done=8, ok=7, failed=1),
        summary=RunSummary.from_json(_summary()),
        continue_command="bulkrelay resume /runs/20260101T000000Z-abcd1234",
    )


def test_human_run_result_shows_the_summary_and_the_way_on(captured: tuple[io.StringIO, io.StringIO]) -> None:
    out, err = captured
    data = _stopped_run()
    error = ErrorInfo("INTERRUPTED", "stopped by SIGINT", retryable=True, suggestion=data.continue_command)
    result = Result(data=data, exit_code=ExitCode.SIGINT, error=error)
    human.print_human(result, to_envelope(result, duration_ms=1))
    text = out.getvalue()
    assert "8 of 10 done" in text and "16.0 rows/s" in text and "422: 1" in text
    assert "stopped" in text and "continue with: bulkrelay resume" in text
    assert "INTERRUPTED" in err.getvalue() and "hint:" in err.getvalue()


def test_a_run_result_keeps_its_envelope_data_key_for_key() -> None:
    data = {
        "run_id": "20260101T000000Z-abcd1234",
        "run_dir": "/runs/20260101T000000Z-abcd1234",
        "state": "stopped",
        "progress": {"done": 8, "total": 10, "unit": "rows", "ok": 7, "failed": 1},
        "summary": _summary(),
        "continue_command": "bulkrelay resume /runs/20260101T000000Z-abcd1234",
    }
    envelope = to_envelope(Result(data=_stopped_run()), duration_ms=1)
    assert orjson.dumps(envelope["data"]) == orjson.dumps(data)  # the same keys, in the same order
    with pytest.raises(dataclasses.FrozenInstanceError):
        _stopped_run().state = RunState.COMPLETED  # type: ignore[misc]


def test_a_background_jobs_stored_run_result_shows_as_the_run_did(
    captured: tuple[io.StringIO, io.StringIO],
) -> None:
    """`job wait` reads the job's envelope back from disk: its data is the run's, as a mapping."""
    out, _ = captured
    ran = Result(data=_stopped_run(), exit_code=ExitCode.SIGINT)
    human.print_human(ran, to_envelope(ran, duration_ms=1))
    shown_by_the_run = out.getvalue()
    out.truncate(0)
    out.seek(0)
    stored = orjson.loads(orjson.dumps(to_envelope(ran, duration_ms=1)))
    waited = Result(data=stored["data"], exit_code=ExitCode.SIGINT, kind=ran.kind)
    human.print_human(waited, stored)
    assert out.getvalue() == shown_by_the_run and "8 of 10 done" in shown_by_the_run


def test_human_validate_result(captured: tuple[io.StringIO, io.StringIO]) -> None:
    out, err = captured
    data = ValidateResult(
        job="job.yaml",
        record_count=3,
        format="csv",
        gzip=False,
        input=InputFacts(path="in.csv", sha256="ab" * 32, size=10),
        config_sha256="cd" * 32,
    )
    warning = EnvelopeWarning("SOMETHING", "mind this")
    result = Result(data=data, warnings=[warning])
    human.print_human(result, to_envelope(result, duration_ms=1))
    assert "valid job.yaml: 3 records (csv) from in.csv" in out.getvalue()
    assert "ab" * 32 in out.getvalue()
    assert "warning SOMETHING: mind this" in err.getvalue()


def test_every_command_result_is_a_frozen_dataclass_with_its_own_envelope_data() -> None:
    import bulkrelay.background.jobs
    import bulkrelay.cli.commands
    import bulkrelay.cli.parser
    import bulkrelay.ops.results  # noqa: F401 - each defines results

    kinds = {cls: cls.kind for cls in CommandData.__subclasses__()}
    commands = {
        "ValidateResult",
        "RenderResult",
        "StatusResult",
        "RunsResult",
        "FailuresResult",
        "PruneResult",
    }
    commands |= {
        "ShardsResult",
        "ExportResult",
        "SyncStateResult",
        "RunResult",
        "NothingToRetry",
        "DemoResult",
    }
    commands |= {"HelpText", "VersionInfo", "CompletionScript", "BackgroundJobGoesOn", "BackgroundJobEnded"}
    assert {cls.__name__ for cls in kinds} >= commands
    for cls in kinds:
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls
        assert cls.to_data is not CommandData.to_data, cls


def test_an_error_record_writes_the_keys_an_error_always_wrote_in_their_order() -> None:
    exc = UsageError("bad", detail="d", context={"field": "f"}, suggestion="s", phase="preflight")
    envelope = to_envelope(Result.from_error(exc), duration_ms=1)
    assert dumps_envelope(envelope).count(orjson.dumps(exc.to_dict())) == 1  # byte for byte
    plain = to_envelope(Result.from_error(UsageError("bad")), duration_ms=1)
    assert plain["error"] == {"code": "USAGE_ERROR", "message": "bad", "retryable": False}
    # A background job's stored answer comes back in the order it was written, whichever that was.
    stored = {"code": "STALLED", "message": "m", "retryable": True, "context": {"a": 1}, "detail": "why"}
    assert list(ErrorInfo.from_dict(stored).to_dict().items()) == list(stored.items())
    later = {"code": "X", "hint": {"new": True}, "message": "m"}  # a later version's key; no `retryable`
    assert list(ErrorInfo.from_dict(later).to_dict().items()) == list(later.items())


def test_meta_says_the_job_then_the_budget_and_the_side_channel_stays_out_of_the_envelope() -> None:
    result = Result(meta=CallMeta(job_id="run-0123456789", budget_ms=0), side=SideChannel("page", 7))
    envelope = to_envelope(result, duration_ms=3)
    assert list(envelope["meta"].items()) == [
        ("exit_code", 0),
        ("duration_ms", 3),
        ("job_id", "run-0123456789"),
        ("budget_ms", 0),
    ]
    assert b"page" not in dumps_envelope(envelope)


def test_a_string_that_is_not_utf8_still_dumps_as_one_envelope() -> None:
    # A path from a non-UTF-8 working directory or environment variable carries a lone surrogate.
    envelope = to_envelope(Result(data={"run_dir": "/srv/caf\udce9/runs"}), duration_ms=1)
    line = dumps_envelope(envelope)
    assert line.count(b"\n") == 1
    assert orjson.loads(line)["data"] == {"run_dir": "/srv/caf\\xe9/runs"}
