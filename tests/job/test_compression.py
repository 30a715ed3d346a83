"""request.compression: gzip: the meter's size is the compressed body's, which inflates to the plain one."""

from __future__ import annotations

import gzip
import random

from bulkrelay.job.compression import GzipMeter, gzip_pieces, gzip_request
from bulkrelay.job.records import PreparedRequest


def test_a_batch_closes_before_the_item_that_would_cross_max_bytes_compressed() -> None:
    rng = random.Random(3)
    items = [b'{"id":%d,"note":"%s"}' % (n, b"x" * rng.randint(0, 300)) for n in range(400)]
    head, tail = b'{"inputs":[', b"]}"
    meter, pieces = GzipMeter(head, tail), list[bytes]()
    for item in items:
        piece = b"," + item if pieces else item
        if not meter.add_if_fits(piece, 1200, force=not pieces):
            break
        pieces.append(piece)
    body = gzip_pieces(head, pieces, tail)
    assert len(body) <= meter.size() <= 1200
    assert gzip.decompress(body) == head + b"".join(pieces) + tail
    crossing = b"," + items[len(pieces)]
    assert len(gzip_pieces(head, [*pieces, crossing], tail)) > 1200 - 20  # it stopped where it had to
    assert gzip_pieces(head, pieces, tail) == body  # the same bytes again: a crash forms the same request


def test_a_rows_body_is_compressed_whole_and_says_so() -> None:
    request = PreparedRequest(
        "POST", "http://127.0.0.1:9/v1", (("Content-Type", "application/json"),), b"{}" * 50
    )
    sent = gzip_request(request)
    assert sent.body is not None and gzip.decompress(sent.body) == request.body
    assert ("Content-Encoding", "gzip") in sent.headers
    assert gzip_request(PreparedRequest("GET", "http://127.0.0.1:9/v1", (), None)).body is None
