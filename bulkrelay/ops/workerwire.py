"""What a run's parent and its worker processes say to each other (`execution.workers`).

One stream socket a worker, both ways. A message is a frame: its kind (one byte), the length of its
body (four bytes, big-endian) and the body. The parent hands each worker what it needs (HANDOFF, a
pickle: the parent made it, for its own child, over a socket pair no one else holds); a worker sends
its final results a few milliseconds' worth at a time (RESULTS, the journal entries as one JSON array),
what it sent (SENT), below which row its results are all sent (SETTLED, for the run's failure rate),
each pause a target asked of it (PAUSE), and last how it ended (DONE). The parent
passes pauses on (PAUSE), tells the workers the lowest of their SETTLED rows (TURN: none runs far
ahead of it, relay/runahead.py) and asks for stops (STOP, then FORCE). A worker's results count once the
parent has journaled them; a stream cut short (a worker killed) loses only its frame in the making.
"""

from __future__ import annotations

import enum
import struct
from typing import Any

import orjson
from anyio.streams.buffered import BufferedByteReceiveStream

from bulkrelay.store.journal import JournalEntry
from bulkrelay.store.journal.rows import entry_with

_HEADER = struct.Struct(">BI")
MAX_FRAME_BYTES = 1 << 30  # a longer frame is not ours: the stream is broken


class Kind(enum.IntEnum):
    HANDOFF = 1  # parent → worker: the pickled WorkerHandoff
    RESULTS = 2  # worker → parent: final results, a JSON array of journal entries
    SENT = 3  # worker → parent: RelayStats.sent() so far
    PAUSE = 4  # either way: {"until": a monotonic deadline} a 429 asked for
    STOP = 5  # parent → worker: {"reason": a StopReason's value}
    FORCE = 6  # parent → worker: a forced stop (a second Ctrl+C, a stall's grace over)
    DONE = 7  # worker → parent: {"reason", "detail", "forced", "sent"}: its last word
    SETTLED = 8  # worker → parent: {"below": N | null}: every row below N it took has its result sent
    TURN = 9  # parent → worker: {"turn": N | null}: the lowest SETTLED of all (null: all ended)


def frame(kind: Kind, body: bytes) -> bytes:
    return _HEADER.pack(kind, len(body)) + body


def json_frame(kind: Kind, value: Any) -> bytes:
    return frame(kind, orjson.dumps(value, default=str))  # a stop's detail may hold an exception


def results_frame(entries: list[JournalEntry]) -> bytes:
    return frame(Kind.RESULTS, orjson.dumps(entries))  # orjson writes a dataclass's fields in order


def entries_of(body: bytes) -> list[JournalEntry]:
    """The entries of a RESULTS body: every field, in field order, as the worker's entries had them."""
    return [entry_with(fields) for fields in orjson.loads(body)]


async def receive(stream: BufferedByteReceiveStream) -> tuple[Kind, bytes]:
    """The next frame; `anyio.IncompleteRead` or `EndOfStream` when the stream ends."""
    kind, length = _HEADER.unpack(await stream.receive_exactly(_HEADER.size))
    if length > MAX_FRAME_BYTES:
        raise ValueError(f"a frame of {length} bytes: not a worker's")
    return Kind(kind), await stream.receive_exactly(length) if length else b""
