"""The run log: `run.log` in the run directory, JSON lines an operator can grep and a machine can parse.

Each line is `{"ts": "2026-12-01T02:30:00.123456Z", "event": NAME, "pid": PID, ...}`:

    start           the command began (command, argv, version)
    preflight_done  the input and job were checked (records, fingerprints, run id)
    pause_429       a 429 with Retry-After paused every start (seconds)
    checkpoint      progress about every 10 s (done, total, ok, failed, rows_per_second)
    interval        what happened since the last interval line, about every 2 s (run.log only): rows
                    committed, ok, failed, responses by status class, retries, 429 answers and pauses,
                    the configured and the current (adapted) rate; the run report's time series
    halt            a halt rule stopped the run (reason and what triggered it)
    stop_requested  a signal, --timeout, `job cancel` or the idle watchdog asked the run to stop
    stop            the relay ended (state, stop_reason, progress)
    exit            the command ended (exit_code, error_code)

`preflight_done` also records the limits in force and the transport (`limits`, `transport`), so
the run report can show them without the job file. Interval lines go to `run.log` alone: a cron log
(`--log-file`) stays a line every 10 s.

Events before the run directory exists (start, and exit when the command fails earlier) are kept
in memory and written to `run.log` once it does. `--log-file PATH` appends the same lines to PATH
as they happen, for cron and anything else that wants one file per job. The log is not run state:
a failed write is dropped rather than stopping the run, which is what the journal is for.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from bulkrelay._version import __version__
from bulkrelay.envelope import Result
from bulkrelay.errors import UsageError
from bulkrelay.job.config import JobConfig
from bulkrelay.job.preflight import Preflight
from bulkrelay.job.request import RequestRenderer
from bulkrelay.relay.metrics import RelayStats
from bulkrelay.relay.progress import Snapshot
from bulkrelay.relay.stopping import StopReason
from bulkrelay.store.rundir import RUN_LOG, RunDir, utc_now

CHECKPOINT_LOG_SECONDS = 10.0
INTERVAL_LOG_SECONDS = 2.0
_FILE_MODE = 0o600  # like every file of a run: it names paths and row counts, nobody else's business


def _open_append(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, _FILE_MODE)


class RunLog:
    """One command's log lines, to `run.log` once the run is known and to `--log-file` at once."""

    def __init__(
        self,
        log_file: Path | None = None,
        *,
        interval: float = CHECKPOINT_LOG_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        counters_interval: float = INTERVAL_LOG_SECONDS,
    ) -> None:
        self._file_fd: int | None = None
        if log_file is not None:
            try:
                self._file_fd = _open_append(log_file)
            except OSError as exc:
                raise UsageError(
                    f"--log-file {log_file}: {exc.strerror or exc}",
                    context={"log_file": str(log_file)},
                    suggestion="name a file in a directory you can write to",
                ) from None
        self._run_fd: int | None = None
        self._pending: list[bytes] = []
        self._interval = interval
        self._clock = clock
        self._logged_at = clock()
        self._started = clock()
        self._first_done: int | None = None
        self._counters: _Counters | None = None
        self._counters_interval = counters_interval

    def event(self, name: str, **fields: Any) -> None:
        self._emit(name, fields)

    def _emit(self, name: str, fields: dict[str, Any], *, run_log_only: bool = False) -> None:
        line = (
            orjson.dumps({"ts": utc_now(), "event": name, "pid": os.getpid(), **fields}, default=str) + b"\n"
        )
        if self._file_fd is not None and not run_log_only:
            _write(self._file_fd, line)
        if self._run_fd is None:
            self._pending.append(line)
        else:
            _write(self._run_fd, line)

    def attach(self, run_dir: Path) -> None:
        """Write to `run_dir/run.log` from now on, starting with what was logged before."""
        if self._run_fd is not None:
            return
        try:
            self._run_fd = _open_append(run_dir / RUN_LOG)
        except OSError:
            return  # the run itself will fail on the same directory, with a proper error
        for line in self._pending:
            _write(self._run_fd, line)
        self._pending.clear()

    def close(self) -> None:
        for fd in (self._run_fd, self._file_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._run_fd = self._file_fd = None

    # ------------------------------------------------------------------ as a run observer

    def run_started(self, run: RunDir, preflight: Preflight, stats: RelayStats) -> None:
        self.attach(run.path)
        self.event(
            "preflight_done",
            run_id=run.run_id,
            run_dir=str(run.path),
            records=preflight.record_count,
            input_sha256=preflight.input_fingerprint.sha256,
            config_sha256=preflight.config_fingerprint,
            limits=limits_of(preflight.job.config),
            transport=transport_of(preflight.job.config, preflight.renderer),
        )
        stats.on_pauses(lambda seconds: self.event("pause_429", seconds=round(seconds, 3)))
        self._logged_at = self._started = self._clock()
        self._counters = _Counters(stats, self._clock())

    def progressed(self, snapshot: Snapshot) -> None:
        if self._first_done is None:
            self._first_done = snapshot.done
        now = self._clock()
        counters = self._counters
        if counters is not None and counters.due(now, self._counters_interval):
            self._interval_line(counters, snapshot, now)
        if now - self._logged_at < self._interval:
            return
        self._logged_at = now
        rate = (snapshot.done - self._first_done) / max(now - self._started, 1e-9)
        self.event("checkpoint", **snapshot.to_dict(), rows_per_second=round(rate, 1))

    def stop_requested(self, reason: StopReason, detail: dict[str, object]) -> None:
        self.event("halt" if reason.halts else "stop_requested", reason=reason, **detail)

    def run_finished(self, run: RunDir, result: Result) -> None:
        data = result.payload() or {}
        progress = data.get("progress")
        if self._counters is not None and isinstance(progress, dict):  # the last rows, up to the end
            final = Snapshot(progress["total"], progress["done"], progress["ok"], progress["failed"])
            self._interval_line(self._counters, final, self._clock())
            self._counters = None
        self.event(
            "stop",
            run_id=run.run_id,
            state=run.state,
            stop_reason=run.manifest.stop_reason,
            progress=data.get("progress"),
        )

    def exit(self, result: Result) -> None:
        data = result.payload() or {}
        self.event(
            "exit",
            exit_code=int(result.exit_code),
            error_code=None if result.error is None else result.error.code,
            state=data.get("state"),
            job_id=result.meta.job_id,
        )

    def _interval_line(self, counters: _Counters, snapshot: Snapshot, now: float) -> None:
        fields = counters.advance(snapshot, now)
        if fields is not None:
            self._emit("interval", fields, run_log_only=True)


class _Counters:
    """What the last interval line left off at, so the next says what happened since."""

    def __init__(self, stats: RelayStats, now: float) -> None:
        self.stats = stats
        self.since = now
        self._done: tuple[int, int] | None = None  # ok, failed at the last line; None: not yet known
        self._responses: Counter[str] = Counter(stats.requests)
        self._wire = (stats.retries, stats.pauses, stats.pause_seconds)
        self._rate: dict[str, Any] = {}

    def due(self, now: float, interval: float) -> bool:
        return self._done is None or now - self.since >= interval

    def advance(self, snapshot: Snapshot, now: float) -> dict[str, Any] | None:
        """The interval line's fields since the last one; None for the first snapshot (its baseline)."""
        if snapshot.pace is not None:
            pace = snapshot.pace
            self._rate = {
                "configured_rps": pace.configured_rps,
                "current_rps": pace.current_rps,
                "rate_limited_responses": pace.rate_limited_responses,
            }
        if self._done is None:  # the rows committed before this call are not this interval's
            self._done = (snapshot.ok, snapshot.failed)
            self.since = now
            return None
        stats = self.stats
        ok, failed = snapshot.ok - self._done[0], snapshot.failed - self._done[1]
        responses = {k: v for k, v in (Counter(stats.requests) - self._responses).items() if v}
        retries, pauses, paused = (a - b for a, b in zip(_wire(stats), self._wire, strict=True))
        fields = {
            "seconds": round(now - self.since, 3),
            "committed": ok + failed,
            "ok": ok,
            "failed": failed,
            "done": snapshot.done,
            "total": snapshot.total,
            "responses": responses,
            "retries": retries,
            "pauses_429": pauses,
            "pause_seconds": round(paused, 3),
            **self._rate,
        }
        self._done, self._responses, self._wire = (
            (snapshot.ok, snapshot.failed),
            Counter(stats.requests),
            _wire(stats),
        )
        self.since = now
        return fields


def _wire(stats: RelayStats) -> tuple[int, int, float]:
    return stats.retries, stats.pauses, stats.pause_seconds


def limits_of(config: JobConfig) -> dict[str, Any]:
    """The limits a run relays under, as the report shows them: never a header, URL or secret."""
    execution, retry, halt = config.execution, config.retry, config.halt
    rate = execution.rate_limit
    return {
        "concurrency": execution.concurrency,
        "requests_per_second": rate.requests_per_second if rate is not None else None,
        "shared_rate_limit": rate is not None and rate.shared is not None,
        "max_attempts": retry.max_attempts,
        "retry_statuses": list(retry.statuses),
        "halt_on_statuses": list(halt.on_statuses),
        "halt_consecutive_failures": halt.consecutive_failures,
        "timeout_seconds": execution.timeout.model_dump(),
        "max_lifetime_seconds": execution.max_lifetime_seconds,
    }


def transport_of(config: JobConfig, renderer: RequestRenderer | None = None) -> dict[str, Any]:
    """The HTTP client and what it sends to: the method and the target's scheme and host, no path, no
    credentials. A URL that starts with `${API_BASE}` shows the origin it resolved to (a secret's
    value redacted, a `vars` one shown); a `{field}` in the host is left as written."""
    written = config.request.url
    head = renderer.url.head if renderer is not None else ""
    whole_host = renderer is not None and (
        renderer.url.constant is not None or "/" in head.partition("://")[2]
    )
    target = (_origin(head) if whole_host else None) or _origin(written) or written
    return {
        "client": config.execution.client,
        "http2": config.execution.http2,
        "method": config.request.method,
        "target": renderer.redactor.redact(target) if renderer is not None else target,
        "sync": config.execution.sync,
    }


def _origin(url: str) -> str | None:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}" if parts.scheme and host else None


def _write(fd: int, line: bytes) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, line)


def start_event(log: RunLog, command: str, argv: list[str]) -> None:
    log.event("start", command=command, argv=argv, version=__version__)
