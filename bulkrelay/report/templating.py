"""The Jinja2 environment the report pages are made with: templates in `report/templates/`, autoescaped.

Every value a template writes passes `finalize` first: a string from the run (a key, an error, a body, a
path) has its control and bidi formatting characters shown as escapes (`safetext.visible`), then
autoescaping makes it text. The `isolated` filter also wraps a value in `<bdi>`, so right-to-left text in
it cannot reorder its neighbours. No page is assembled from strings outside a template.
"""

from __future__ import annotations

import functools
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from bulkrelay.report import words
from bulkrelay.safetext import visible


def _finalize(value: Any) -> Any:
    if isinstance(value, str) and not isinstance(value, Markup):
        return visible(value)
    return value


def isolated(value: object) -> Markup:
    """The value as text in a `<bdi>` element: escaped (Markup's `%` escapes), controls shown."""
    return Markup("<bdi>%s</bdi>") % visible(str(value))


@functools.cache
def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("bulkrelay.report", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        finalize=_finalize,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        isolated=isolated,
        duration=words.duration,
        clock=words.clock,
        when=words.when,
        ms=words.ms,
        count=words.count,
        value=words.value,
        label=words.label,
    )
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)
