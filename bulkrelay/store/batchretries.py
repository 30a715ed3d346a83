"""`batch-retries.jsonl`: the requests a batch run sent again, so a resumed run sends them under the
same Idempotency-Key.

A request's key is derived from its items' ids, so a request of other rows has another key whatever
process sends it. Only the very rows of a request sent again (every row an answer left retryable: an
Elasticsearch item 429 for each) need a number in their key: under the first request's key, a target
that keeps keys would replay its old answer, the same 429, for ever. The number counts the requests of
exactly those rows sent before, which the journal (final results only) cannot tell, so each is written
here (and fsynced) before its request leaves:

    {"retry": 3, "rows": [7, 14]}

A second kind of line keeps the body size a 413 taught the run (issue 43): batches formed from row
`from_row` on hold at most `max_bytes` bytes, so that the same pending rows form the same requests
after a crash as before it:

    {"max_bytes": 51234, "from_row": 4001}

`rows` are the rows the request carries, in order. A resumed run whose pending rows of a batch are
exactly the rows of such a line sends them under that line's key (the latest line for those rows), so a
target that dedups by key replays what it answered, and applies nothing twice; pending rows of no line
go under their ids alone, as the crashed process sent them, or would have (a crash during an item 429's
backoff: issue 38). So a key depends on the rows and the answers they got, never on the process: the
identical re-run of the job (a new run, a full job's keys being its content's, docs/resume.md) gets its
predecessor's answers replayed and sends the same requests under the same keys. A line cut by a crash
is passed over: its request never left.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import orjson

from bulkrelay.private import open_private
from bulkrelay.store.storage import Storage

RETRIES_FILE = "batch-retries.jsonl"


class BatchRetries:
    """The run's requests of the same rows sent again (earlier processes' to reuse, and this one's), and
    the batch sizes 413s taught it."""

    def __init__(self, path: Path, storage: Storage) -> None:
        self._path = path
        self._storage = storage
        self._earlier: dict[tuple[int, ...], int] = {}  # rows -> the latest number an earlier process gave
        self.sizes: list[tuple[int, int]] = []  # (from_row, max_bytes) a 413 taught, in order
        lines, self._cut = _read(path)  # _cut: the file ends inside a line a crash cut
        for entry in lines:
            if "retry" in entry:
                number, rows = entry["retry"], tuple(entry["rows"])
                if isinstance(number, int) and all(isinstance(row, int) for row in rows):
                    self._earlier[rows] = number
            elif isinstance(entry.get("from_row"), int) and isinstance(entry.get("max_bytes"), int):
                self.sizes.append((entry["from_row"], entry["max_bytes"]))

    def earlier(self, rows: Sequence[int]) -> int | None:
        """The number an earlier process sent these rows under, once: this process's next request of the
        same rows is a new one (its answer is not that request's)."""
        return self._earlier.pop(tuple(rows), None)

    async def record(self, rows: Sequence[int], number: int) -> None:
        """`number` for a request of `rows`, durable before this returns (before it leaves)."""
        await self._write({"retry": number, "rows": list(rows)})

    async def record_size(self, from_row: int, max_bytes: int) -> None:
        """Batches formed from `from_row` on hold at most `max_bytes`: durable before this returns (before
        any is formed so)."""
        await self._write({"max_bytes": max_bytes, "from_row": from_row})

    async def _write(self, entry: dict[str, object]) -> None:
        line = orjson.dumps(entry) + b"\n"
        if self._cut:  # end the cut line first, or the first new line would join it and be lost
            line, self._cut = b"\n" + line, False
        await anyio.to_thread.run_sync(self._append, line)

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


def _read(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """The whole lines of the file, in order, none when it does not exist; and whether it ends inside a
    line."""
    try:
        with open(path, "rb", opener=open_private) as stream:  # a link there is refused: RUN_DIR_UNSAFE
            data = stream.read()
    except FileNotFoundError:
        return [], False
    found = []
    for line in data.split(b"\n"):
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # the end of a line a crash cut (or an empty line): that request never left
        if isinstance(entry, dict) and (isinstance(entry.get("rows"), list) or "retry" not in entry):
            found.append(entry)
    return found, not data.endswith(b"\n") and bool(data)
