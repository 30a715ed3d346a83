"""Delta and mirror sync: which rows changed since their last delivery, the sync state that remembers
deliveries, the line scan that spares preflight the unchanged lines, a mirror job's deletions, and the
runs a newer night has overtaken. `ops/` enters only through this face (tests/test_architecture.py).

The face loads its entry points' modules at the first name asked of it (PEP 562), not when the package
is imported: the line scan runs as `python -m bulkrelay.sync.linescan`, which imports this package first,
and it is meant to start on the standard library and orjson (0.06 s of CPU), not on every module a delta
run needs (0.4 s of imports, the job's pydantic schema among them)."""

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

# The modules whose entry points the face names, all loaded at the first name asked of it.
_MODULES = ("delta", "linescan", "mirror", "needed_runs", "night", "state", "superseded")

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
    if name not in __all__:  # a submodule (`from bulkrelay.sync import linescan`) is found by import
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    for module in (importlib.import_module(f"{__name__}.{name}") for name in _MODULES):
        globals().update(  # each name from the module that defines it, not one that imports it
            (export, value)
            for export, value in vars(module).items()
            if export in __all__ and getattr(value, "__module__", None) == module.__name__
        )
    return globals()[name]
