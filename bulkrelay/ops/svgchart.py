"""Small SVG charts drawn by our own code: axes, bars, stacked bars, step lines and markers.

The run report embeds them inline, so the page needs no script and fetches nothing: no library,
no font, no image. Every text is escaped here; colours come from the page's own style sheet, by
class name. A chart is a fixed-size `viewBox` that the page scales to its width.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 1000, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 28, 40


@dataclass(frozen=True)
class Frame:
    """The plot area and its two scales: x from `x0` to `x1`, y from 0 to `y1`."""

    x0: float
    x1: float
    y1: float
    width: int = WIDTH
    height: int = HEIGHT

    def x(self, value: float) -> float:
        span = (self.x1 - self.x0) or 1.0
        return round(LEFT + (value - self.x0) / span * (self.width - LEFT - RIGHT), 2)

    def y(self, value: float) -> float:
        top = self.y1 or 1.0
        return round(self.height - BOTTOM - min(value, top) / top * (self.height - TOP - BOTTOM), 2)

    @property
    def floor(self) -> float:
        return self.height - BOTTOM


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above `value` (the y axis's top)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * power:
            return float(step * power)
    return float(10 * power)


def y_axis(frame: Frame, unit: str = "") -> str:
    parts = []
    for i in range(5):
        value = frame.y1 * i / 4
        y = frame.y(value)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{frame.width - RIGHT}" y1="{y}" y2="{y}"/>')
        parts.append(f'<text class="tick" x="{LEFT - 6}" y="{y + 4}" text-anchor="end">{_num(value)}</text>')
    if unit:
        parts.append(f'<text class="unit" x="4" y="14">{escape(unit)}</text>')
    return "".join(parts)


def x_labels(frame: Frame, ticks: Iterable[tuple[float, str]]) -> str:
    parts = [
        f'<line class="axis" x1="{LEFT}" x2="{frame.width - RIGHT}" y1="{frame.floor}" y2="{frame.floor}"/>'
    ]
    for value, label in ticks:
        x = frame.x(value)
        parts.append(f'<line class="axis" x1="{x}" x2="{x}" y1="{frame.floor}" y2="{frame.floor + 4}"/>')
        parts.append(
            f'<text class="tick" x="{x}" y="{frame.floor + 18}" text-anchor="middle">{escape(label)}</text>'
        )
    return "".join(parts)


Box = tuple[float, float, float, float]  # x0, x1, y0, y1 in data units


def bar(frame: Frame, box: Box, css: str, title: str = "") -> str:
    """A rectangle from (x0, y0) to (x1, y1) in data units; at least one pixel wide."""
    x0, x1, y0, y1 = box
    left, right = frame.x(x0), frame.x(x1)
    top, bottom = frame.y(y1), frame.y(y0)
    width = max(right - left, 1.0)
    tip = f"<title>{escape(title)}</title>" if title else ""
    return (
        f'<rect class="{css}" x="{left}" y="{top}" width="{round(width, 2)}" '
        f'height="{round(max(bottom - top, 0.0), 2)}">{tip}</rect>'
    )


def stacked(frame: Frame, x0: float, x1: float, layers: Sequence[tuple[float, str]], title: str) -> str:
    """Bars stacked bottom up, one per (height, class)."""
    parts, base = [], 0.0
    for height, css in layers:
        if height > 0:
            parts.append(bar(frame, (x0, x1, base, base + height), css, title))
            base += height
    return "".join(parts)


def step_line(
    frame: Frame, points: Sequence[tuple[float, float, float | None]], css: str, gap: float = 0.25
) -> str:
    """A line holding each (x0, x1, y) level over its stretch; None, or a stretch starting more than
    `gap` after the last one ended (nothing was measured between), breaks the line."""
    paths, current, last_end = [], "", None
    for x0, x1, y in points:
        broken = last_end is not None and x0 - last_end > gap
        last_end = x1
        if y is None or broken:
            if current:
                paths.append(current)
            current = ""
        if y is None:
            continue
        segment = f"{frame.x(x0)},{frame.y(y)} {frame.x(x1)},{frame.y(y)}"
        current = f"{current} {segment}" if current else segment
    if current:
        paths.append(current)
    return "".join(f'<polyline class="{css}" points="{path}"/>' for path in paths)


def marker(frame: Frame, at: float, css: str, title: str, width: float = 0.0) -> str:
    """A vertical line at `at` (a band `width` wide in data units when given), titled."""
    x = frame.x(at)
    band = ""
    if width > 0:
        band_width = max(frame.x(at + width) - x, 1.0)
        band = (
            f'<rect class="{css}-band" x="{x}" y="{TOP}" width="{round(band_width, 2)}" '
            f'height="{frame.floor - TOP}"/>'
        )
    return (
        f'{band}<line class="{css}" x1="{x}" x2="{x}" y1="{TOP}" y2="{frame.floor}">'
        f"<title>{escape(title)}</title></line>"
    )


def svg(frame: Frame, name: str, label: str, body: str) -> str:
    return (
        f'<svg class="chart" id="chart-{name}" viewBox="0 0 {frame.width} {frame.height}" '
        f'width="{frame.width}" height="{frame.height}" role="img" aria-label="{escape(label)}">'
        f"{body}</svg>"
    )


def category_bars(name: str, label: str, values: Sequence[tuple[str, float]], css: str, unit: str) -> str:
    """A bar per category, left to right, with its label under it."""
    frame = Frame(0, max(len(values), 1), nice_ceiling(max((v for _, v in values), default=0)))
    parts = [y_axis(frame, unit)]
    for index, (text, value) in enumerate(values):
        parts.append(bar(frame, (index + 0.1, index + 0.9, 0, value), css, f"{text}: {_num(value)}"))
    ticks = [(index + 0.5, text) for index, (text, _) in enumerate(values)]
    parts.append(x_labels(frame, _thinned(ticks, 14)))
    return svg(frame, name, label, "".join(parts))


def _thinned(ticks: list[tuple[float, str]], most: int) -> list[tuple[float, str]]:
    step = max(1, math.ceil(len(ticks) / most))
    return ticks[::step]


def _num(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def legend(items: Iterable[tuple[str, str]]) -> str:
    """An HTML legend: a swatch of each class and its name (the charts keep their text to the axes)."""
    swatches = "".join(
        f'<span class="key"><svg width="12" height="12">'
        f'<rect class="{css}" width="12" height="12"/></svg> {escape(text)}</span>'
        for css, text in items
    )
    return f'<p class="legend">{swatches}</p>'
