"""Grouped jobs (job/groups.py): the job file's rules, a group's one request, preflight's check."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent
from typing import Any

import orjson
import pytest

from bulkrelay.errors import ConfigInvalid
from bulkrelay.job.batch import batch_key
from bulkrelay.job.config import GroupConfig, JobConfig, load_job, parse_job
from bulkrelay.job.groups import GroupCheck, GroupRenderer, batch_renderer
from bulkrelay.job.preflight import run_preflight
from bulkrelay.job.records import Record
from bulkrelay.job.request import RenderError, RequestRenderer

JOB = """\
version: 1
input: { file: lines.csv, key: line_id }
request:
  method: PUT
  url: http://127.0.0.1/orders/{order_id}
  group: { by: order_id }
  idempotency_key: { header: Idempotency-Key }
  json:
    order: { from: order_id }
    customer: { from: customer }
    lines: { rows: { sku: { from: sku }, qty: { from: qty, type: integer } } }
"""


def _config(text: str = JOB) -> JobConfig:
    return parse_job(dedent(text), file="job.yaml")


def _renderer(config: JobConfig) -> GroupRenderer:
    renderer = RequestRenderer.from_config(config.request, {})
    grouped = batch_renderer(config, renderer, "f" * 64)
    assert isinstance(grouped, GroupRenderer)
    return grouped


def _record(row: int, **fields: Any) -> Record:
    return Record(row_number=row, line=row + 1, fields=fields)


def test_a_group_is_one_request_with_an_entry_a_row_and_a_key_from_its_rows() -> None:
    grouped = _renderer(_config())
    items = [
        grouped.item(_record(1, line_id="1", order_id="A", customer="ann", sku="s1", qty="1")),
        grouped.item(_record(2, line_id="2", order_id="A", customer="ann", sku="s2", qty="2")),
    ]
    request, key = grouped.request(items)
    assert request.url == "http://127.0.0.1/orders/A"
    assert orjson.loads(request.body or b"") == {
        "order": "A",
        "customer": "ann",
        "lines": [{"sku": "s1", "qty": 1}, {"sku": "s2", "qty": 2}],
    }
    assert key == batch_key([item.item_id for item in items])
    assert ("Idempotency-Key", key) in request.headers
    assert len({item.item_id for item in items}) == 2
    assert grouped.group_of(items[0].record) == grouped.group_of(items[1].record) == b'"A"'


def test_a_row_that_does_not_fit_is_named_by_its_field() -> None:
    grouped = _renderer(_config())
    with pytest.raises(RenderError) as caught:
        grouped.item_request(_record(1, line_id="1", order_id="A", customer="ann", sku="s1", qty="many"))
    assert caught.value.field == "qty"


def _problems(values: list[Any], max_rows: int = 10_000) -> list[tuple[int, str]]:
    check = GroupCheck(GroupConfig(by="order_id", max_group_rows=max_rows), "lines.csv")
    found = []
    for row, value in enumerate(values, start=1):
        fields = {} if value is ... else {"order_id": value}
        if (problem := check.add(_record(row, **fields))) is not None:
            assert (problem.row, problem.line, problem.field) == (row, row + 1, "order_id")
            found.append((row, problem.message))
    return found


def test_preflight_refuses_a_value_that_comes_back_naming_both_places() -> None:
    assert _problems(["A", "A", "B", "C", "C"]) == []
    ((row, message),) = _problems(["A", "A", "B", "A", "A"])
    assert row == 4
    assert message == (
        '"A" comes back after another group: its group was rows 1-2, and row 4 is not next to them '
        "(sort the input by order_id)"
    )


def test_values_are_told_apart_by_their_json_type() -> None:
    assert _problems(["1", 1, "1"]) != []
    assert _problems([1, "1"]) == []


def test_preflight_refuses_a_group_over_max_group_rows_once_and_a_row_without_the_field() -> None:
    problems = _problems(["A", "A", "A", "A", "B"], max_rows=2)
    assert problems == [
        (3, '"A": the group that began at row 1 has more than request.group.max_group_rows (2) rows')
    ]
    assert _problems(["A", ...]) == [(2, "missing from the record (request.group.by)")]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("  group: { by: order_id }\n", ""), "a {rows: ...} leaf needs request.group"),
        (
            ("    customer: { from: customer }\n", "    more: { rows: { sku: { from: sku } } }\n"),
            "at most one {rows: ...} leaf",
        ),
        (("  group: { by: order_id }\n", "  group: { by: order_id, max_group_rows: 0 }\n"), "greater than"),
        ((JOB, JOB + "execution: { sync: delta }\n"), "sync: delta sends the rows that changed"),
    ],
)
def test_the_job_file_rules_of_groups(change: tuple[str, str], message: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        _config(JOB.replace(*change))
    assert message in str(caught.value)


def test_a_body_key_named_like_a_leaf_kind_stays_a_key() -> None:
    config = _config(
        JOB.replace("  group: { by: order_id }\n", "").replace(
            "    lines: { rows: { sku: { from: sku }, qty: { from: qty, type: integer } } }\n",
            "    format: { value: pdf }\n    when: { at: { from: sku } }\n",
        )
    )
    renderer = RequestRenderer.from_config(config.request, {})
    body = renderer.render(_record(1, order_id="A", customer="c", sku="s")).body
    assert orjson.loads(body or b"") == {"order": "A", "customer": "c", "format": "pdf", "when": {"at": "s"}}


def test_a_group_field_no_column_has_is_a_job_file_error_at_group_by(tmp_path: Path) -> None:
    (tmp_path / "lines.csv").write_text("line_id,order,customer,sku,qty\n1,A,ann,s1,1\n")
    text = JOB.replace("{order_id}", "x").replace("order: { from: order_id }", "order: { from: order }")
    (tmp_path / "job.yaml").write_text(text)
    with pytest.raises(ConfigInvalid) as caught:
        run_preflight(load_job(tmp_path / "job.yaml"), env={})
    (problem,) = caught.value.problems
    assert (problem.path, problem.field) == ("request.group.by", "order_id")
    assert "did you mean 'order'?" in problem.message
