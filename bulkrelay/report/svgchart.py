"""Small SVG charts drawn by our own code: axes, bars, stacked bars, step lines and markers.

The reports embed them inline, so a page needs no script and fetches nothing: no library, no font, no
image. The functions here only compute shapes (`Rect`, `Line`, `Label`, `Polyline`) in the chart's pixels;
`templates/charts.html.j2` writes them as SVG, escaped like every other value. Colours come from the
page's own style sheet, by class name. A chart is a fixed-size `viewBox` that the page scales to its width.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Rect:
    css: str
    x: float
    y: float
    width: float
    height: float
    title: str = ""
    kind: str = "rect"


@dataclass(frozen=True)
class Line:
    css: str
    x1: float
    x2: float
    y1: float
    y2: float
    title: str = ""
    kind: str = "line"


@dataclass(frozen=True)
class Label:
    css: str
    x: float
    y: float
    text: str
    anchor: str = ""
    kind: str = "text"


@dataclass(frozen=True)
class Polyline:
    css: str
    points: str
    kind: str = "polyline"


Shape = Rect | Line | Label | Polyline


@dataclass(frozen=True)
class Chart:
    """One chart: its id (`chart-<name>`), what it shows (its aria-label) and its shapes."""

    name: str
    label: str
    width: int
    height: int
    shapes: tuple[Shape, ...]


def y_axis(frame: Frame, unit: str = "") -> list[Shape]:
    shapes: list[Shape] = []
    for i in range(5):
        value = frame.y1 * i / 4
        y = frame.y(value)
        shapes.append(Line("grid", LEFT, frame.width - RIGHT, y, y))
        shapes.append(Label("tick", LEFT - 6, y + 4, _num(value), "end"))
    if unit:
        shapes.append(Label("unit", 4, 14, unit))
    return shapes


def x_labels(frame: Frame, ticks: Iterable[tuple[float, str]]) -> list[Shape]:
    shapes: list[Shape] = [Line("axis", LEFT, frame.width - RIGHT, frame.floor, frame.floor)]
    for value, label in ticks:
        x = frame.x(value)
        shapes.append(Line("axis", x, x, frame.floor, frame.floor + 4))
        shapes.append(Label("tick", x, frame.floor + 18, label, "middle"))
    return shapes


Box = tuple[float, float, float, float]  # x0, x1, y0, y1 in data units


def bar(frame: Frame, box: Box, css: str, title: str = "") -> Rect:
    """A rectangle from (x0, y0) to (x1, y1) in data units; at least one pixel wide."""
    x0, x1, y0, y1 = box
    left, right = frame.x(x0), frame.x(x1)
    top, bottom = frame.y(y1), frame.y(y0)
    width = max(right - left, 1.0)
    return Rect(css, left, top, round(width, 2), round(max(bottom - top, 0.0), 2), title)


def stacked(
    frame: Frame, x0: float, x1: float, layers: Sequence[tuple[float, str]], title: str
) -> list[Shape]:
    """Bars stacked bottom up, one per (height, class)."""
    shapes: list[Shape] = []
    base = 0.0
    for height, css in layers:
        if height > 0:
            shapes.append(bar(frame, (x0, x1, base, base + height), css, title))
            base += height
    return shapes


def step_line(
    frame: Frame, points: Sequence[tuple[float, float, float | None]], css: str, gap: float = 0.25
) -> list[Shape]:
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
    return [Polyline(css, path) for path in paths]


def marker(frame: Frame, at: float, css: str, title: str, width: float = 0.0) -> list[Shape]:
    """A vertical line at `at` (a band `width` wide in data units when given), titled."""
    x = frame.x(at)
    shapes: list[Shape] = []
    if width > 0:
        band_width = max(frame.x(at + width) - x, 1.0)
        shapes.append(Rect(f"{css}-band", x, TOP, round(band_width, 2), frame.floor - TOP))
    shapes.append(Line(css, x, x, TOP, frame.floor, title))
    return shapes


def chart(frame: Frame, name: str, label: str, shapes: Iterable[Shape]) -> Chart:
    return Chart(name, label, frame.width, frame.height, tuple(shapes))


def category_bars(name: str, label: str, values: Sequence[tuple[str, float]], css: str, unit: str) -> Chart:
    """A bar per category, left to right, with its label under it."""
    frame = Frame(0, max(len(values), 1), nice_ceiling(max((v for _, v in values), default=0)))
    shapes = y_axis(frame, unit)
    for index, (text, value) in enumerate(values):
        shapes.append(bar(frame, (index + 0.1, index + 0.9, 0, value), css, f"{text}: {_num(value)}"))
    ticks = [(index + 0.5, text) for index, (text, _) in enumerate(values)]
    shapes += x_labels(frame, _thinned(ticks, 14))
    return chart(frame, name, label, shapes)


def _thinned(ticks: list[tuple[float, str]], most: int) -> list[tuple[float, str]]:
    step = max(1, math.ceil(len(ticks) / most))
    return ticks[::step]


def _num(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"
