"""`request.bulk_job` as the job file gives it: refused when it cannot work, and each row's CSV line,
with preflight refusing a row whose key cell is empty or whose value no CSV cell holds."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from bulkrelay.errors import ConfigInvalid, InputInvalid
from bulkrelay.job.bulkcsv import BulkCsv, csv_cell
from bulkrelay.job.config import load_job
from bulkrelay.job.preflight import run_preflight
from bulkrelay.job.records import Record
from bulkrelay.job.request import RenderError
from tests.relay.bulkrun import GENERIC_STEPS, bulk_job_spec


def _job(tmp_path: Path, spec: dict[str, Any], rows: str = "id,email\nk1,a@x\n") -> Path:
    (tmp_path / "rows.csv").write_text(rows)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda s: s["request"]["bulk_job"].pop("external_id_field"),
            "external_id_field goes with operation",
        ),
        (lambda s: s["request"]["bulk_job"]["columns"].pop("External_Id__c"), "must hold the external id"),
        (lambda s: s["input"].pop("key"), "needs input.key"),
        (
            lambda s: s.update(
                execution={"sync": "mirror"}, mirror={"url": "http://h/{id}", "max_deletes": 1}
            ),
            "execution.sync: full or delta (mirror: not yet)",
        ),
        (lambda s: s["request"]["bulk_job"].update(kind="mailchimp"), "kind"),
        (lambda s: s["request"]["bulk_job"]["poll"].update(max_wait="soon"), "is not a duration"),
        (lambda s: s["request"]["bulk_job"].pop("object"), "object is required with kind: salesforce_bulk2"),
        (lambda s: s["request"]["bulk_job"].update(kind="generic"), "steps goes with kind: generic"),
        (lambda s: s["request"]["bulk_job"].update(steps=GENERIC_STEPS), "steps goes with kind: generic"),
        (
            lambda s: s["request"]["bulk_job"].update(
                kind="named_import", operation="delete", external_id_field=None
            ),
            "a named_import creates, updates or upserts",
        ),
    ],
)
def test_a_bulk_job_that_cannot_work_is_refused_when_loaded(
    tmp_path: Path, change: Any, message: str
) -> None:
    spec = bulk_job_spec("http://127.0.0.1:9")
    change(spec)
    with pytest.raises(ConfigInvalid) as refused:
        load_job(_job(tmp_path, spec))
    assert message in str(refused.value.problems)


def test_columns_without_the_key_are_refused(tmp_path: Path) -> None:
    spec = bulk_job_spec("http://127.0.0.1:9", operation="insert")
    del spec["request"]["bulk_job"]["external_id_field"]
    spec["request"]["bulk_job"]["columns"] = {"Email": {"from": "email"}}
    with pytest.raises(ConfigInvalid, match="no column that reads the key"):
        run_preflight(load_job(_job(tmp_path, spec)), None, env={"SF_TOKEN": "sf-token-1"})


def test_preflight_renders_every_row_and_names_the_bad_ones(tmp_path: Path) -> None:
    spec = bulk_job_spec("http://127.0.0.1:9")
    spec["input"]["file"] = "rows.jsonl"
    (tmp_path / "rows.jsonl").write_text(
        '{"id":"k1","email":"a@x"}\n{"id":"","email":"b@x"}\n{"id":"k3","email":{"a":1}}\n'
    )
    with pytest.raises(InputInvalid) as refused:
        run_preflight(load_job(_job(tmp_path, spec)), None, env={"SF_TOKEN": "sf-token-1"})
    problems = {(p.row, p.field): p.message for p in refused.value.problems}
    assert {(2, "External_Id__c"), (3, "Email")} <= set(problems)  # (and input.key's own check of row 2)
    assert "is empty" in problems[2, "External_Id__c"] and "JSON dict" in problems[3, "Email"]


def test_a_rows_line_is_csv_and_its_key_the_cells_text(tmp_path: Path) -> None:
    preflight = run_preflight(
        load_job(_job(tmp_path, bulk_job_spec("http://127.0.0.1:9"))), None, env={"SF_TOKEN": "sf-token-1"}
    )
    bulk = preflight.bulk
    assert bulk is not None and bulk.header == b"External_Id__c,Email\n"
    key, line = bulk.line(Record(1, 2, {"id": 'a,"b"', "email": "x\ny"}))
    assert (key, line) == ('a,"b"', b'"a,""b""","x\ny"\n')
    assert bulk.key_text('a,"b"') == key
    assert [csv_cell("c", v) for v in (None, True, 3, 1.5, "plain")] == ["", "true", "3", "1.5", "plain"]


def _row_digest(tmp_path: Path, change: Any) -> bytes:
    """The delta digest of rows.csv's one row, under the bulk job `change` makes of the usual one."""
    spec = bulk_job_spec("http://127.0.0.1:9")
    spec["execution"] = {"sync": "delta"}
    change(spec["request"]["bulk_job"])
    preflight = run_preflight(load_job(_job(tmp_path, spec)), None, env={"SF_TOKEN": "sf-token-1"})
    assert preflight.bulk is not None and preflight.digester is not None
    record = Record(1, 2, {"id": "k1", "email": "a@x"})
    return preflight.digester.digest(preflight.bulk.item_request(record), record.fields)


def test_a_delta_rows_digest_is_its_csv_line_under_what_the_job_means_not_its_sizes(tmp_path: Path) -> None:
    usual = _row_digest(tmp_path, lambda bulk: None)
    for unchanged in (lambda b: b.update(max_rows=2), lambda b: b["poll"].update(max_seconds=5)):
        assert _row_digest(tmp_path, unchanged) == usual
    renamed = {"External_Id__c": {"from": "id"}, "Email__c": {"from": "email"}}
    for changed in (
        lambda b: b.update(columns=renamed),  # the same cells, another field
        lambda b: b.update(object="Lead"),
        lambda b: b.update(operation="insert", external_id_field=None),
    ):
        assert _row_digest(tmp_path, changed) != usual


def test_a_json_row_whose_value_no_json_holds_is_refused_naming_its_column(tmp_path: Path) -> None:
    spec = bulk_job_spec("http://127.0.0.1:9", kind="generic", object="-", operation="insert")
    del spec["request"]["bulk_job"]["external_id_field"]
    upload = {**GENERIC_STEPS["upload"], "format": "json"}
    spec["request"]["bulk_job"]["steps"] = {**GENERIC_STEPS, "upload": upload}
    bulk = BulkCsv.of_job(load_job(_job(tmp_path, spec)).config)
    assert bulk is not None
    assert bulk.line(Record(1, 2, {"id": "k1", "email": "a@x"})) == (
        "k1",
        b'{"External_Id__c":"k1","Email":"a@x"},',
    )
    with pytest.raises(RenderError) as refused:
        bulk.line(Record(1, 2, {"id": "k1", "email": Decimal("1.5")}))  # a numeric from a database
    assert refused.value.field == "Email" and "cannot be sent as JSON" in str(refused.value)
