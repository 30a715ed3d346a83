"""`render` for a batch job: the named rows' items formed into batches as a fresh run sends them (the
rule of relay/batches.py, with no row journaled yet), each shown as its one request, secrets `***`."""

from __future__ import annotations

from collections.abc import Sequence

from bulkrelay.job.batch import BatchRenderer, Item
from bulkrelay.ops.results import RenderedRequest


def rendered_batches(batcher: BatchRenderer, items: Sequence[Item]) -> list[RenderedRequest]:
    """The requests carrying `items` (in input order), one a batch."""
    batches: list[list[Item]] = []
    item_bytes = 0
    for item in items:
        current = batches[-1] if batches else []
        if (
            not batches
            or not batcher.fits(len(current), item_bytes, item)
            or batcher.group_of(item.record) != batcher.group_of(current[0].record)
        ):
            batches.append([item])
            item_bytes = len(item.data)
        else:
            current.append(item)
            item_bytes += len(item.data)
    return [_shown(batcher, seq, batch) for seq, batch in enumerate(batches, start=1)]


def _shown(batcher: BatchRenderer, seq: int, batch: list[Item]) -> RenderedRequest:
    request, _ = batcher.request(batch)
    shown = batcher.redact(request)
    first = batch[0].record
    rows = [item.row_number for item in batch]
    size = len(request.body or b"")
    return RenderedRequest(
        first.row_number,
        first.line,
        shown["method"],
        shown["url"],
        tuple((name, value) for name, value in shown["headers"]),
        shown["body"],
        batch={"seq": seq, "rows": rows, "size": len(batch), "bytes": size},
    )
