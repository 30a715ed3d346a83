"""`batch-retries.jsonl`: the requests a batch run sent again, so a resumed run sends them under the
same Idempotency-Key.

A batch's first request carries a key derived from its items alone, which a crash cannot change. The
rows an answer left retryable (an Elasticsearch item 429) go again in a request of their own, which
needs a key of its own: under the first request's key, a target that keeps keys would replay its old
answer, the same 429, for ever. Such a key cannot be derived from the journal, which holds final
results only, so each is written here (and fsynced) before its request leaves:

    {"retry": 3, "rows": [7, 14]}

`retry` numbers the requests of these same rows sent again, from 1; `rows` are the rows the request
carries, in order. A resumed run whose pending rows of a batch are exactly the rows of such a line sends
them under that line's key (the latest line for those rows), so a target that dedups by key replays what
it answered, and applies nothing twice. Numbered by their rows, not by the run, the requests of an
identical re-run of the job come out under the keys its predecessor sent (a full job's keys are its
content's, docs/resume.md), so a target that keeps keys answers them as before. A line cut by a crash
is passed over: its request never left.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio
import orjson

from bulkrelay.private import open_private
from bulkrelay.store.storage import Storage

RETRIES_FILE = "batch-retries.jsonl"


class BatchRetries:
    """The run's requests sent again: those of earlier processes to reuse, the next number of each rows'."""

    def __init__(self, path: Path, storage: Storage) -> None:
        self._path = path
        self._storage = storage
        self._earlier: dict[tuple[int, ...], int] = {}  # rows -> the latest number an earlier process gave
        for number, rows in _read(path):
            self._earlier[rows] = number
        self._last = dict(self._earlier)  # rows -> the highest number given them in this run

    def earlier(self, rows: Sequence[int]) -> int | None:
        """The number an earlier process sent these rows under, once: this process's next request of the
        same rows is a new one (its answer is not that request's)."""
        return self._earlier.pop(tuple(rows), None)

    async def record(self, rows: Sequence[int]) -> int:
        """The next number for a request of `rows`, durable before this returns (before it leaves)."""
        key = tuple(rows)
        number = self._last[key] = self._last.get(key, 0) + 1
        line = orjson.dumps({"retry": number, "rows": list(rows)}) + b"\n"
        await anyio.to_thread.run_sync(self._append, line)
        return number

    def _append(self, line: bytes) -> None:
        storage, created = self._storage, not self._path.exists()
        fd = storage.open_append(self._path)
        try:
            storage.write(fd, line)
            storage.fsync(fd)
        finally:
            storage.close(fd)
        if created:
            storage.fsync_dir(self._path.parent)  # the new file's name survives a power loss too


def _read(path: Path) -> list[tuple[int, tuple[int, ...]]]:
    """The whole lines of the file, in order ((number, rows)); none when it does not exist."""
    try:
        with open(path, "rb", opener=open_private) as stream:  # a link there is refused: RUN_DIR_UNSAFE
            data = stream.read()
    except FileNotFoundError:
        return []
    found = []
    for line in data.split(b"\n"):
        try:
            entry = orjson.loads(line)
            number, rows = entry["retry"], tuple(entry["rows"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue  # the end of a line a crash cut (or an empty line): that request never left
        if isinstance(number, int) and all(isinstance(row, int) for row in rows):
            found.append((number, rows))
    return found
