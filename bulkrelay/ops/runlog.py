"""The run log: `run.log` in the run directory, JSON lines an operator can grep and a machine can parse.

Each line is `{"ts": "2026-12-01T02:30:00.123456Z", "event": NAME, "pid": PID, ...}`:

    start           the command began (command, argv, version)
    preflight_done  the input and job were checked (records, fingerprints, run id)
    pause_429       a 429 with Retry-After paused every start (seconds)
    checkpoint      progress about every 10 s (done, total, ok, failed, rows_per_second)
    halt            a halt rule stopped the run (reason and what triggered it)
    stop_requested  a signal, --timeout, `job cancel` or the idle watchdog asked the run to stop
    stop            the relay ended (state, stop_reason, progress)
    exit            the command ended (exit_code, error_code)

Events before the run directory exists (start, and exit when the command fails earlier) are kept
in memory and written to `run.log` once it does. `--log-file PATH` appends the same lines to PATH
as they happen, for cron and anything else that wants one file per job. The log is not run state:
a failed write is dropped rather than stopping the run, which is what the journal is for.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bulkrelay._version import __version__
from bulkrelay.envelope import Result
from bulkrelay.errors import UsageError
from bulkrelay.job.preflight import Preflight
from bulkrelay.relay.metrics import RelayStats
from bulkrelay.relay.progress import Snapshot
from bulkrelay.relay.stopping import StopReason
from bulkrelay.store.rundir import RunDir, utc_now

RUN_LOG = "run.log"
CHECKPOINT_LOG_SECONDS = 10.0
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

    def event(self, name: str, **fields: Any) -> None:
        line = (
            orjson.dumps({"ts": utc_now(), "event": name, "pid": os.getpid(), **fields}, default=str) + b"\n"
        )
        if self._file_fd is not None:
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
        )
        stats.on_pauses(lambda seconds: self.event("pause_429", seconds=round(seconds, 3)))
        self._logged_at = self._started = self._clock()

    def progressed(self, snapshot: Snapshot) -> None:
        if self._first_done is None:
            self._first_done = snapshot.done
        now = self._clock()
        if now - self._logged_at < self._interval:
            return
        self._logged_at = now
        rate = (snapshot.done - self._first_done) / max(now - self._started, 1e-9)
        self.event("checkpoint", **snapshot.to_dict(), rows_per_second=round(rate, 1))

    def stop_requested(self, reason: StopReason, detail: dict[str, object]) -> None:
        self.event("halt" if reason.halts else "stop_requested", reason=reason, **detail)

    def run_finished(self, run: RunDir, result: Result) -> None:
        data = result.payload() or {}
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
            error_code=None if result.error is None else result.error.get("code"),
            state=data.get("state"),
            job_id=result.meta.get("job_id"),
        )


def _write(fd: int, line: bytes) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, line)


def start_event(log: RunLog, command: str, argv: list[str]) -> None:
    log.event("start", command=command, argv=argv, version=__version__)
