"""`request.compression: gzip`: every body sent gzip-compressed, with `Content-Encoding: gzip`.

A row's body is compressed whole. A batch's body is compressed as a stream, one piece at a time (the
envelope's head, each item with its separator, the tail), each item ended by a sync flush: the bytes
written so far are then exactly known, so a batch closes before the item that would take its
compressed body over `max_bytes` (`GzipMeter`), and the request built from the same items later
(`gzip_pieces`) is those very bytes. Both are deterministic (no time in the gzip header), so a crash
forms the same requests again, byte for byte.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from bulkrelay.job.records import PreparedRequest

CONTENT_ENCODING = ("Content-Encoding", "gzip")
_LEVEL = 6
_GZIP_WBITS = 31  # a gzip header and trailer around the deflate stream; zlib writes no time into it


def _compressor() -> zlib._Compress:
    return zlib.compressobj(_LEVEL, zlib.DEFLATED, _GZIP_WBITS)


def _finish_bound(tail: bytes) -> int:
    """The most the tail and the stream's end can add: its bytes as literals (9 bits at most each in a
    fixed Huffman block), the end block and the gzip trailer."""
    return len(tail) * 9 // 8 + 16


def gzip_request(request: PreparedRequest) -> PreparedRequest:
    """`request` with its body compressed and Content-Encoding set (a request without a body as it is)."""
    if request.body is None:
        return request
    compressor = _compressor()
    body = compressor.compress(request.body) + compressor.flush()
    return PreparedRequest(request.method, request.url, (*request.headers, CONTENT_ENCODING), body)


def gzip_pieces(head: bytes, pieces: Iterable[bytes], tail: bytes) -> bytes:
    """The compressed body of `head`, the pieces and `tail`, each piece ended by a sync flush: the bytes
    `GzipMeter` measured."""
    compressor = _compressor()
    out = [compressor.compress(head)]
    for piece in pieces:
        out.append(compressor.compress(piece))
        out.append(compressor.flush(zlib.Z_SYNC_FLUSH))
    out.append(compressor.compress(tail))
    out.append(compressor.flush())
    return b"".join(out)


class GzipMeter:
    """The compressed size of a batch's body as its items join it, for the rule that closes a batch."""

    def __init__(self, head: bytes, tail: bytes) -> None:
        self._compressor = _compressor()
        self._written = len(self._compressor.compress(head))
        self._finish = _finish_bound(tail)

    def size(self) -> int:
        """The body's compressed size, at most, were it closed now."""
        return self._written + self._finish

    def add_if_fits(self, piece: bytes, max_bytes: int, force: bool = False) -> bool:
        """Add `piece` (an item, with its separator) if the body stays within `max_bytes` (or `force`:
        a batch's first item always joins it); False leaves the body as it was."""
        trial = self._compressor.copy()
        written = len(trial.compress(piece)) + len(trial.flush(zlib.Z_SYNC_FLUSH))
        if not force and self._written + written + self._finish > max_bytes:
            return False
        self._compressor, self._written = trial, self._written + written
        return True
