"""Leaves beyond a field copy through the real CLI (issue 42): a hostile input is refused by `validate`
naming each bad row, the corrected input's requests are byte for byte what this test computes on its
own (stdlib only), and a PATCH run with `nulls: omit` never sends a null, as the target saw it."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import orjson
import pytest

from bulkrelay.errors import ExitCode
from tests.clirun import run_cli
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

ROWS = 7_000
JOB = """\
version: 1
name: values-hostile
input: { file: customers.jsonl, key: id }
request:
  method: PATCH
  url: "TARGET/customers/{id}"
  nulls: omit
  json:
    name: { format: "{first_name} {last_name}" }
    email: { from: email, transform: [trim, lower] }
    email_sha256: { from: email, transform: [trim, lower, sha256] }
    phone: { coalesce: [ { from: mobile }, { from: phone } ] }
    signup_ms: { from: created_at, type: datetime, in_format: "%Y-%m-%d %H:%M:%S", to: epoch_ms,
                 timezone: Europe/Paris }
    seen: { from: seen_at, type: datetime, timezone: Asia/Tokyo, to: date }
    born: { from: born_ms, type: datetime, in_format: epoch_ms }
    tier: { when: { field: spend, above: 1000 }, then: { value: gold }, else: { value: standard } }
    balance: { from: balance, type: decimal, nulls: fail }
    notes: { from: notes }
    label: { liquid: "{{ first_name | capitalize }} ({{ city }})" }
"""
NAMES = ("ada", "Ωmega", "مريم", "李小龙")  # Greek, Arabic (right to left), Chinese


def _row(n: int) -> dict[str, Any]:
    return {
        "id": n,
        "first_name": NAMES[n % 4],
        "last_name": "\u200flee\u200f" if n % 7 == 0 else "Lee",  # RTL marks kept as they are
        "email": None if n % 11 == 0 else ("" if n % 13 == 0 else f"  User{n}@Example.COM "),
        "mobile": "" if n % 3 else f"+33 6{n:08d}",
        "phone": None if n % 5 == 0 else f"555-{n}",
        "created_at": f"2024-{n % 12 + 1:02d}-{n % 28 + 1:02d} {n % 24:02d}:30:00",
        "seen_at": f"2024-03-{n % 28 + 1:02d}T{n % 24:02d}:00:00+01:00",
        "born_ms": 86_400_000 * n + n,
        "spend": str(n % 2000),
        "balance": f"{n}.{n % 100:02d}0",
        "notes": None if n % 2 else f"note {n}: שלום",
        "city": "Paris",
    }


# row -> (what breaks it, the field blamed, words of the message)
BAD: dict[int, tuple[dict[str, Any], str, str]] = {
    5: ({"created_at": "2024-02-30 10:00:00"}, "created_at", "'2024-02-30 10:00:00' is not a date and time"),
    9: ({"first_name": ...}, "first_name", "missing from the record"),
    12: ({"balance": None}, "balance", "is null (nulls: fail)"),
    20: ({"balance": "12,50"}, "balance", "'12,50' is not a decimal number"),
    33: ({"spend": "lots"}, "spend", "'lots' is not a number (when: above)"),
    ROWS: ({"city": ...}, "label", "'city' is undefined"),  # a Liquid leaf: its place in the body
}


def _write(tmp_path: Path, rows: list[dict[str, Any]], url: str = "http://127.0.0.1:9") -> Path:
    (tmp_path / "customers.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    job = tmp_path / "job.yaml"
    job.write_text(JOB.replace("TARGET", url))
    return job


def _hostile() -> list[dict[str, Any]]:
    rows = [_row(n) for n in range(1, ROWS + 1)]
    for n, (change, _, _) in BAD.items():
        for key, value in change.items():
            if value is ...:
                del rows[n - 1][key]
            else:
                rows[n - 1][key] = value
    return rows


def test_validate_names_each_bad_row_and_the_corrected_input_renders_what_the_test_computes(
    tmp_path: Path,
) -> None:
    job = _write(tmp_path, _hostile())
    refused = run_cli("validate", job, cwd=tmp_path)
    assert refused.exit_code == ExitCode.ARG_ERROR, refused.envelope
    problems = refused.envelope["error"]["context"]["problems"]
    found = {(p["row"], p["line"], p["field"]) for p in problems}
    assert found == {(n, n, field) for n, (_, field, _) in BAD.items()}
    for problem in problems:
        assert BAD[problem["row"]][2] in problem["message"], problem

    rows = [_row(n) for n in range(1, ROWS + 1)]
    _write(tmp_path, rows)
    assert run_cli("validate", job, cwd=tmp_path).exit_code == ExitCode.SUCCESS
    shown = run_cli("render", job, "--rows", f"1-{ROWS}", cwd=tmp_path, timeout=300)
    assert shown.exit_code == ExitCode.SUCCESS, shown.envelope
    requests = shown.data["requests"]
    assert len(requests) == ROWS
    for row, request in zip(rows, requests, strict=True):
        assert request["body"] == _expected_body(row), row["id"]


def _expected_body(row: dict[str, Any]) -> str:
    """The body, computed without BulkRelay: stdlib json, hashlib, datetime and zoneinfo."""
    body: dict[str, Any] = {"name": f"{row['first_name']} {row['last_name']}"}
    if row["email"] is not None:
        email = row["email"].strip().lower()
        body["email"] = email
        body["email_sha256"] = hashlib.sha256(email.encode()).hexdigest()
    phone = row["mobile"] or row["phone"]
    if phone:
        body["phone"] = phone
    created = datetime.strptime(row["created_at"], "%Y-%m-%d %H:%M:%S").replace(
        tzinfo=ZoneInfo("Europe/Paris")
    )
    body["signup_ms"] = int(created.timestamp()) * 1000
    body["seen"] = (
        datetime.fromisoformat(row["seen_at"]).astimezone(ZoneInfo("Asia/Tokyo")).date().isoformat()
    )
    body["born"] = (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=row["born_ms"])).isoformat()
    body["tier"] = "gold" if int(row["spend"]) > 1000 else "standard"
    body["balance"] = "\0BALANCE\0"
    if row["notes"] is not None:
        body["notes"] = row["notes"]
    body["label"] = f"{row['first_name'][:1].upper()}{row['first_name'][1:].lower()} ({row['city']})"
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return text.replace('"\\u0000BALANCE\\u0000"', row["balance"])  # the decimal's digits, as written


def test_a_patch_with_nulls_omit_never_sends_a_null(tmp_path: Path) -> None:
    rows = [_row(n) for n in range(1, 61)]
    with TargetProcess() as target:
        job = _write(tmp_path, rows, target.url)
        result = run_cli("run", job, "--budget", "0", cwd=tmp_path)
        assert result.exit_code == ExitCode.SUCCESS, result.envelope
        received = target.requests()
    assert sorted(r["path"] for r in received) == sorted(f"/customers/{n}" for n in range(1, 61))
    for request in received:
        assert request["method"] == "PATCH"
        body = orjson.loads(request["body"])
        assert None not in body.values(), body
        row = rows[int(request["path"].rsplit("/", 1)[1]) - 1]
        assert ("notes" in body, "email" in body) == (row["notes"] is not None, row["email"] is not None)


def test_the_values_example_validates_and_renders_each_leaf() -> None:
    job = Path(__file__).resolve().parents[2] / "examples" / "values" / "job.yaml"
    checked = run_cli("validate", job)
    assert checked.exit_code == ExitCode.SUCCESS, checked.envelope
    assert checked.data["record_count"] == 10
    shown = run_cli("render", job, "--rows", "1-10")
    assert shown.exit_code == ExitCode.SUCCESS, shown.envelope
    bodies = [request["body"] for request in shown.data["requests"]]
    first = orjson.loads(bodies[0])
    assert first["email"] == "ada1@example.com"
    assert first["email_sha256"] == hashlib.sha256(b"ada1@example.com").hexdigest()
    assert (first["signup_ms"], first["last_seen"]) == (1705278600000, "2024-11-01T14:45:00-04:00")
    assert (first["tier"], first["notes"], first["label"]) == ("standard", None, "Ada from London")
    assert '"balance":7.010,' in bodies[0]  # the decimal's digits, as written
    assert "email" not in orjson.loads(bodies[3])  # a null email, omitted
    assert orjson.loads(bodies[4])["address"] == {}  # every key omitted: the object stays


def test_the_grouped_example_renders_one_request_per_order() -> None:
    job = Path(__file__).resolve().parents[2] / "examples" / "values" / "orders.yaml"
    assert run_cli("validate", job).exit_code == ExitCode.SUCCESS
    shown = run_cli("render", job, "--rows", "1-7")
    assert shown.exit_code == ExitCode.SUCCESS, shown.envelope
    requests = shown.data["requests"]
    assert [request["batch"]["rows"] for request in requests] == [[1, 2], [3], [4, 5, 6], [7]]
    assert requests[0]["url"].endswith("/v1/orders/O-1001")
    assert '"lines":[{"sku":"ABC-1","qty":2,"unit_price":19.90},{"sku":"ABC-2",' in requests[0]["body"]


def test_validate_names_a_group_too_large_and_a_value_that_comes_back(tmp_path: Path) -> None:
    rows = [{"line": n, "order": "A", "sku": f"s{n}"} for n in range(1, 10_002)]  # one row too many
    rows += [{"line": 10_002, "order": "B", "sku": "b"}, {"line": 10_003, "order": "A", "sku": "late"}]
    (tmp_path / "lines.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    job = tmp_path / "job.yaml"
    job.write_text(
        "version: 1\ninput: { file: lines.jsonl, key: line }\nrequest:\n  method: PUT\n"
        '  url: "http://127.0.0.1:9/orders/{order}"\n  group: { by: order }\n'
        "  json: { order: { from: order }, lines: { rows: { sku: { from: sku } } } }\n"
    )
    refused = run_cli("validate", job, cwd=tmp_path)
    assert refused.exit_code == ExitCode.ARG_ERROR, refused.envelope
    problems = refused.envelope["error"]["context"]["problems"]
    assert [(p["row"], p["field"]) for p in problems] == [(10_001, "order"), (10_003, "order")]
    assert "more than request.group.max_group_rows (10000) rows" in problems[0]["message"]
    assert "its group was rows 1-10001, and row 10003 is not next to them" in problems[1]["message"]
