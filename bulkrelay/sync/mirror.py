"""`sync: mirror`: keys delivered before and gone from tonight's input get the `mirror` request.

The deletions are found after preflight has read the whole input (tonight's keys against the sync
state), counted against `mirror.max_deletes` before anything is sent, and written to a small JSON
Lines file. After the night's own run has finished they are sent by a second run whose input is
that file and whose request is the `mirror` one; its committed successes take the keys out of the
sync state. A crash in between is healed by the identical command: it catches the state up and
finds the keys still to delete again.
"""

from __future__ import annotations

import itertools
import os
import time
import unicodedata
from collections.abc import Iterable
from pathlib import Path

import orjson

from bulkrelay.errors import ConfigChanged, MirrorKeyCollision, RunLocked, TooManyDeletes
from bulkrelay.job.config import InputConfig, Job, JobConfig, MirrorConfig, RequestConfig
from bulkrelay.store.rundir import RunDir, RunState, is_locked
from bulkrelay.sync.state import SyncState

SUPERSEDED = "superseded"  # a deletion run ended by the next night of its job, which finds them again


def _nfc(key: str) -> str:
    return unicodedata.normalize("NFC", key)


def _caseless(key: str) -> str:
    """One form for keys that differ only by case or Unicode form (`Zoë` in NFC or NFD, `ABC`/`abc`)."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", key).casefold())


_NORMAL = {"nfc": _nfc, "casefold": _caseless, None: _caseless}
_EXAMPLES = 5


def _match_keys(state: SyncState, mirror: MirrorConfig) -> None:
    """Compare tonight's gone keys with tonight's keys as `mirror.key_match` says: a gone key that is a
    key of tonight in the chosen form is not deleted (the upsert is that record); unset, such a pair
    refuses the night, since deleting either way may lose a live record."""
    if mirror.key_match == "exact":
        return
    paired = state.match_gone(_NORMAL[mirror.key_match])
    if paired and mirror.key_match is None:
        first = itertools.islice(state.twins(), _EXAMPLES)
        examples = [{"gone": gone, "tonight": seen} for gone, seen in first]
        shown = ", ".join(f"{pair['gone']!r} (gone) and {pair['tonight']!r} (tonight)" for pair in examples)
        raise MirrorKeyCollision(
            f"{paired} keys to delete differ from tonight's keys only by case or Unicode form: {shown}; "
            "deleting them after the upsert would delete the record on a target that does not tell them "
            "apart. Nothing was sent",
            context={"collisions": paired, "examples": examples},
            suggestion="set mirror.key_match: casefold (the target ignores case), nfc (it normalizes "
            "Unicode) or exact (it tells them apart: delete them)",
        )


def check_and_spool(state: SyncState, job: Job, spool_dir: Path) -> tuple[Path | None, int]:
    """Write tonight's deletions to a spool file (None when there are none) and count them;
    `MirrorKeyCollision` when a key to delete is one of tonight's in another form (`key_match` unset),
    `TooManyDeletes` when they exceed `mirror.max_deletes`, before anything is sent."""
    mirror = job.config.mirror
    key_field = job.config.input.key
    assert mirror is not None and key_field is not None
    _match_keys(state, mirror)
    spool_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = spool_dir / f"deletions-{os.getpid()}-{time.time_ns()}.jsonl"
    count = 0
    try:
        with path.open("wb") as out:
            for key in state.missing_keys():
                out.write(orjson.dumps({key_field: key}) + b"\n")
                count += 1
            out.flush()
            os.fsync(out.fileno())  # the deletion run's input, like a spooled stdin
        _check_limit(mirror, count, state.count())
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    if count == 0:
        path.unlink()
        return None, 0
    return path, count


def _check_limit(mirror: MirrorConfig, count: int, delivered: int) -> None:
    limit = mirror.delete_limit(delivered)
    if count > limit:
        raise TooManyDeletes(
            f"{count} of the {delivered} keys delivered before are gone from this input; "
            f"mirror.max_deletes allows {limit} ({mirror.max_deletes}). Nothing was sent",
            context={"deletions": count, "delivered_keys": delivered, "limit": limit},
            suggestion="check the input export; if the deletions are meant, raise mirror.max_deletes",
        )


def deletion_job(job: Job) -> Job:
    """The job that sends the deletions: the mirror request (with the job's headers and auth), keyed input.
    An answer in `mirror.gone_statuses` (404, 410) is a success: the record is already gone, which
    is what the deletion was for; otherwise a key deleted by hand would fail every night."""
    config = job.config
    mirror = config.mirror
    assert mirror is not None
    success = config.response.success_statuses or tuple(range(200, 300))
    # A batch job's deletions are single requests: how a batch's answer is read is not theirs.
    gone_is_success = tuple(dict.fromkeys((*success, *mirror.gone_statuses)))
    response = config.response.model_copy(
        update={"success_statuses": gone_is_success, "capture": {}, "items": None, "on_batch_rejected": None}
    )
    request = RequestConfig.model_validate(
        {
            "method": mirror.method,
            "url": mirror.url,
            "headers": config.request.headers,
            "idempotency_key": config.request.idempotency_key,
            "auth": config.request.auth,  # the deletions need the same token as the rows
        }
    )
    derived: JobConfig = config.model_copy(
        update={
            "request": request,
            "response": response,
            "input": InputConfig(key=config.input.key, format="jsonl"),
            "execution": config.execution.model_copy(update={"sync": "full"}),
            "mirror": None,
        }
    )
    return Job(config=derived, path=job.path, base_dir=job.base_dir)


def job_of_run(run: RunDir, job: Job) -> Job:
    """The job `run` relays, from its job file's `job`: a deletion run's is derived from the mirror
    section, so `resume` and `retry-failed` of a deletion run send the deletions, not the upserts."""
    if not run.plan.mirror_deletes:
        return job
    if job.config.mirror is None:
        raise ConfigChanged(
            f"run {run.run_id} sends a mirror job's deletions, and {job.path} is no longer a mirror job",
            context={"run_dir": str(run.path), "job": str(job.path)},
            suggestion="run the job again: the next night finds what is left to delete",
        )
    return deletion_job(job)


def end_superseded(runs: Iterable[RunDir]) -> list[str]:
    """End the unfinished deletion runs of a mirror job (`cancelled`, stop reason `superseded`) when a
    new night of it starts: their committed deletions are in the state (caught up already), and the
    new night finds again what is left to delete, against tonight's input. Resumed later, an old
    deletion run would delete a key that has come back. A run some process holds is left to it."""
    ended = []
    for run in runs:
        if not run.plan.mirror_deletes or run.state.final or is_locked(run.path):
            continue
        try:
            with run.locked():
                current = RunDir.open(run.path)
                if not current.state.final:
                    current.mark_ended(RunState.CANCELLED, SUPERSEDED)
                    ended.append(run.run_id)
        except RunLocked:
            continue  # resumed meanwhile: that process ends it
    return ended


def discard(path: Path | None) -> None:
    if path is not None and path.exists():
        os.unlink(path)
