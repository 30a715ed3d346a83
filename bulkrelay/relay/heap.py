"""The garbage collector's settings while rows are relayed.

Everything built before the relay starts (modules, the job's models, preflight's tables) lives until
the process ends, yet every full collection walks it again; and a run keeps hundreds of rows' objects
alive at once (the window, the journal's queue), so the default young-generation threshold (700
allocations) runs a collection every few rows. Frozen out of collections and with young collections
rarer, a batched run costs about 3 % fewer instructions a row (benchmarks/bench_instructions.py).
The garbage already made is collected before the freeze, and cycles made while relaying still are:
peak RSS stays what it was (71.5 MiB at 100k rows, benchmarks/bench_run.py (d)).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# Young collections once this many objects more were allocated than freed. Reference counting frees
# a row's objects as soon as its result is committed, so this counts what is still in flight or in a
# cycle, a few MiB at most.
RELAY_YOUNG_THRESHOLD = 50_000


@contextmanager
def relay_collections() -> Iterator[None]:
    """While relaying: the heap built so far frozen, young collections rarer; as before afterwards."""
    before = gc.get_threshold()
    gc.collect()  # first: frozen, the garbage preflight left in cycles would stay (16 MiB at 100k rows)
    gc.freeze()
    gc.set_threshold(RELAY_YOUNG_THRESHOLD, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
