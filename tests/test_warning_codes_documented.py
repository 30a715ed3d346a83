"""docs/json-output.md's table of warnings is complete: every code the package can put in `warnings` is
a row of it, no row names a code nothing emits, and a warning whose `context.reason` is an error's
code names each such reason in its row.

The codes are read from the source: every `EnvelopeWarning(...)` call's code, which must be a string
literal (a code computed elsewhere could not be checked, so it fails here instead), except where a
stored warning is made again as it was (a background job's envelope read back)."""

from __future__ import annotations

import ast
import inspect
import re
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bulkrelay.ops import launch, lifecycle

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "bulkrelay"
DOC = ROOT / "docs" / "json-output.md"
# Modules that rebuild warnings from their stored dicts: the codes are those that were stored.
_RESTORED = {"background/reach.py"}
_ROW = re.compile(r"^\| `([A-Z][A-Z0-9_]+)` \|(.*)$", re.MULTILINE)


def _called(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None


def _code_argument(call: ast.Call) -> ast.expr:
    if call.args:
        return call.args[0]
    return next(keyword.value for keyword in call.keywords if keyword.arg == "code")


def _emitted() -> dict[str, str]:
    """Each warning code the package emits, with where (module:line) it is first made."""
    codes: dict[str, str] = {}
    computed: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and _called(node.func) == "EnvelopeWarning"):
                continue
            code = _code_argument(node)
            if isinstance(code, ast.Constant) and isinstance(code.value, str):
                codes.setdefault(code.value, f"{module}:{node.lineno}")
            elif module not in _RESTORED:
                computed.append(f"{module}:{node.lineno}")
    assert not computed, f"warnings whose code is not a string literal (give them one): {computed}"
    return codes


def _documented() -> dict[str, str]:
    """The table under `## Warnings`: each code with the rest of its row."""
    text = DOC.read_text()
    section = text[text.index("\n## Warnings\n") :]
    rows = dict(_ROW.findall(section))
    assert rows, "docs/json-output.md has no table of warnings"
    return rows


def test_every_warning_code_the_code_emits_is_in_the_docs_table_and_no_other() -> None:
    emitted, documented = _emitted(), _documented()
    assert len(emitted) >= 17  # the scan found the warnings (it would pass vacuously otherwise)
    missing = {code: where for code, where in emitted.items() if code not in documented}
    assert not missing, f"warnings missing from docs/json-output.md's table: {missing}"
    assert not set(documented) - set(emitted), "the table lists codes nothing emits"


def _error_codes(classes: Any) -> set[str]:
    """The `code` of each error class in a type annotation (a union) or an `except` tuple."""
    members = typing.get_args(classes) if isinstance(classes, types.UnionType) else classes
    return {member.code for member in members}


def _caught_in(function: Callable[..., Any]) -> set[str]:
    """The codes of the errors `function` catches."""
    caught: set[str] = set()
    for node in ast.walk(ast.parse(inspect.getsource(function).lstrip())):
        if isinstance(node, ast.ExceptHandler) and isinstance(node.type, ast.Tuple | ast.Name):
            names = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            module = inspect.getmodule(function)
            caught |= _error_codes([getattr(module, name.id) for name in names if isinstance(name, ast.Name)])
    return caught


def test_each_reason_a_warning_carries_is_named_in_its_row() -> None:
    """`CHECKPOINT_DISCARDED`'s reason is the code of the refusal it overrode; `SYNC_STATE_BEHIND`'s
    the code of the state's error it caught. Before, RUN_SUPERSEDED was not in the list."""
    reasons = {
        "CHECKPOINT_DISCARDED": _error_codes(typing.get_type_hints(launch._discarded)["changed"]),
        "SYNC_STATE_BEHIND": _caught_in(lifecycle._record_deliveries),
    }
    assert reasons["CHECKPOINT_DISCARDED"] >= {"INPUT_CHANGED", "CONFIG_CHANGED", "RUN_SUPERSEDED"}
    documented = _documented()
    for code, codes in reasons.items():
        unnamed = {reason for reason in codes if f"`{reason}`" not in documented[code]}
        assert not unnamed, f"{code}'s row in docs/json-output.md does not name its reasons {unnamed}"
