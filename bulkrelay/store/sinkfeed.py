"""The results sink's live feed: a process of its own that reads the run's committed groups back from
the journal and upserts them, while the relay goes on (issue 39).

Why a process: fed from the relay's process (a thread turning each committed entry into a row and
binding its JSON), the sink cost the relay 5-10 % of its rows a second, most of it Python's lock
handed back and forth between the feed's thread and the event loop. Here the relay only tells the
feeder how far the journal is committed (`on_commit` writes the group's end offset to a pipe: one
non-blocking write of a few bytes a group), and the feeder decodes the lines and upserts them on the
CPUs the relay does not hold (relay/affinity.py's `spared`). The journal, which the feeder reads
itself, stays the only source: it is never told a row, only where the committed bytes end.

The feeder upserts what the pipe has told it about every `_FEED_EVERY_SECONDS` (one transaction for
that many groups, `upsert_groups` as a catch-up does) and records its progress in `results-sink.json`
about once a second and when it ends. When the run closes the pipe, it feeds up to the last offset
told, records its progress, writes one JSON line to stdout (`{"offset": n, "problem": null |
{"identity", "reason"}}`) and exits; the run waits for it before its own last catch-up. When the run
dies (kill -9 included), the feeder is killed with it on Linux (PR_SET_PDEATHSIG), and elsewhere ends
at the pipe's end, which the system closes: the resume catches the sink up from the journal. A sink it
cannot write ends it early with the problem said: the run's last catch-up, or the next run's, feeds the
sink from the journal.

Run as `python -m bulkrelay.store.sinkfeed`; its parameters come as the pipe's first line (JSON: the
sink's URL may hold a password, which the command line would show to every user of the machine).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bulkrelay.private import die_with_parent, no_core_dumps
from bulkrelay.store.results import (
    FedRun,
    SinkTarget,
    SinkUnavailable,
    open_writer,
    save_progress,
    upsert_groups,
)
from bulkrelay.store.rundir import RunDir

_COMMAND = (sys.executable, "-m", "bulkrelay.store.sinkfeed")
_FEED_EVERY_SECONDS = 0.25  # one transaction for the groups committed meanwhile
_PROGRESS_EVERY_SECONDS = 1.0
_READ_BYTES = 1 << 16


# ---------------------------------------------------------------------------------------------------
# The run's side


class SinkFeeder:
    """The feeder process of one run, started here: `on_commit` tells it each committed group's end,
    `close` lets it finish and says why it could not write the sink (`problem`), if it could not."""

    def __init__(self, target: SinkTarget, run: RunDir, offset: int) -> None:
        self.problem: SinkUnavailable | None = None
        self._target = target
        params = {
            "target": {
                "kind": target.kind,
                "identity": target.identity,
                "url": target.url,
                "table": target.table,
                "path": None if target.path is None else str(target.path),
            },
            "run": {"job": FedRun.of(run).job, "run_id": run.run_id, "path": str(run.path)},
            "offset": offset,
            "parent": os.getpid(),
        }
        read_end, self._pipe = os.pipe()  # both ends close on exec: the feeder is handed its own
        try:
            self._proc = subprocess.Popen(
                _COMMAND, stdin=read_end, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        except OSError:
            os.close(self._pipe)
            raise
        finally:
            os.close(read_end)
        os.write(self._pipe, orjson.dumps(params) + b"\n")  # well under the pipe's 64 KiB: no wait
        os.set_blocking(self._pipe, False)
        self._untold: int | None = None  # an offset a full pipe refused; the next commit's supersedes it

    @property
    def pid(self) -> int:
        """The feeder's process id (kept off the relay's CPU: relay/affinity.py)."""
        return self._proc.pid

    def on_commit(self, _entries: object, end_offset: int) -> None:
        """Tell the feeder the journal is committed up to `end_offset`; never waits. Each message is
        shorter than PIPE_BUF, so it is written whole or not at all."""
        if self._pipe < 0:
            return
        try:
            os.write(self._pipe, b"%d\n" % end_offset)
            self._untold = None
        except BlockingIOError:  # the feeder is behind by 64 KiB of offsets: it reads the newest later
            self._untold = end_offset
        except OSError:  # it ended (a sink it cannot write): the run's last catch-up feeds the sink
            self._close_pipe()

    def close(self) -> None:
        """Tell the feeder the last offset, end the pipe and wait for it to feed what it was told."""
        if self._pipe >= 0 and self._untold is not None:
            os.set_blocking(self._pipe, True)
            with contextlib.suppress(OSError):
                os.write(self._pipe, b"%d\n" % self._untold)
        self._close_pipe()
        out, err = self._proc.communicate()
        self.problem = self._problem_of(out, err)

    def _close_pipe(self) -> None:
        if self._pipe >= 0:
            os.close(self._pipe)
            self._pipe = -1

    def _problem_of(self, out: bytes, err: bytes) -> SinkUnavailable | None:
        try:
            said: Any = orjson.loads(out.splitlines()[-1])
            problem = said["problem"]
            return None if problem is None else SinkUnavailable(problem["identity"], problem["reason"])
        except (IndexError, orjson.JSONDecodeError, KeyError, TypeError):
            detail = (err.decode(errors="replace").strip().splitlines() or [""])[-1]
            reason = f"its feeder exited with status {self._proc.returncode}: {detail}".rstrip(": ")
            return SinkUnavailable(self._target.identity, reason)


# ---------------------------------------------------------------------------------------------------
# The feeder's side


@dataclass
class _Told:
    """What the pipe said: the newest committed end offset, and whether the pipe has ended."""

    fd: int
    offset: int = 0
    ended: bool = False
    _tail: bytes = b""

    def first_line(self) -> bytes:
        """The pipe's first line (the parameters); the offsets read with it are taken."""
        while b"\n" not in self._tail:
            data = os.read(self.fd, _READ_BYTES)
            if not data:
                raise SystemExit("the run closed the pipe before the parameters")
            self._tail += data
        line, _, self._tail = self._tail.partition(b"\n")
        self._take(b"")
        return line

    def read(self, timeout: float | None) -> None:
        """Take what the pipe holds, waiting for it up to `timeout` seconds (None: until it says)."""
        if not select.select([self.fd], [], [], timeout)[0]:
            return
        data = os.read(self.fd, _READ_BYTES)
        if not data:
            self.ended = True
        self._take(data)

    def _take(self, data: bytes) -> None:
        lines = (self._tail + data).split(b"\n")
        self._tail = lines.pop()
        if lines:
            self.offset = max(self.offset, int(lines[-1]))


def _feed(told: _Told, target: SinkTarget, run: FedRun, start: int) -> tuple[int, SinkUnavailable | None]:
    """Upsert what the run commits until the pipe ends; (the offset of the journal the sink holds, why
    the sink could not be written, if it could not)."""
    reached = asked = start  # what the sink holds; what was last read for (reached, unless a line was bad)
    fed_at, saved_at = 0.0, time.monotonic()
    try:
        writer = open_writer(target)
    except SinkUnavailable as exc:
        return reached, exc
    try:
        while True:
            due = fed_at + _FEED_EVERY_SECONDS
            behind = told.offset > asked
            if behind and (told.ended or time.monotonic() >= due):
                fed_at, asked = time.monotonic(), told.offset
                for _, at in upsert_groups(writer, run, reached, asked):
                    reached = at
                if time.monotonic() - saved_at >= _PROGRESS_EVERY_SECONDS:
                    save_progress(run, target, reached)
                    saved_at = time.monotonic()
            elif told.ended:
                return reached, None
            else:
                told.read(max(0.0, due - time.monotonic()) if behind else None)
    except SinkUnavailable as exc:
        return reached, exc
    finally:
        save_progress(run, target, reached)
        writer.close()


def main() -> int:
    no_core_dumps()  # it reads the rows' outcomes and may hold the sink's password
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the run's to handle: it ends the pipe
    told = _Told(sys.stdin.fileno())
    params = orjson.loads(told.first_line())
    told.offset = max(told.offset, params["offset"])
    if not die_with_parent(params["parent"]):
        raise SystemExit("the run ended before its feeder started")
    spec = params["target"]
    path = None if spec["path"] is None else Path(spec["path"])
    target = SinkTarget(spec["kind"], spec["identity"], spec["url"], spec["table"], path)
    run = FedRun(params["run"]["job"], params["run"]["run_id"], Path(params["run"]["path"]))
    reached, problem = _feed(told, target, run, params["offset"])
    said = None if problem is None else {"identity": problem.identity, "reason": problem.reason}
    sys.stdout.buffer.write(orjson.dumps({"offset": reached, "problem": said}) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
