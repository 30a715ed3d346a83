"""Preflight: one streaming pass over the input that must succeed before any request is sent.

It computes the input fingerprint and the semantic config fingerprint, renders every record's
request, and collects problems (up to `MAX_PROBLEMS`, with file, line, row and field).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bulkrelay.config import Job
from bulkrelay.delta import DeltaSelector, RequestDigester
from bulkrelay.errors import InputInvalid, Problem, UsageError
from bulkrelay.fingerprint import config_fingerprint
from bulkrelay.inputs import InputFingerprint, InputSpec, detect_format, open_records
from bulkrelay.keycheck import DuplicateKeyFinder
from bulkrelay.request import RenderError, RequestRenderer

MAX_PROBLEMS = 20


@dataclass(frozen=True)
class Preflight:
    """Everything a run needs to know before it starts sending."""

    job: Job
    input_spec: InputSpec
    input_fingerprint: InputFingerprint
    config_fingerprint: str
    renderer: RequestRenderer
    digester: RequestDigester | None = None  # a delta job: journal lines carry each row's digest

    @property
    def record_count(self) -> int:
        return self.input_fingerprint.record_count


def resolve_input(job: Job, input_override: Path | None) -> InputSpec:
    """The input named by `--input` (already spooled when it was stdin), else the job file's."""
    path = input_override if input_override is not None else job.input_path
    if path is None:
        raise UsageError(
            "the job names no input file and no --input was given",
            suggestion="add input.file to the job or pass --input FILE",
        )
    declared = job.config.input.format
    fmt, gzip = detect_format(path.name, declared)
    return InputSpec(path=path, format=fmt, gzip=gzip, delimiter=job.config.input.delimiter)


class _ProblemCollector:
    """Keeps the first problems in full and counts the rest."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.total = 0

    def add(self, problem: Problem) -> None:
        self.total += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(problem)


def run_preflight(
    job: Job,
    input_override: Path | None = None,
    env: Mapping[str, str] | None = None,
    delta: DeltaSelector | None = None,
) -> Preflight:
    """Validate the whole job and input; raise `InputInvalid` with the problems found.

    `delta` sees every record that renders, with its request, in the same pass: the rows a delta
    run sends are chosen without reading the input twice."""
    renderer = RequestRenderer.from_config(
        job.config.request,
        os.environ if env is None else env,
        sorted_json=job.config.execution.sync != "full",
    )
    digester = None
    if job.config.execution.sync != "full":
        digester = RequestDigester(job.config.request, renderer.redactor, sorted_json=renderer.sorted_json)
    observe = delta.observer(digester) if delta is not None and digester is not None else None
    spec = resolve_input(job, input_override)
    collector = _ProblemCollector()
    key_field = job.config.input.key
    file = str(spec.path)
    keys = DuplicateKeyFinder(key_field, file) if key_field else None
    render = renderer.render
    with open_records(spec, collector.add) as stream:
        for record in stream:
            try:
                request = render(record)
                if observe is not None:
                    observe(record, request)
            except RenderError as exc:
                collector.add(
                    Problem(exc.message, file=file, line=record.line, row=record.row_number, field=exc.field)
                )
            if keys is not None and (problem := keys.add(record)) is not None:
                collector.add(problem)
        fingerprint = stream.fingerprint()
    if keys is not None:
        for problem in keys.duplicates(spec):
            collector.add(problem)
    if collector.total:
        raise InputInvalid(collector.problems, total=collector.total, phase="preflight")
    return Preflight(
        job=job,
        input_spec=spec,
        input_fingerprint=fingerprint,
        config_fingerprint=config_fingerprint(job.config),
        renderer=renderer,
        digester=digester,
    )
