"""Asynchronous bulk jobs (`request.bulk_job`, docs/bulk-jobs.md): one module per kind (salesforce_bulk2.py,
named_import.py, generic.py) over what they share (steps.py), and the driver
that forms jobs from pending rows and journals each row's result (`jobs.py`). `open_bulk_relay` is what
the engine calls."""

from __future__ import annotations

from collections.abc import Container
from pathlib import Path

from bulkrelay.job.preflight import Preflight
from bulkrelay.job.records import Record
from bulkrelay.relay.auth import Authenticator
from bulkrelay.relay.bulkjobs.generic import GenericBulk
from bulkrelay.relay.bulkjobs.jobs import BulkJobRelay
from bulkrelay.relay.bulkjobs.named_import import NamedImport
from bulkrelay.relay.bulkjobs.salesforce_bulk2 import SalesforceBulk2
from bulkrelay.relay.bulkjobs.steps import BulkApi
from bulkrelay.relay.metrics import RelayStats
from bulkrelay.relay.ratelimit import Limiter
from bulkrelay.relay.stopping import StopControl
from bulkrelay.relay.transport.base import Transport
from bulkrelay.store.journal import read_journal
from bulkrelay.store.journal.jobrecords import job_ledgers

__all__ = ["BulkJobRelay", "open_bulk_relay"]


def open_bulk_relay(
    preflight: Preflight,
    transport: Transport,
    limiter: Limiter,
    stop: StopControl,
    *,
    journal: Path,
    journaled: Container[int] | None,
    stats: RelayStats,
    auth: Authenticator | None,
) -> BulkJobRelay | None:
    """The job's bulk relay, attached to the jobs its journal names; None when it sends no bulk jobs."""
    bulk = preflight.bulk
    if bulk is None:
        return None
    base = preflight.renderer.render(Record(0, 0, {}))  # the base URL and headers, secrets bound
    config = preflight.job.config
    attempts = config.retry.max_attempts
    kind: type[SalesforceBulk2 | NamedImport | GenericBulk] = SalesforceBulk2
    if bulk.config.kind != "salesforce_bulk2":
        kind = NamedImport if bulk.config.kind == "named_import" else GenericBulk
    api: BulkApi = kind(
        bulk,
        transport,
        base.headers,
        stop,
        base_url=base.url,
        run_id=journal.parent.name,  # the run directory's name is the run's id
        attempts=attempts,
        limiter=limiter,
        stats=stats,
        auth=auth,  # request.auth: the relay's one authenticator, shared with nothing else in a bulk run
        halt_statuses=config.halt.on_statuses,
        redactor=preflight.renderer.redactor,
    )
    ledgers = job_ledgers(journal)
    if ledgers and journaled is None:  # a start that did not replay the journal: its rows read here
        journaled = {entry.row_number for entry in read_journal(journal)}
    return BulkJobRelay(
        bulk,
        api,
        stop,
        ledgers=ledgers,
        journaled=journaled,
        max_attempts=attempts,
        digester=preflight.digester,  # a delta job's
    )
