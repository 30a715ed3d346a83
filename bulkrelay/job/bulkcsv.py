"""A bulk job's CSV (`request.bulk_job`, docs/bulk-jobs.md): the header, each row's line, each row's key.

Built once per job. Each column is one `{from: ...}` or `{value: ...}` leaf, rendered as a request.json
leaf is, then written as CSV text (RFC 4180: a value holding a comma, quote, CR or LF is quoted, its
quotes doubled; null is empty; booleans `true`/`false`). The key column is the one that reads
`input.key`: results come back in an order of the target's own and are matched to rows by its text,
so every row's key cell must be non-empty (refused in preflight otherwise).

A generic job whose upload says `format: json` sends its rows as JSON instead: each row the object
`{column: value}` (the leaves' values as they are, typed), the job's body their list, put at the upload's
`rows_at` in its `json` (or the body itself). A column named by a JSON pointer (`/attributes/email`) puts
its value there in the row's object, the objects on the way made (`{"attributes": {"email": ...}}`); a
`when_missing: omit` value leaves its key out, as in `request.json`. A job of flat names renders exactly
as before them (its delta digests unchanged). `body` and `content_type` make either kind of upload.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import orjson

from bulkrelay.errors import ConfigInvalid, Problem
from bulkrelay.job.config import BulkJobConfig, JobConfig, JsonField, column_path
from bulkrelay.job.records import PreparedRequest, Record
from bulkrelay.job.request import RenderError, value_getter
from bulkrelay.job.values import OMIT

__all__ = ["BulkCsv", "csv_cell"]

_NEEDS_QUOTES = frozenset(',"\r\n')
_ROWS_MARK = "\u0000bulkrelay rows\u0000"  # where the rows go in a JSON upload's template


def csv_cell(name: str, value: Any) -> str:
    """A value as one CSV cell's text; RenderError for an object or a list (no CSV column holds one)."""
    if value is None:
        return ""
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        raise RenderError(
            name, f"is a JSON {type(value).__name__}: a CSV column holds text, numbers or booleans"
        )
    text = value if isinstance(value, str) else str(value)
    if _NEEDS_QUOTES.isdisjoint(text):
        return text
    return '"' + text.replace('"', '""') + '"'


class BulkCsv:
    """Renders rows into a bulk job's CSV lines, for one job."""

    def __init__(self, config: BulkJobConfig, key_field: str) -> None:
        self.config = config
        self.columns = tuple(config.columns)
        self._getters = tuple((name, value_getter(leaf)) for name, leaf in config.columns.items())
        keyed = [name for name, leaf in config.columns.items() if _reads(leaf, key_field)]
        if not keyed:
            raise ConfigInvalid(
                [
                    Problem(
                        f"request.bulk_job.columns has no column that reads the key {{from: {key_field}}}: "
                        "results are matched to rows by it",
                        path="request.bulk_job.columns",
                    )
                ]
            )
        self.key_column = keyed[0]
        self._key_index = self.columns.index(self.key_column)
        self.newline = b"\r\n" if config.line_ending == "CRLF" else b"\n"
        self.header = ",".join(csv_cell(name, name) for name in self.columns).encode() + self.newline
        upload = config.steps.upload if config.steps is not None else None
        self.json_rows = upload is not None and upload.format == "json"
        self.content_type = "application/json" if self.json_rows else "text/csv"
        if upload is not None and self.json_rows:
            self._opening, self._closing = _json_frame(upload.json_, upload.rows_at)
            self.header = self._opening + self._closing  # what a job's body holds but its rows
        # where each column's value goes in a JSON row; None: every name flat (the rows as before them)
        nested = any(name.startswith("/") for name in self.columns)
        self._paths = tuple(column_path(name) for name in self.columns) if nested else None
        if nested and self.key_column.startswith("/") and config.steps is not None:
            _json_results_only(config, self.key_column)
        self._url = config.base_url
        self.key_field = key_field
        self._key_getter = self._getters[self._key_index][1]

    @classmethod
    def of_job(cls, config: JobConfig) -> BulkCsv | None:
        """The job's CSV renderer; None when the job sends no bulk jobs."""
        job = config.request.bulk_job
        if job is None or config.input.key is None:
            return None
        return cls(job, config.input.key)

    def line(self, record: Record) -> tuple[str, bytes]:
        """The row's key text and its CSV line (newline included), or with `format: json` its object and
        a comma; RenderError naming the column."""
        if self.json_rows:
            values = {name: get(record.fields) for name, get in self._getters}
            key = self._key_text_of(values[self.key_column])
            if not key:
                raise RenderError(self.key_column, "is empty: each row's result is matched by its key column")
            try:
                return key, orjson.dumps(self._row_object(values)) + b","
            except TypeError as exc:  # a value no JSON holds: named by its column
                column = next(
                    (name for name, value in values.items() if not _json_able(value)), self.key_column
                )
                raise RenderError(column, f"cannot be sent as JSON: {exc}") from None
        cells = [csv_cell(name, get(record.fields)) for name, get in self._getters]
        key = cells[self._key_index]
        if key.startswith('"'):  # matched against the results' parsed cells: the text, unquoted
            key = key[1:-1].replace('""', '"')
        if not key:
            raise RenderError(self.key_column, "is empty: each row's result is matched by its key column")
        return key, ",".join(cells).encode() + self.newline

    def _row_object(self, values: dict[str, Any]) -> dict[str, Any]:
        """A JSON row: the columns' values by name, or nested where names are pointers (config.py refuses
        two columns at one place, or one inside another's value, so every step on the way is an object
        made here); a `when_missing: omit` value's key left out."""
        if self._paths is None:
            return {name: value for name, value in values.items() if value is not OMIT}
        row: dict[str, Any] = {}
        for path, value in zip(self._paths, values.values(), strict=True):
            if value is OMIT:
                continue
            place = row
            for token in path[:-1]:
                place = place.setdefault(token, {})
            place[path[-1]] = value
        return row

    def key_text(self, key: Any) -> str:
        """The key column's text for a row whose `input.key` is `key` (what the results name it by)."""
        return self._key_text_of(self._key_getter({self.key_field: key}))

    def _key_text_of(self, value: Any) -> str:
        cell = csv_cell(self.key_column, value)
        return cell[1:-1].replace('""', '"') if cell.startswith('"') else cell

    def body(self, lines: Sequence[bytes]) -> bytes:
        """A job's upload: the CSV header and the rows' lines, or the JSON document holding their list."""
        if not self.json_rows:
            return self.header + b"".join(lines)
        return self._opening + b"".join(lines)[:-1] + self._closing  # the last row's comma dropped

    def item_request(self, record: Record) -> PreparedRequest:
        """The row's part of a job as preflight checks it and a delta sync digests it: its CSV line,
        refused when with the header alone it would cross max_bytes."""
        line = self.line(record)[1]
        if len(self.header) + len(line) > self.config.max_bytes:
            raise RenderError(
                self.key_column,
                f"makes a CSV line of {len(line)} bytes: with the header over request.bulk_job.max_bytes "
                f"{self.config.max_bytes}",
            )
        return PreparedRequest("PUT", self._url, (("Content-Type", self.content_type),), line)


def _json_frame(template: dict[str, Any] | None, rows_at: str | None) -> tuple[bytes, bytes]:
    """The bytes of a JSON upload before and after its rows' list: `template` with the list at
    `rows_at` (made where the template has no such key), or the bare list."""
    if rows_at is None:
        return b"[", b"]"
    document = copy.deepcopy(template) if template is not None else {}
    place = document
    tokens = [token.replace("~1", "/").replace("~0", "~") for token in rows_at[1:].split("/")]
    for token in tokens[:-1]:
        place = place.setdefault(token, {})
        if not isinstance(place, dict):
            raise ConfigInvalid([Problem(f"rows_at {rows_at} goes through a value that is no object",
                                         path="request.bulk_job.steps.upload.rows_at")])  # fmt: skip
    place[tokens[-1]] = _ROWS_MARK
    opening, _, closing = orjson.dumps(document).partition(orjson.dumps(_ROWS_MARK))
    return opening + b"[", b"]" + closing


def _json_results_only(config: BulkJobConfig, key_column: str) -> None:
    """A key column named by a pointer is no CSV header: its results are read as JSON."""
    assert config.steps is not None
    if any(step.format != "json" for step in config.steps.results):
        raise ConfigInvalid(
            [
                Problem(
                    f"the key column {key_column} is a JSON pointer: each result set names its rows in JSON"
                    " (format: json, the key at `key`), never by a CSV column",
                    path="request.bulk_job.steps.results",
                )
            ]
        )


def _json_able(value: Any) -> bool:
    try:
        orjson.dumps(value)
    except TypeError:
        return False
    return True


def _reads(leaf: Any, key_field: str) -> bool:
    return isinstance(leaf, JsonField) and leaf.from_ == key_field
