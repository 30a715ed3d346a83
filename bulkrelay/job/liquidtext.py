"""Liquid templates (`{liquid: "..."}` leaves) in a sandbox, through python-liquid.

Strict: an undefined variable is an error of the row, never an empty string. Sandboxed: the
environment's loader holds no template, so `{% include %}` and `{% render %}` reach no file, and
python-liquid has no tag that opens a file or a socket; loops, output and nesting are bounded, so a
template cannot make a row's value without end. A template is parsed once, when the job is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from liquid import BoundTemplate, DictLoader, Environment, StrictUndefined
from liquid.exceptions import LiquidError, TemplateNotFoundError

__all__ = ["LiquidError", "compile_liquid", "liquid_message", "render_liquid"]


class _Sandbox(Environment):
    loop_iteration_limit = 10_000
    output_stream_limit = 100_000  # characters of one leaf's text
    context_depth_limit = 30
    local_namespace_limit = 100_000


_ENVIRONMENT = _Sandbox(loader=DictLoader({}), undefined=StrictUndefined)


def compile_liquid(source: str) -> BoundTemplate:
    """The parsed template; raises `LiquidError` (its `liquid_message`) when it does not parse."""
    return _ENVIRONMENT.from_string(source)


def render_liquid(template: BoundTemplate, fields: Mapping[str, Any]) -> str:
    """The template's text for one record's fields (raises `LiquidError`)."""
    return template.render(fields)


def liquid_message(exc: LiquidError) -> str:
    """The error's first line: python-liquid adds a drawing of the source, which a problem list does not
    need (the job file's line is named already)."""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, TemplateNotFoundError):
        return f"template not found: {first} (a Liquid leaf reads no file)"
    return first
