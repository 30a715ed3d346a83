"""The lines of an input's (decompressed) text, as the text formats read them: a UTF-8 byte order mark
taken off the first, in blocks of whole lines for a check that looks at many lines in one call, and never
one longer than `MAX_LINE_BYTES` held in memory: a gzip bomb inflating to one line of gigabytes is read
past in chunks, its line handed on as `TOO_LONG`, so memory stays bounded by the limit."""

from __future__ import annotations

import codecs
import io
import itertools
from collections.abc import Iterator
from typing import BinaryIO

READ_BUFFER = 1 << 16
# The longest line a reader holds: longer ones are refused naming their line (docs/inputs.md).
MAX_LINE_BYTES = 16 << 20
# What stands for a line longer than the limit: no line read can hold a newline before its end, and
# the byte after it is no UTF-8, so the CSV reader's decoding refuses it where the lines are decoded.
TOO_LONG = b"\n\xff(too long)"


def too_long_message(limit: int = MAX_LINE_BYTES) -> str:
    return f"the line is longer than {limit:,} bytes (the longest line an input may hold)"


def line_blocks(stream: BinaryIO, limit: int = MAX_LINE_BYTES) -> Iterator[list[bytes]]:
    """The lines of a binary stream, ends kept (a UTF-8 byte order mark removed from the first), in
    lists of whole lines of about READ_BUFFER bytes. A line longer than `limit` is read to its end and
    dropped, and `TOO_LONG` stands in its place: its bytes are never all in memory at once."""
    carry = bytearray()  # the start of a line that the chunks read so far have not ended
    # One read at a time (`read1`): what a pipe or FIFO has now, not a wait for a whole buffer, so rows
    # come as they arrive and a signal is noticed between reads (tests/ops/test_signals.py).
    read = getattr(stream, "read1", stream.read)
    chunk = read(READ_BUFFER)
    if chunk.startswith(codecs.BOM_UTF8):
        chunk = chunk[len(codecs.BOM_UTF8) :]
    while chunk:
        end = chunk.rfind(b"\n")
        if end < 0:
            carry += chunk
            if len(carry) > limit:
                carry = bytearray(_skip_line(stream))
                yield [TOO_LONG]
        else:
            first_end = chunk.find(b"\n") + 1
            if len(carry) + first_end > limit:
                yield [TOO_LONG]
                carry.clear()
                chunk = chunk[first_end:]
                continue
            carry += chunk[: end + 1]
            yield io.BytesIO(carry).readlines()
            carry = bytearray(chunk[end + 1 :])
        chunk = read(READ_BUFFER)
    if carry:
        yield [TOO_LONG if len(carry) > limit else bytes(carry)]


def _skip_line(stream: BinaryIO) -> bytes:
    """Read past the rest of a line; what follows its newline in the last chunk read (b"" at the end)."""
    read = getattr(stream, "read1", stream.read)
    while chunk := read(READ_BUFFER):
        end = chunk.find(b"\n")
        if end >= 0:
            return chunk[end + 1 :]
    return b""


def lines_of(stream: BinaryIO, limit: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """`line_blocks`, one line at a time (chained in C: no Python frame a line)."""
    return itertools.chain.from_iterable(line_blocks(stream, limit))
