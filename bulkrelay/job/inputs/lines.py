"""The lines of an input's (decompressed) text, as the text formats read them: a UTF-8 byte order mark
taken off the first, and blocks of whole lines for a check that looks at many lines in one call."""

from __future__ import annotations

import codecs
import itertools
from collections.abc import Iterable, Iterator
from typing import BinaryIO

READ_BUFFER = 1 << 16


def without_bom(lines: BinaryIO) -> Iterator[bytes]:
    """The lines of a binary stream, with a UTF-8 byte order mark removed from the first one."""
    first = lines.readline()
    if first.startswith(codecs.BOM_UTF8):
        first = first[len(codecs.BOM_UTF8) :]
    head: Iterable[bytes] = (first,) if first else ()
    return itertools.chain(head, lines)


def line_blocks(stream: BinaryIO) -> Iterator[list[bytes]]:
    """The lines of a binary stream (a UTF-8 byte order mark removed from the first) in lists of whole
    lines of about READ_BUFFER bytes, so that a check can look at many lines in one call."""
    block = list(itertools.islice(without_bom(stream), 1))
    while block := block + stream.readlines(READ_BUFFER):
        yield block
        block = []
