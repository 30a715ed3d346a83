"""Liquid templates (`{liquid: "..."}` leaves) in a sandbox, through python-liquid.

Strict: an undefined variable is an error of the row, never an empty string. Sandboxed: the
environment's loader holds no template, so `{% include %}` and `{% render %}` reach no file, and
python-liquid has no tag that opens a file or a socket; loops, output and nesting are bounded, so a
template cannot make a row's value without end. A template is parsed once, when the job is loaded.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from liquid import BoundTemplate, Environment

__all__ = ["LiquidProblem", "compile_liquid", "render_liquid"]


class LiquidProblem(Exception):
    """A template that does not parse or a row it cannot render; the message is python-liquid's first
    line (`_message`)."""


@functools.cache
def _environment() -> Environment:
    """The sandbox, made at the first Liquid leaf: python-liquid (and Babel, which it imports) cost
    about 60 ms of every command's start-up, and most jobs have no Liquid leaf."""
    from liquid import DictLoader, Environment, StrictUndefined

    class _Sandbox(Environment):
        loop_iteration_limit = 10_000
        output_stream_limit = 100_000  # characters of one leaf's text
        context_depth_limit = 30
        local_namespace_limit = 100_000

    return _Sandbox(loader=DictLoader({}), undefined=StrictUndefined)


def compile_liquid(source: str) -> BoundTemplate:
    """The parsed template; raises `LiquidProblem` when it does not parse."""
    from liquid.exceptions import LiquidError

    try:
        return _environment().from_string(source)
    except LiquidError as exc:
        raise LiquidProblem(_message(exc)) from None


def render_liquid(template: BoundTemplate, fields: Mapping[str, Any]) -> str:
    """The template's text for one record's fields (raises `LiquidProblem`)."""
    try:
        return template.render(fields)
    except _liquid_error() as exc:  # evaluated only when an exception is raised
        raise LiquidProblem(_message(exc)) from None


@functools.cache
def _liquid_error() -> type[Exception]:
    from liquid.exceptions import LiquidError

    return LiquidError


def _message(exc: Exception) -> str:
    """The error's first line: python-liquid adds a drawing of the source, which a problem list does not
    need (the job file's line is named already)."""
    from liquid.exceptions import TemplateNotFoundError

    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, TemplateNotFoundError):
        return f"template not found: {first} (a Liquid leaf reads no file)"
    return first
