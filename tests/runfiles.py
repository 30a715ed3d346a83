"""Readers of the files a run writes beside its journal, checking their format as they read: the
metrics file (`--metrics-file`, Prometheus text format, read with prometheus_client's own parser) and
the run log (`run.log`, JSON lines with UTC timestamps).

    samples = read_metrics(tmp_path / "run.prom")
    assert metric(samples, "bulkrelay_rows", outcome="succeeded") == 10
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
UTC_TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def read_metrics(path: Path) -> Samples:
    """Every sample of the file, by name and labels; the parser raises on anything malformed."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(path.read_text())
        for sample in family.samples
    }


def metric(samples: Samples, name: str, **labels: str) -> float:
    """The sample `name` of the job `test-job` with `labels`."""
    wanted = frozenset({"job_name": "test-job", **labels}.items())
    return samples[(name, wanted)]


def read_log(path: Path) -> list[dict[str, Any]]:
    """Every line of a run log; each has a UTC `ts`, an `event` and the writer's `pid`."""
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    for line in lines:
        assert UTC_TS.match(line["ts"]), line
        assert isinstance(line["event"], str) and isinstance(line["pid"], int)
    return lines
