"""Delta and mirror sync: which rows changed since their last delivery, the sync state that remembers
deliveries, the line scan that spares preflight the unchanged lines, a mirror job's deletions, and the
runs a newer night has overtaken. `ops/` enters only through this face (tests/test_architecture.py).

The face loads each entry point's module at its first use (PEP 562), not when the package is imported:
the line scan runs as `python -m bulkrelay.sync.linescan`, which imports this package first, and it is
meant to start on the standard library and orjson (0.06 s of CPU), not on every module a delta run needs
(0.4 s of imports, the job's pydantic schema among them)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bulkrelay.sync.delta import DeltaStart, record_deliveries, shared_slot, sync_manifest
    from bulkrelay.sync.linescan import LineScanFailed
    from bulkrelay.sync.mirror import deletion_job, discard, job_of_run
    from bulkrelay.sync.needed_runs import runs_state_needs
    from bulkrelay.sync.night import gone_keys, open_night
    from bulkrelay.sync.state import StateCheck, job_identity, rebuild_state, verify_state
    from bulkrelay.sync.superseded import overtaken_by, refuse_superseded

_HOMES = {
    "DeltaStart": "delta",
    "record_deliveries": "delta",
    "shared_slot": "delta",
    "sync_manifest": "delta",
    "LineScanFailed": "linescan",
    "deletion_job": "mirror",
    "discard": "mirror",
    "job_of_run": "mirror",
    "runs_state_needs": "needed_runs",
    "gone_keys": "night",
    "open_night": "night",
    "StateCheck": "state",
    "job_identity": "state",
    "rebuild_state": "state",
    "verify_state": "state",
    "overtaken_by": "superseded",
    "refuse_superseded": "superseded",
}

__all__ = [
    "DeltaStart",
    "LineScanFailed",
    "StateCheck",
    "deletion_job",
    "discard",
    "gone_keys",
    "job_identity",
    "job_of_run",
    "open_night",
    "overtaken_by",
    "rebuild_state",
    "record_deliveries",
    "refuse_superseded",
    "runs_state_needs",
    "shared_slot",
    "sync_manifest",
    "verify_state",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # the next use is a plain attribute
    return value
