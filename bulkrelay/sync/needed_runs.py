"""Which runs a delta job's sync state still needs, so that `prune` and retention keep them.

The sync state is a cache of the journals (sync/state.py): `sync-state rebuild` and `verify` read
it back from them. A run whose delivery is still some key's entry is therefore needed: without its
journal, the rebuilt state forgets that key, `verify` fails, and the next night resends the row (at
a million rows, the whole base) and a mirror job never deletes the key. So is a mirror's deletion
run newer than a needed run, if it committed a deletion that no later delivery has undone: without
it, the older run's delivery of a key it deleted would come back. A run every key of which a later
delivery replaced is not needed, nor a deletion run that deleted nothing (one halted by a 401 and
ended by the next night) or whose every deleted key came back.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path

from bulkrelay.errors import BulkRelayError
from bulkrelay.store.rundir import RunDir
from bulkrelay.sync.state import (
    SyncState,
    catch_up,
    job_runs,
    manifest_identity,
    run_started,
    state_path,
)


def runs_state_needs(runs_dir: Path, candidates: Iterable[RunDir]) -> set[str]:
    """The ids of the runs, among the jobs of `candidates`, that their job's sync state needs."""
    needed: set[str] = set()
    for identity in {manifest_identity(run.plan) for run in candidates}:
        path = state_path(runs_dir, identity)
        if not path.exists():
            continue  # no state to stay true to: a rebuild makes one of whatever journals remain
        runs = job_runs(runs_dir, identity)
        try:
            with SyncState(path, identity) as state:
                catch_up(state, runs)  # a run that ended without recording its deliveries counts too
                needed |= _needed_by(state, runs)
        except (sqlite3.Error, BulkRelayError):  # unreadable now (busy, a damaged journal): keep them all
            needed.update(run.run_id for run in runs)
    return needed


def _needed_by(state: SyncState, runs: list[RunDir]) -> set[str]:
    """The runs of one job (oldest first) whose journals `state` needs: those its entries name, and
    the deletion runs after the oldest of them whose deletions it still holds to."""
    named = state.delivering_runs()
    oldest = min((run_started(run) for run in runs if run.run_id in named), default=None)
    if oldest is None:
        return named
    deletions = (r for r in runs if r.plan.mirror_deletes and run_started(r) > oldest)
    return named | {r.run_id for r in deletions if state.needs_deletions_of(r)}
