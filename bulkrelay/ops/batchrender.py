"""`render` for a batch job: the named rows' items formed into batches as a fresh run sends them (the
rule of relay/batches.py, with no row journaled yet), each shown as its one request, secrets `***`."""

from __future__ import annotations

import gzip
from collections.abc import Sequence

from bulkrelay.job.batch import BatchRenderer, Item
from bulkrelay.job.config import AuthConfig
from bulkrelay.ops.results import RenderedRequest
from bulkrelay.relay.auth import shown_with_auth


def rendered_batches(
    batcher: BatchRenderer, items: Sequence[Item], auth: AuthConfig | None = None
) -> list[RenderedRequest]:
    """The requests carrying `items` (in input order), one a batch, with `auth`'s headers as `***`."""
    batches: list[list[Item]] = []
    item_bytes = 0
    meter = None
    for item in items:
        current = batches[-1] if batches else []
        if meter is not None:  # a gzip job: counted by compressed bytes, as the run forms batches
            fits = bool(batches) and batcher.fits_gzip(meter, len(current), item.data)
        else:
            fits = bool(batches) and batcher.fits(len(current), item_bytes, item)
        if not fits or batcher.group_of(item.record) != batcher.group_of(current[0].record):
            batches.append([item])
            item_bytes = len(item.data)
            meter = batcher.meter()
            if meter is not None:
                batcher.fits_gzip(meter, 0, item.data)
        else:
            current.append(item)
            item_bytes += len(item.data)
    return [_shown(batcher, seq, batch, auth) for seq, batch in enumerate(batches, start=1)]


def _shown(batcher: BatchRenderer, seq: int, batch: list[Item], auth: AuthConfig | None) -> RenderedRequest:
    request, _ = batcher.request(batch)
    size = len(request.body or b"")  # a gzip job's: compressed, as sent; its body shown inflated
    if batcher.gzip and request.body is not None:
        request = request._replace(body=gzip.decompress(request.body))
    shown = batcher.redact(shown_with_auth(auth, request))
    first = batch[0].record
    rows = [item.row_number for item in batch]
    return RenderedRequest(
        first.row_number,
        first.line,
        shown["method"],
        shown["url"],
        tuple((name, value) for name, value in shown["headers"]),
        shown["body"],
        batch={"seq": seq, "rows": rows, "size": len(batch), "bytes": size},
    )
