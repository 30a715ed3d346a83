"""A run's results sink (`results:`): its target resolved from the job, the job's runs caught up
before the relay, the live feed during it, a last catch-up after, and a sink that could not be
written as a `SINK_UNAVAILABLE` warning (the journal keeps every row; a later run catches up)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bulkrelay.envelope import EnvelopeWarning
from bulkrelay.errors import UsageError
from bulkrelay.job.config import Job
from bulkrelay.job.inputs.query import database_of
from bulkrelay.job.template import SecretRef, compile_template, resolve_secrets
from bulkrelay.store.journal import JournalEntry
from bulkrelay.store.results import (
    SinkTarget,
    SinkUnavailable,
    SinkWriter,
    catch_up,
    fed_offset,
    lagging_runs,
    open_writer,
    sink_job_name,
)
from bulkrelay.store.rundir import RunDir
from bulkrelay.store.sinkfeed import SinkFeeder


def sink_target(job: Job, env: Mapping[str, str] | None = None) -> SinkTarget | None:
    """Where the job's results go, `${NAME}` resolved; None: the job keeps no results table."""
    results = job.config.results
    if results is None:
        return None
    env = os.environ if env is None else env
    to = _resolved(results.to, env)
    scheme = to.partition(":")[0].lower()
    if scheme in ("sqlite", "postgresql", "postgres"):
        try:
            database = database_of(to, env, job.base_dir)
        except UsageError as exc:
            message = exc.message.replace("input.database", "results.to")
            raise UsageError(message, context={"field": "results.to"}) from None
        if database.kind == "sqlite":
            return SinkTarget("sqlite", database.identity, database.url, results.table, database.path)
        return SinkTarget("postgresql", database.identity, database.url, results.table)
    path = (job.base_dir / to).resolve()
    kind: Literal["csv", "jsonl"] = "csv" if path.suffix.lower() == ".csv" else "jsonl"
    return SinkTarget(kind, str(path), str(path), results.table, path)


def _resolved(text: str, env: Mapping[str, str]) -> str:
    """`text` with its `${NAME}`s taken from the environment (SECRET_MISSING names one unset)."""
    parts = compile_template(text).parts
    secrets = resolve_secrets([part.name for part in parts if isinstance(part, SecretRef)], env)
    return "".join(secrets[part.name] if isinstance(part, SecretRef) else str(part) for part in parts)


@dataclass
class RunSink:
    """One run's sink while it relays: the writer and its feeder, or why the sink was not written."""

    target: SinkTarget
    run: RunDir
    writer: SinkWriter | None = None
    feeder: SinkFeeder | None = None
    problem: SinkUnavailable | None = None

    def on_commit(self, entries: list[JournalEntry], end_offset: int) -> None:
        if self.feeder is not None:
            self.feeder.on_commit(entries, end_offset)

    def spared(self) -> list[int]:
        """The id of the process that feeds the sink: it works beside the relay, never on its CPU
        (`relay_cpu`'s `spared`)."""
        return [] if self.feeder is None else [self.feeder.pid]


def open_sink(target: SinkTarget, run: RunDir) -> RunSink:
    """Catch the sink up from the journals of the job's runs (this one's, after a crash, included),
    then start the live feed (its process, store/sinkfeed.py). A sink that cannot be written leaves
    the feed off, never the run."""
    sink = RunSink(target, run)
    try:
        sink.writer = open_writer(target)
        for lagging in lagging_runs(run.path.parent, sink_job_name(run), target, own=run):
            catch_up(sink.writer, target, lagging)
    except SinkUnavailable as exc:
        sink.problem = exc
        return sink
    with contextlib.suppress(OSError):  # no process to feed it: the catch-up after the relay does
        sink.feeder = SinkFeeder(target, run, fed_offset(run, target))
    return sink


def close_sink(sink: RunSink) -> EnvelopeWarning | None:
    """End the live feed (its process feeds what the run committed, then exits), catch the sink up with
    whatever the feed missed, compact a file sink; a `SINK_UNAVAILABLE` warning when the sink still
    lacks some of this run's rows."""
    if sink.feeder is not None:
        sink.feeder.close()
        sink.problem = sink.feeder.problem
    writer = sink.writer
    try:
        if writer is None or sink.problem is not None:  # a new connection: the old one may be broken
            if writer is not None:
                writer.close()
            writer = sink.writer = open_writer(sink.target)
        catch_up(writer, sink.target, sink.run)
        writer.finish()
    except SinkUnavailable as exc:
        return sink_warning(exc, sink.run)
    finally:
        if sink.writer is not None:
            sink.writer.close()
    return None


def sink_warning(exc: SinkUnavailable, run: RunDir) -> EnvelopeWarning:
    return EnvelopeWarning(
        "SINK_UNAVAILABLE",
        f"the results sink {exc.identity} could not be written ({exc.reason}): the run went on; its "
        "results are in its journal and reach the sink when the next run of the job catches it up",
        {"sink": exc.identity, "reason": exc.reason, "run_id": run.run_id, "run_dir": str(Path(run.path))},
    )
