"""Prometheus metrics of a run, in the text format node_exporter's textfile collector reads.

`RelayStats` counts what went on the wire in this process (requests by status class, retries,
429 pauses, request latency); the sender feeds it. `MetricsFile` turns the stats and the committed
progress into a metrics file, replaced atomically (temp file, fsync, rename, directory fsync) when
the run starts, about every 10 s while it runs, and when it ends. It is an operational setting:
nothing about it enters the run's fingerprint or the invocation's identity.

Every sample carries the label `job_name` (the job's `name`, else its file name without suffix).
The label is not `job`: Prometheus gives that name to the scrape job and would rename ours
`exported_job`.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bulkrelay.envelope import EnvelopeWarning, Result
from bulkrelay.errors import StorageFailed, UsageError
from bulkrelay.job.redact import redact_url_credentials
from bulkrelay.private import UnreadableFile, read_small_file
from bulkrelay.relay.progress import Snapshot
from bulkrelay.relay.stopping import StopReason
from bulkrelay.store.atomic import file_to_replace, write_atomic
from bulkrelay.store.rundir import RunDir, RunState
from bulkrelay.store.summary import RequestCounts

if TYPE_CHECKING:  # prometheus_client loads only when a metrics file is written (~0.1 s of every start)
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import GaugeMetricFamily, Metric

    from bulkrelay.job.preflight import Preflight  # `status` reads metrics' words, not a job

METRICS_ENV = "BULKRELAY_METRICS_FILE"
METRICS_INTERVAL_SECONDS = 10.0
METRICS_PUSH_ENV = "BULKRELAY_METRICS_PUSH"
PUSH_JOB = "bulkrelay"  # the Pushgateway's `job` label; ours is `job_name`
PUSH_TIMEOUT_SECONDS = 10.0
# Read by node_exporter, which runs as its own user (Debian: `prometheus`). The file holds counts, the job's
# name and the run id, never a row's data, so it is the one file BulkRelay makes readable by others; a
# stricter umask still wins (077: 0600).
METRICS_FILE_MODE = 0o644
# Upper bounds (seconds) of the request latency histogram: loopback answers to slow batch APIs.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_LAST_SUCCESS = "bulkrelay_last_success_timestamp_seconds"
# The most of an earlier metrics file read back for its last success time: this file is a few KiB; a
# larger one is not ours, and reading it whole could take all the memory there is.
PREVIOUS_FILE_MOST_BYTES = 1 << 20


_STATUS_CLASSES = tuple(f"{hundreds}xx" for hundreds in range(10))  # made once, not per request


def status_class(status: int | None) -> str:
    """`2xx`, `4xx`, ... for an HTTP status; `error` when no answer came (transport error)."""
    if status is None:
        return "error"
    hundreds = status // 100
    return _STATUS_CLASSES[hundreds] if 0 <= hundreds < 10 else f"{hundreds}xx"


class RelayStats:
    """What this process sent: cheap counters, updated on the event loop by the row sender."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.by_status: Counter[int | None] = Counter()  # each request's status (None: no answer)
        self.retries = 0
        self.splits = 0  # batches bisected after a whole-batch 4xx or a 413: no retry, new requests
        self.bulk_polls = 0  # bulk jobs' state requests (relay/bulkjobs/steps.py), retries included
        self.bulk_steps = 0  # bulk jobs' other requests: create, upload, close, abort, results
        self.pauses = 0
        self.pause_seconds = 0.0
        self.latency_counts = [0] * (len(LATENCY_BUCKETS) + 1)  # per bucket, the last one is +Inf
        self.latency_sum = 0.0
        self._pause_listeners: list[Callable[[float], None]] = []
        self._pause_end = -math.inf  # when the pause in force ends (monotonic)

    def on_attempt(self, status: int | None, latency_seconds: float) -> None:
        hundreds = -1 if status is None else status // 100  # status_class(), inline: once an attempt
        self.requests[_STATUS_CLASSES[hundreds] if 0 <= hundreds < 10 else status_class(status)] += 1
        self.by_status[status] += 1
        self.latency_sum += latency_seconds
        # the first bucket whose upper bound is >= the latency; past the last one, +Inf
        self.latency_counts[bisect_left(LATENCY_BUCKETS, latency_seconds)] += 1

    def on_retry(self) -> None:
        self.retries += 1

    def on_split(self) -> None:
        self.splits += 1

    def on_pause(self, seconds: float, at: float) -> None:
        """A 429 with Retry-After paused every start for `seconds` from `at` (monotonic). Pauses that
        overlap are one pause of their union: the rows in flight answered 429 together hold the starts
        once, so `pauses` counts the spells and `pause_seconds` the time starts were held."""
        end = at + seconds
        if at >= self._pause_end:
            self.pauses += 1
            self.pause_seconds += seconds
        else:
            self.pause_seconds += max(0.0, end - self._pause_end)
        self._pause_end = max(self._pause_end, end)
        for listener in self._pause_listeners:
            listener(seconds)

    def on_pauses(self, listener: Callable[[float], None]) -> None:
        """Call `listener(seconds)` at every 429 pause (the run log writes one line each)."""
        self._pause_listeners.append(listener)

    def request_counts(self) -> RequestCounts:
        """This process's requests as the summary counts them."""
        by_status = Counter(
            {"none" if status is None else str(status): n for status, n in self.by_status.items()}
        )
        return RequestCounts(
            sum(by_status.values()), dict(sorted(by_status.items())), self.retries, self.splits
        )

    def sent(self) -> dict[str, Any]:
        """What this process sent so far, as JSON (a worker process tells its run: ops/workers.py).
        Pauses are told one by one (`on_pause`), so they are not here."""
        return {
            "requests": dict(self.requests),
            "by_status": [[status, n] for status, n in self.by_status.items()],
            "retries": self.retries,
            "splits": self.splits,
            "latency_counts": self.latency_counts,
            "latency_sum": self.latency_sum,
        }

    def add_sent(self, now: dict[str, Any], before: dict[str, Any] | None) -> None:
        """Count what another process sent between its `sent()` figures `before` (None: from its start)
        and `now`, so that this process's counters hold its workers' requests."""
        was = before or {}
        self.requests.update(Counter(now["requests"]) - Counter(was.get("requests", {})))
        then = {status: n for status, n in was.get("by_status", [])}
        for status, n in now["by_status"]:
            self.by_status[status] += n - then.get(status, 0)
        self.retries += now["retries"] - was.get("retries", 0)
        self.splits += now["splits"] - was.get("splits", 0)
        counts_then = was.get("latency_counts") or [0] * len(self.latency_counts)
        for bucket, (n, m) in enumerate(zip(now["latency_counts"], counts_then, strict=True)):
            self.latency_counts[bucket] += n - m
        self.latency_sum += now["latency_sum"] - was.get("latency_sum", 0.0)

    def cumulative_buckets(self) -> list[tuple[str, float]]:
        buckets: list[tuple[str, float]] = []
        total = 0
        for le, count in zip((*map(str, LATENCY_BUCKETS), "+Inf"), self.latency_counts, strict=True):
            total += count
            buckets.append((le, total))
        return buckets


class MetricsFile:
    """The run observer that keeps a metrics file up to date (see `lifecycle.RunObserver`)."""

    def __init__(
        self,
        path: Path,
        *,
        interval: float = METRICS_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not path.parent.is_dir():
            raise UsageError(
                f"--metrics-file {path}: directory {path.parent} does not exist",
                context={"metrics_file": str(path)},
                suggestion=f"create {path.parent}, or name a file in an existing directory",
            )
        suggestion = "name a file for node_exporter's textfile collector, such as DIR/bulkrelay.prom"
        self.path = file_to_replace(path, named="--metrics-file", suggestion=suggestion)
        self._init_state(interval, clock)

    def _init_state(self, interval: float, clock: Callable[[], float]) -> None:
        self._interval = interval
        self._clock = clock
        self._labels: dict[str, str] = {}
        self._stats = RelayStats()
        self._snapshot = Snapshot(total=0, done=0, ok=0, failed=0)
        self._first_done: int | None = None
        self._run_id = ""
        self._skipped_unchanged: int | None = None
        self._started = clock()
        self._started_at = time.time()
        self._written = -float("inf")
        self._last_success: float | None = None
        self._failure: StorageFailed | None = None
        self._unread: str | None = None  # why the earlier file's last success time could not be read
        self._shard: str | None = None

    def run_started(self, run: RunDir, preflight: Preflight, stats: RelayStats) -> None:
        name = preflight.job.config.name or preflight.job.path.stem
        self._labels = {"job_name": name}
        self._stats = stats
        self._last_success = self._previous_last_success(name)
        self._shard = None if run.plan.shard is None else str(run.plan.shard.index)
        self._run_id = run.run_id
        sync = run.plan.sync  # a delta run's rows not sent because they had not changed
        self._skipped_unchanged = sync.skipped_unchanged if sync is not None else None
        self._started, self._started_at = self._clock(), time.time()
        self._write(run.state, None)

    def progressed(self, snapshot: Snapshot) -> None:
        first = self._first_done is None
        if first:
            self._first_done = snapshot.done  # a resumed run's rate counts only this process's rows
        self._snapshot = snapshot
        if first or self._clock() - self._written >= self._interval:
            self._write(RunState.RUNNING, None)

    def stop_requested(self, reason: StopReason, detail: dict[str, object]) -> None:
        pass  # the file says how the run ended when it has ended

    def run_finished(self, run: RunDir, result: Result) -> None:
        progress = (result.payload() or {}).get("progress")
        if progress:
            self._snapshot = Snapshot(
                total=int(progress["total"]),
                done=progress["done"],
                ok=progress["ok"],
                failed=progress["failed"],
            )
        if result.exit_code == 0:
            self._last_success = time.time()
        self._write(run.state, int(result.exit_code))
        warning = self._failure_warning()
        if warning is not None:
            result.warnings.append(warning)

    def _previous_last_success(self, job_name: str) -> float | None:
        try:
            return previous_last_success(self.path, job_name)
        except _Unreadable as exc:
            self._unread = str(exc)
            return None

    def _failure_warning(self) -> EnvelopeWarning | None:
        if self._failure is not None:
            text = f"the metrics file could not be written: {self._failure.message}"
        elif self._unread is not None:
            why = self._unread
            text = f"the metrics file's earlier content was not read ({why}): the last success time is lost"
        else:
            return None
        return EnvelopeWarning("METRICS_WRITE_FAILED", text, {"metrics_file": str(self.path)})

    def _registry(self, state: RunState, exit_code: int | None) -> CollectorRegistry:
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(lambda: self.families(state, exit_code)))
        return registry

    def _write(self, state: RunState, exit_code: int | None) -> None:
        """Replace the file; a failure is reported once at the end and never stops the run."""
        self._written = self._clock()
        from prometheus_client import generate_latest

        try:
            write_atomic(self.path, generate_latest(self._registry(state, exit_code)), mode=METRICS_FILE_MODE)
        except StorageFailed as exc:
            self._failure = self._failure or exc

    def families(self, state: RunState, exit_code: int | None) -> Iterator[Metric]:
        """Every metric family of the file, for the run in `state` (`exit_code` once it has ended)."""
        yield from self._run_families(state, exit_code)
        yield from self._wire_families()

    def _run_families(self, state: RunState, exit_code: int | None) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        names, snap = list(self._labels), self._snapshot
        rows = GaugeMetricFamily("bulkrelay_rows", "Rows of the run by outcome.", labels=[*names, "outcome"])
        pending = snap.total - snap.done
        for outcome, count in (("succeeded", snap.ok), ("failed", snap.failed), ("pending", pending)):
            rows.add_metric([*self._labels.values(), outcome], count)
        yield rows
        if self._skipped_unchanged is not None:
            yield self._gauge(
                "bulkrelay_rows_skipped_unchanged",
                "Rows a delta run did not send: unchanged since their last delivery.",
                self._skipped_unchanged,
            )
        elapsed = max(self._clock() - self._started, 1e-9)
        rate = (snap.done - (self._first_done or 0)) / elapsed
        yield self._gauge("bulkrelay_rows_per_second", "Rows committed per second by this process.", rate)
        yield self._gauge("bulkrelay_run_start_timestamp_seconds", "When relaying began.", self._started_at)
        yield self._gauge(
            "bulkrelay_run_updated_timestamp_seconds", "When this file was written.", time.time()
        )
        yield self._gauge("bulkrelay_run_info", "The run this file describes.", 1, run_id=self._run_id)
        run_state = GaugeMetricFamily(
            "bulkrelay_run_state", "1 for the run's state, 0 for the others.", labels=[*names, "state"]
        )
        for name in RunState:
            run_state.add_metric([*self._labels.values(), name], 1 if name == state else 0)
        yield run_state
        if exit_code is not None:
            yield self._gauge("bulkrelay_run_exit_code", "Exit code of the run's last call.", exit_code)
        if self._last_success is not None:
            yield self._gauge(_LAST_SUCCESS, "When a run of this job last exited 0.", self._last_success)

    def _wire_families(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        names, labels, stats = list(self._labels), list(self._labels.values()), self._stats
        requests = CounterMetricFamily(
            "bulkrelay_requests", "Requests sent, by status class.", labels=[*names, "status_class"]
        )
        for klass in ("1xx", "2xx", "3xx", "4xx", "5xx", "error"):
            requests.add_metric([*labels, klass], stats.requests[klass])
        yield requests
        for name, text, value in (
            ("bulkrelay_retries", "Retried attempts.", stats.retries),
            (
                "bulkrelay_batch_splits",
                "Batches bisected after a whole-batch 4xx or 413 (not retries).",
                stats.splits,
            ),
            (
                "bulkrelay_rate_limit_pauses",
                "Pauses of every start on a 429's Retry-After (overlapping ones count once).",
                stats.pauses,
            ),
            ("bulkrelay_rate_limit_pause_seconds", "Seconds they held every start.", stats.pause_seconds),
            (
                "bulkrelay_bulk_job_polls",
                "Bulk jobs' state requests (polls), retries included.",
                stats.bulk_polls,
            ),
            (
                "bulkrelay_bulk_job_steps",
                "Bulk jobs' other requests (create, upload, close, results).",
                stats.bulk_steps,
            ),
        ):
            counter = CounterMetricFamily(name, text, labels=names)
            counter.add_metric(labels, value)
            yield counter
        latency = HistogramMetricFamily(
            "bulkrelay_request_duration_seconds", "Round trip of each request.", labels=names
        )
        latency.add_metric(labels, stats.cumulative_buckets(), stats.latency_sum)
        yield latency

    def _gauge(self, name: str, text: str, value: float, **extra: str) -> GaugeMetricFamily:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily(name, text, labels=[*self._labels, *extra])
        family.add_metric([*self._labels.values(), *extra.values()], value)
        return family


class MetricsPush(MetricsFile):
    """The same metrics pushed once, when the run ends, to a Prometheus Pushgateway (`--metrics-push`):
    for a pod whose metrics file nothing scrapes (a Kubernetes CronJob). The group is `job="bulkrelay"`,
    `job_name` and, for a shard, `shard` (its index), so shards and jobs never overwrite each other.
    Pushed with POST, which replaces only the metrics pushed: the last success time pushed by an earlier
    run stays when this one failed. A push that fails is a warning (`METRICS_PUSH_FAILED`), never a
    failed run; the URL is shown without its credentials."""

    def __init__(self, url: str, *, timeout: float = PUSH_TIMEOUT_SECONDS) -> None:
        self.url = url
        self._timeout = timeout
        self._push_failure: str | None = None
        self._init_state(METRICS_INTERVAL_SECONDS, time.monotonic)

    def _previous_last_success(self, job_name: str) -> float | None:
        return None  # the gateway keeps the one pushed before (POST replaces only what is pushed)

    def _write(self, state: RunState, exit_code: int | None) -> None:
        self._written = self._clock()
        if exit_code is None:
            return  # only the end of the run is pushed
        from prometheus_client import pushadd_to_gateway

        grouping = dict(self._labels) | ({} if self._shard is None else {"shard": self._shard})
        try:
            pushadd_to_gateway(
                self.url,
                job=PUSH_JOB,
                registry=self._registry(state, exit_code),
                grouping_key=grouping,
                timeout=self._timeout,
            )
        except (OSError, ValueError) as exc:  # URLError and HTTPError are OSErrors
            self._push_failure = redact_url_credentials(str(exc)) or type(exc).__name__

    def _failure_warning(self) -> EnvelopeWarning | None:
        if self._push_failure is None:
            return None
        shown = redact_url_credentials(self.url)
        return EnvelopeWarning(
            "METRICS_PUSH_FAILED",
            f"the metrics could not be pushed to {shown}: {self._push_failure}",
            {"metrics_push": shown},
        )


class _Collector:
    def __init__(self, families: Callable[[], Iterator[Metric]]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return self._families()


class _Unreadable(Exception):
    """The earlier metrics file is there but cannot be read back (why, in words)."""


def previous_last_success(path: Path, job_name: str) -> float | None:
    """The last success time an earlier run wrote to the same file, so it survives failed nights.
    None when there is no file or it is not a metrics file; `_Unreadable` when it cannot be read."""
    from prometheus_client.parser import text_string_to_metric_families

    data = _small_file(path)
    if data is None:
        return None
    try:
        for family in text_string_to_metric_families(data.decode()):
            for sample in family.samples:
                if sample.name == _LAST_SUCCESS and sample.labels.get("job_name") == job_name:
                    return float(sample.value)
    except ValueError:  # not a metrics file we can read (nor UTF-8 text): start afresh
        return None
    return None


def _small_file(path: Path) -> bytes | None:
    """The bytes of the earlier file (`read_small_file`: a regular file of at most
    `PREVIOUS_FILE_MOST_BYTES`, a FIFO put there since the run's start never holding the run up), None
    when there is none; what is there and cannot be read is `_Unreadable`."""
    try:
        return read_small_file(path, PREVIOUS_FILE_MOST_BYTES)
    except UnreadableFile as refused:
        if refused.missing:
            return None
        raise _Unreadable(refused.reason) from None


def metrics_path(flag: Path | None, environ: Mapping[str, str]) -> Path | None:
    """`--metrics-file`, else BULKRELAY_METRICS_FILE, else none."""
    if flag is not None:
        return flag
    value = environ.get(METRICS_ENV, "").strip()
    return Path(value) if value else None


def metrics_push_url(flag: str | None, environ: Mapping[str, str]) -> str | None:
    """`--metrics-push`, else BULKRELAY_METRICS_PUSH, else none."""
    if flag:
        return flag
    value = environ.get(METRICS_PUSH_ENV, "").strip()
    return value or None
