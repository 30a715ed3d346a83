"""A job's history as one self-contained page: its last nights' rows, failures by classification,
duration and throughput, as charts and a table, each night linked to its own report.

Made from the nights alone (`nights.py`: each run's `run.json` and `summary.json`), so a thousand nights
take a moment, not a journal's read each. A bad night (rows failed, or it did not finish) is marked in
the table and drawn in the failure colour.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bulkrelay.relay.retry import counts_as_success
from bulkrelay.report import words
from bulkrelay.report.nights import Night
from bulkrelay.report.reportpage import CSP
from bulkrelay.report.svgchart import Chart, Frame, Shape, chart, nice_ceiling, stacked, x_labels, y_axis
from bulkrelay.report.templating import render

PALETTE = 6  # failure classifications get the classes k0..k5, in order of their rows, the rest k5
_REPORT = "report.html"


@dataclass(frozen=True)
class NightRow:
    """A night as the table shows it."""

    night: Night
    verdict: str
    report: str | None  # its report.html as a file: URI, when it has one
    command: str  # the command that writes its report


def history_page(name: str, runs_dir: Path, nights: Sequence[Night], generated_at: str) -> str:
    classes = _classifications(nights)
    rows = [_row(night) for night in reversed(nights)]  # newest first in the table
    return render(
        "history.html.j2",
        csp=CSP,
        name=name,
        runs_dir=str(runs_dir.absolute()),
        nights=nights,
        rows=rows,
        bad=sum(1 for night in nights if night.bad),
        generated_at=generated_at,
        classes=[(f"k{min(i, PALETTE - 1)}", c) for i, c in enumerate(classes)],
        charts=_charts(nights, classes) if nights else [],
    )


def _row(night: Night) -> NightRow:
    report = night.path / _REPORT
    return NightRow(
        night,
        words.verdict(night.state, night.stop_reason, live=False, failed=night.failed),
        report.as_uri() if report.is_file() else None,
        f"bulkrelay report {night.path}",
    )


def _classifications(nights: Sequence[Night]) -> list[str]:
    totals: dict[str, int] = {}
    for night in nights:
        for name, rows in night.by_classification.items():
            if not counts_as_success(name):
                totals[name] = totals.get(name, 0) + rows
    return sorted(totals, key=lambda name: (-totals[name], name))


def _charts(nights: Sequence[Night], classes: list[str]) -> list[tuple[str, Chart]]:
    def failures(night: Night) -> list[tuple[float, str]]:
        return [(night.by_classification.get(c, 0), f"k{min(i, PALETTE - 1)}") for i, c in enumerate(classes)]

    return [
        ("Rows each night", _per_night(nights, "rows", "rows", _rows)),
        ("Failed rows by classification", _per_night(nights, "failures", "rows", failures)),
        ("Duration", _per_night(nights, "duration", "minutes", lambda n: [((n.duration or 0) / 60, "dur")])),
        ("Throughput", _per_night(nights, "throughput", "rows/s", lambda n: [(n.rate or 0.0, "rate")])),
    ]


def _rows(night: Night) -> list[tuple[float, str]]:
    return [(night.rows_done - night.failed, "ok"), (night.failed, "failed")]


def _per_night(
    nights: Sequence[Night], name: str, unit: str, layers: Callable[[Night], list[tuple[float, str]]]
) -> Chart:
    """A stacked bar per night, oldest on the left, its date under it."""
    heights = [sum(height for height, _ in layers(night)) for night in nights]
    frame = Frame(0, len(nights), nice_ceiling(max(heights, default=0)))
    shapes: list[Shape] = list(y_axis(frame, unit))
    for index, night in enumerate(nights):
        result = words.verdict(night.state, night.stop_reason, False, night.failed)
        title = f"{words.when(night.started)}: {result}"
        shapes += stacked(frame, index + 0.1, index + 0.9, layers(night), title)
    step = max(1, len(nights) // 12)
    ticks = [(i + 0.5, words.day(n.started)) for i, n in enumerate(nights)][::step]
    shapes += x_labels(frame, ticks)
    return chart(frame, f"history-{name}", f"{name} of each night", shapes)
