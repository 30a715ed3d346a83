"""The public alpha's spellings of the job file, read as their version 1 equivalents.

The alpha (SerDrozd/bulkrelay) accepted two things version 1 spells differently:

    request.method absent        the alpha's only method, POST          → `method: POST`
    {from_column: FIELD}         its Python name for `from`, accepted   → `{from: FIELD}`

Each is rewritten before validation, so the model and the semantic fingerprint are exactly those of
the new spelling, and reported as a deprecation naming what to write. A spelling that cannot be read
unambiguously (both `from` and `from_column`) is refused with the line to write instead.
"""

from __future__ import annotations

from typing import Any

from bulkrelay.errors import ConfigInvalid, Problem
from bulkrelay.job.yamlload import LineMap, format_path
from bulkrelay.job.yamlload import Path as YamlPath


def upgrade_alpha_spellings(
    raw: dict[str, Any], lines: LineMap, file: str
) -> tuple[dict[str, Any], list[Problem]]:
    """`raw` with the alpha's spellings replaced by version 1's, and one deprecation per replacement."""
    request = raw.get("request")
    if not isinstance(request, dict):
        return raw, []
    notes: list[Problem] = []
    upgraded = dict(request)
    if "method" not in upgraded and "bulk_job" not in upgraded:  # a bulk job names its own methods
        upgraded["method"] = "POST"
        notes.append(
            _note(
                "request.method is missing; the alpha's default POST is used (write `method: POST`)",
                ("request",),
                lines,
                file,
            )
        )
    if "json" in upgraded:
        upgraded["json"] = _upgrade_json(upgraded["json"], ("request", "json"), lines, file, notes)
    return {**raw, "request": upgraded}, notes


def _upgrade_json(node: Any, path: YamlPath, lines: LineMap, file: str, notes: list[Problem]) -> Any:
    """Walk the json body tree; a mapping whose `from_column` names a field is a `from` leaf."""
    if not isinstance(node, dict) or set(node) == {"value"}:
        return node  # not a mapping, or a `value` leaf, whose literal is never rewritten
    if isinstance(node.get("from_column"), str):
        where = (*path, "from_column")
        if "from" in node:
            raise ConfigInvalid(
                [
                    Problem(
                        f"both `from` and the alpha's `from_column` are given; write only "
                        f"`from: {node['from']}`",
                        file=file,
                        line=lines.line(where),
                        path=format_path(where),
                    )
                ]
            )
        column = node["from_column"]
        notes.append(
            _note(f"`from_column` is the alpha's spelling; write `from: {column}`", where, lines, file)
        )
        return {("from" if key == "from_column" else key): value for key, value in node.items()}
    if isinstance(node.get("from"), str):
        return node  # a version 1 `from` leaf
    return {key: _upgrade_json(value, (*path, key), lines, file, notes) for key, value in node.items()}


def _note(message: str, path: YamlPath, lines: LineMap, file: str) -> Problem:
    return Problem(message, file=file, line=lines.line(path), path=format_path(path))
