"""Liquid templates (`{liquid: "..."}` leaves) in a sandbox, through python-liquid.

Strict: an undefined variable is an error of the row, never an empty string. Sandboxed: the
environment's loader holds no template, so `{% include %}` and `{% render %}` reach no file, and
python-liquid has no tag that opens a file or a socket. Bounded, so a template cannot make a row's
value without end, in time or in memory: python-liquid's own limits bound loops, the output, the
names a template assigns and nesting; it has none for what is made inside one expression, so a range
literal is refused beyond the loop limit (`(1..99999999999)`, which `join` would spell out) and a
filter's result beyond the value limit (`join`'s and `replace`'s before they make it). A template is
parsed once, when the job is loaded.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from liquid import BoundTemplate, Environment, Expression
    from liquid.exceptions import ResourceLimitError

__all__ = ["LiquidProblem", "compile_liquid", "render_liquid"]


class LiquidProblem(Exception):
    """A template that does not parse or a row it cannot render; the message is python-liquid's first
    line (`_message`)."""


# The turns of a leaf's loops, nested ones multiplied, and the items of a range literal.
_LOOP_TURNS = 10_000
# A leaf's text (in UTF-8 bytes), and any value a filter makes (in characters, a list's items counted too).
_VALUE_CHARACTERS = 100_000


@functools.cache
def _environment() -> Environment:
    """The sandbox, made at the first Liquid leaf: python-liquid (and Babel, which it imports) cost
    about 60 ms of every command's start-up, and most jobs have no Liquid leaf."""
    from liquid import DictLoader, Environment, StrictUndefined

    class _Sandbox(Environment):
        loop_iteration_limit = _LOOP_TURNS
        output_stream_limit = _VALUE_CHARACTERS  # bytes of one leaf's text, in UTF-8
        context_depth_limit = 30
        local_namespace_limit = 100_000  # bytes of what a template assigns, as sys.getsizeof counts them

        def setup_tags_and_filters(self, *, extra: bool = False) -> None:
            super().setup_tags_and_filters(extra=extra)
            self.filters["date"] = _dated_by_the_row(self.filters["date"])
            self.filters = {name: _bounded_filter(name, made) for name, made in self.filters.items()}

    return _Sandbox(loader=DictLoader({}), undefined=StrictUndefined)


def compile_liquid(source: str) -> BoundTemplate:
    """The parsed template; raises `LiquidProblem` when it does not parse."""
    from liquid.exceptions import LiquidError

    try:
        template = _environment().from_string(source)
    except LiquidError as exc:
        raise LiquidProblem(_message(exc)) from None
    _bound_ranges(template)
    return template


def render_liquid(template: BoundTemplate, fields: Mapping[str, Any]) -> str:
    """The template's text for one record's fields (raises `LiquidProblem`)."""
    try:
        return template.render(fields)
    except _liquid_error() as exc:  # evaluated only when an exception is raised
        raise LiquidProblem(_message(exc)) from None


def _bound_ranges(template: BoundTemplate) -> None:
    """Make every range literal of the template one that refuses more items than a loop may turn.

    python-liquid makes `(a..b)` a lazy Python range of any length, which `join` or `map` spell out
    and `contains` walks (`(1..99999999999) contains 'a'`); it bounds only the loops over one. The
    walk is the one its static analysis takes (`children`, `expressions`)."""
    from liquid import RenderContext
    from liquid.builtin.expressions.primitive import RangeLiteral

    bounded = _bounded_range()
    static = RenderContext(template)
    nodes = list(template.nodes)
    expressions: list[Expression] = []
    while nodes:
        node = nodes.pop()
        nodes.extend(node.children(static, include_partials=False))
        expressions.extend(node.expressions())
    while expressions:
        expression = expressions.pop()
        expressions.extend(expression.children())
        if type(expression) is RangeLiteral:
            expression.__class__ = bounded  # the same slots; only how it makes its range differs


@functools.cache
def _bounded_range() -> type:
    from liquid.builtin.expressions.primitive import RangeLiteral

    class _BoundedRange(RangeLiteral):
        __slots__ = ()

        def _make_range(self, start: Any, stop: Any) -> range:
            made: range = super()._make_range(start, stop)
            if made.stop - made.start > _LOOP_TURNS:
                raise _limit_error()(
                    f"range limit reached: a range of more than {_LOOP_TURNS:,} items", token=None
                )
            return made

    return _BoundedRange


def _dated_by_the_row(date: Callable[..., Any]) -> Callable[..., Any]:
    """python-liquid's `date`, made of the row alone. A value that changes from one send to the next
    changes the row's idempotency key, so a row sent again (a resume after a kill -9) would be a new
    request to the target: `'now'` and `'today'` are refused, and an epoch is read in UTC, where
    python-liquid reads it in the host's zone (a resume under another `TZ`, cron's or a terminal's,
    would send another body)."""
    from datetime import UTC, datetime

    from liquid.exceptions import FilterArgumentError

    @functools.wraps(date)  # keeps with_environment and the other marks python-liquid reads
    def dated(value: Any, *args: Any, **kwargs: Any) -> Any:
        if value in ("now", "today"):
            raise FilterArgumentError(
                f"date of {value!r}: a value is made of the row alone, never of the clock (a resumed "
                "row would be sent with another body and idempotency key); give the time as a field",
                token=None,
            )
        epoch = value if isinstance(value, int) and not isinstance(value, bool) else None
        if isinstance(value, str) and value.isdigit():
            epoch = int(value)
        if epoch is not None:
            with contextlib.suppress(OverflowError, OSError, ValueError):  # python-liquid's answer, then
                value = datetime.fromtimestamp(epoch, tz=UTC)
        return date(value, *args, **kwargs)

    return dated


def _bounded_filter(name: str, made_by: Callable[..., Any]) -> Callable[..., Any]:
    """The filter, refusing a value of more than `_VALUE_CHARACTERS` it would make: `join` and `replace`
    before they make it (a text joined by itself, or each of its characters replaced by itself, makes
    its length squared), any filter after. A value it passes on as it came (`default`) is not its own."""
    foresee = _FORESEEN.get(name)
    refusal = f"value limit reached: {name} would make a value of more than {_VALUE_CHARACTERS:,} characters"

    @functools.wraps(made_by)  # keeps with_environment and the other marks python-liquid reads
    def bounded(left: Any, *args: Any, **kwargs: Any) -> Any:
        if foresee is not None and foresee(left, *args) > _VALUE_CHARACTERS:
            raise _limit_error()(refusal, token=None)
        made = made_by(left, *args, **kwargs)
        if made is not left and _larger_than(made, _VALUE_CHARACTERS):
            raise _limit_error()(refusal, token=None)
        return made

    return bounded


def _joined_size(items: Any, separator: Any = " ", *_: Any) -> int:
    if not isinstance(items, list | tuple | range):
        return 0  # joined as python-liquid does, and measured after
    separators = max(len(items) - 1, 0) * len(str(separator))
    return separators + (_VALUE_CHARACTERS + 1 if _larger_than(items, _VALUE_CHARACTERS) else 0)


def _replaced_size(text: Any, old: Any, new: Any = "", *_: Any) -> int:
    text, old, new = str(text), str(old), str(new)
    if len(new) <= len(old):
        return 0  # no longer than the text
    found = len(text) + 1 if not old else text.count(old)
    return len(text) + found * (len(new) - len(old))


_FORESEEN: dict[str, Callable[..., int]] = {"join": _joined_size, "replace": _replaced_size}


def _larger_than(value: Any, limit: int) -> bool:
    """Whether the value holds more than `limit` characters, a list's or a mapping's items counted too
    (so a list holding one long text many times is as large as its join)."""
    if type(value) is str:
        return len(value) > limit
    left = limit
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            left -= len(item)
        elif isinstance(item, list | tuple):
            left -= len(item)
            if left >= 0:
                pending.extend(item)
        elif isinstance(item, dict):
            left -= len(item)
            if left >= 0:
                pending.extend(item.keys())
                pending.extend(item.values())
        elif isinstance(item, range):
            left -= max(item.stop - item.start, 0)
        else:
            left -= 1
        if left < 0:
            return True
    return False


@functools.cache
def _limit_error() -> type[ResourceLimitError]:
    from liquid.exceptions import ResourceLimitError

    return ResourceLimitError


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
