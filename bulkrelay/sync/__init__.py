"""Delta and mirror sync: which rows changed since their last delivery, the sync state that remembers
deliveries, the line scan that spares preflight the unchanged lines, a mirror job's deletions, and the
runs a newer night has overtaken. `ops/` enters only through this face (tests/test_architecture.py)."""

from bulkrelay.sync.delta import DeltaStart, record_deliveries, shared_slot, sync_manifest
from bulkrelay.sync.linescan import LineScanFailed
from bulkrelay.sync.mirror import deletion_job, discard, job_of_run
from bulkrelay.sync.needed_runs import runs_state_needs
from bulkrelay.sync.night import gone_keys, open_night
from bulkrelay.sync.state import StateCheck, job_identity, rebuild_state, verify_state
from bulkrelay.sync.superseded import overtaken_by, refuse_superseded

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
