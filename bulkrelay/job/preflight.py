"""Preflight: one streaming pass over the input that must succeed before any request is sent.

It computes the input fingerprint and the semantic config fingerprint, renders every record's
request, and collects problems (up to `MAX_PROBLEMS`, with file, line, row and field).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from bulkrelay.errors import ConfigInvalid, InputInvalid, Problem, SecretInvalid, UsageError
from bulkrelay.job.batch import BatchRenderer
from bulkrelay.job.bulkcsv import BulkCsv
from bulkrelay.job.config import WHOLE_SECRET, Job, redis_url_problem, required_fields
from bulkrelay.job.digest import RequestDigester
from bulkrelay.job.fingerprint import config_fingerprint
from bulkrelay.job.groups import GroupCheck, batch_renderer
from bulkrelay.job.inputs import (
    ExpectedInput,
    InputFingerprint,
    InputIdentity,
    InputSpec,
    detect_format,
    open_records,
)
from bulkrelay.job.inputs.lookups import LookupMissed
from bulkrelay.job.inputs.query import QUERY_NAME, database_of
from bulkrelay.job.keycheck import DuplicateKeyFinder
from bulkrelay.job.records import PreparedRequest, Record
from bulkrelay.job.redact import Redactor
from bulkrelay.job.request import RenderError, RequestRenderer, RowRequests, job_renderer
from bulkrelay.job.template import resolve_secrets

MAX_PROBLEMS = 20
_KEYS_LISTED = 50  # at most this many of the input's field names in a message

RowsRead = Callable[[int], None]  # told how many records preflight has read so far


@dataclass(frozen=True)
class Preflight:
    """Everything a run needs to know before it starts sending."""

    job: Job
    input_spec: InputSpec
    input_fingerprint: InputFingerprint
    config_fingerprint: str
    renderer: RequestRenderer
    # What the relay must read again: these bytes (region by region) of this file (None: not preflighted
    # from a file). Kept in memory only: a resume's own preflight reads the input again.
    expected_input: ExpectedInput | None = None
    digester: RequestDigester | None = None  # a delta job: journal lines carry each row's digest
    batcher: BatchRenderer | None = None  # a batch job (request.batch): each row's item, many a request
    bulk: BulkCsv | None = None  # a bulk job (request.bulk_job): each row's CSV line, many a job
    shared_limit: str | None = None  # the Redis URL of a shared rate limit, its ${NAME} resolved
    lookup_misses: int = 0  # rows whose key a lookup with `on_miss: skip` lacks: journaled unsent

    @property
    def record_count(self) -> int:
        return self.input_fingerprint.record_count

    @property
    def input_identity(self) -> InputIdentity | None:
        """The file preflight read, in the state it read it."""
        return None if self.expected_input is None else self.expected_input.identity

    def row_requests(self, delivery: str | None = None) -> RowRequests:
        """Each row's request with its idempotency key, scoped to a delta job's delivering run."""
        return RowRequests(
            self.renderer, self.config_fingerprint, self.job.config.input.key, delivery=delivery
        )

    def kept_at(self, path: Path) -> Preflight:
        """This preflight of the same bytes, now kept at `path` (a spool its run took). A rename keeps
        the file's identity; a copy across file systems makes a new file, so the identity is taken
        again here. The relay still checks the bytes it reads against the fingerprint."""
        kept = replace(self, input_spec=replace(self.input_spec, path=path))
        if self.expected_input is None:
            return kept
        expected = replace(self.expected_input, identity=InputIdentity.of_path(path))
        return replace(kept, expected_input=expected)


@dataclass(frozen=True)
class PreflightFacts:
    """What a preflight found, without what it compiled (a renderer holds closures, which do not
    pickle): what a run hands each of its worker processes, so that none reads the input through
    again to validate it. The worker compiles the job's renderer anew from the same job."""

    job: Job  # without its lookups: a worker reads the maps the run froze
    input_spec: InputSpec
    input_fingerprint: InputFingerprint
    config_fingerprint: str
    expected_input: ExpectedInput | None
    shared_limit: str | None
    lookup_misses: int

    @classmethod
    def of(cls, preflight: Preflight) -> PreflightFacts:
        return cls(
            job=replace(preflight.job, lookups={}),
            input_spec=preflight.input_spec,
            input_fingerprint=preflight.input_fingerprint,
            config_fingerprint=preflight.config_fingerprint,
            expected_input=preflight.expected_input,
            shared_limit=preflight.shared_limit,
            lookup_misses=preflight.lookup_misses,
        )

    def preflight(self, lookups: Mapping[str, Mapping[str, Any]], env: Mapping[str, str]) -> Preflight:
        """The preflight these facts came from, its renderer compiled again (with `lookups`, the run's
        frozen maps, and `env`, the environment the parent read its secrets from)."""
        job = replace(self.job, lookups=lookups)
        renderer, digester = _renderer_and_digester(job, env)
        fingerprint_of_config = config_fingerprint(job.config)
        if fingerprint_of_config != self.config_fingerprint:  # the same job object: never, unless a bug
            raise UsageError(
                "a worker compiled another job than its run's (the configuration fingerprints differ)"
            )
        return Preflight(
            job=job,
            input_spec=self.input_spec,
            input_fingerprint=self.input_fingerprint,
            config_fingerprint=fingerprint_of_config,
            renderer=renderer,
            expected_input=self.expected_input,
            digester=digester,
            batcher=batch_renderer(job.config, renderer, fingerprint_of_config),
            bulk=BulkCsv.of_job(job.config),
            shared_limit=self.shared_limit,
            lookup_misses=self.lookup_misses,
        )


def resolve_input(
    job: Job,
    input_override: Path | None,
    name: str | None = None,
    env: Mapping[str, str] | None = None,
    source: str | None = None,
) -> InputSpec:
    """The input named by `--input` (already spooled when it was stdin), else the job file's.
    `name` is what messages call it (STDIN_NAME for a spool: its path is nobody's business). A query
    job's input is the snapshot of its query (given as the override), read as JSON Lines; so is a
    Parquet file's, whose `source` the caller gives."""
    path = input_override if input_override is not None else job.input_path
    if path is None:
        raise UsageError(
            "the job names no input file and no --input was given",
            suggestion="add input.file to the job or pass --input FILE",
        )
    source = query_source(job, os.environ if env is None else env) or source
    if source is not None and input_override is not None:
        return InputSpec(path=path, format="jsonl", gzip=False, name=name or QUERY_NAME, source=source)
    declared = job.config.input.format
    fmt, gzip = detect_format(path.name, declared)
    return InputSpec(path=path, format=fmt, gzip=gzip, delimiter=job.config.input.delimiter, name=name)


def query_source(job: Job, env: Mapping[str, str]) -> str | None:
    """A query job's database, named without credentials (a chained job's parent); None for a file job."""
    if job.config.input.results_of is not None:
        return f"results_of:{job.config.input.results_of}"
    database = job.config.input.database
    if job.config.input.query is None or database is None:
        return None
    return database_of(database, env, job.base_dir).identity


# What preflight tells a run that sends only some rows (a delta run, a shard) of each rendered record.
RowObserver = Callable[[Record, PreparedRequest], None]
# Asked first of each record read: True when the row is settled, its request known already (a delta
# run's line the state holds as delivered: the same bytes under the same job, so it rendered before
# and renders the same): preflight then neither renders nor observes it. Its key is still checked.
RowSettled = Callable[[Record], bool]


class RowWatch(NamedTuple):
    """What a row chooser gives preflight: whom to tell of each rendered record, and, if any, whom to
    ask first whether a record is settled."""

    observe: RowObserver
    settled: RowSettled | None = None


# Such a run's row chooser: given the job's digester (None: not a delta job) and the input preflight
# is about to read, what preflight tells it.
RowChooser = Callable[[RequestDigester | None, InputSpec], RowWatch]


def _renderer_and_digester(
    job: Job, env: Mapping[str, str]
) -> tuple[RequestRenderer, RequestDigester | None]:
    """The job's renderer, and for a delta job the digester its journal lines and state compare."""
    delta = job.config.execution.sync != "full"
    renderer = job_renderer(job, env)
    if not delta:
        return renderer, None
    sorted_json = renderer.sorted_json
    digester = RequestDigester(job.config.request, renderer.redactor, sorted_json=sorted_json, env=env)
    return renderer, digester


def shared_limit_url(job: Job, env: Mapping[str, str]) -> str | None:
    """Where the shared rate limit is kept: `shared` as written, or the value of the `${NAME}` it names
    (a secret: a missing one is `SECRET_MISSING`, a value that is no Redis URL `SECRET_INVALID`, each
    naming the variable, never its value)."""
    rate = job.config.execution.rate_limit
    if rate is None or rate.shared is None:
        return None
    secret = WHOLE_SECRET.match(rate.shared)
    if secret is None:
        return rate.shared
    name = secret.group(1)
    url = resolve_secrets([name], env)[name]
    problem = redis_url_problem(url)
    if problem is not None:
        raise SecretInvalid(
            f"${{{name}}} (execution.rate_limit.shared) {problem}",
            context={"secret": name, "field": "execution.rate_limit.shared"},
        )
    return url


class _ProblemCollector:
    """Keeps the first problems in full and counts the rest."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.total = 0

    def add(self, problem: Problem) -> None:
        self.total += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(problem)


class _FieldPresence:
    """Finds the fields the job needs that no record has: a typo in the job file, not in the data.

    CSV records all have the header's columns, so the first record settles it and preflight stops
    there. JSON Lines records vary, so a field is reported only when it is absent from every record;
    one that only some records lack remains an error of those rows."""

    def __init__(self, job: Job, spec: InputSpec) -> None:
        self._job = job
        self._spec = spec
        self._needed = required_fields(job.config)
        self._unseen = set(self._needed)
        self._keys: dict[str, None] = {}  # the input's field names, in order of appearance

    def add(self, record: Record) -> bool:
        """Note one record; raises `ConfigInvalid` once a CSV header shows a needed column is absent.
        False once no later record can change the outcome (the caller stops calling)."""
        if not self._unseen:
            return False
        self._unseen.difference_update(record.fields)
        if len(self._keys) < _KEYS_LISTED:
            self._keys.update(dict.fromkeys(record.fields))
        if self._fixed_fields:
            self.check()
        return bool(self._unseen)

    @property
    def _fixed_fields(self) -> bool:
        """Every record has the same fields: a CSV header's, a query's columns."""
        return self._spec.format == "csv" or self._spec.source is not None

    def check(self) -> None:
        if self._unseen and self._keys:
            raise ConfigInvalid([self._problem(name) for name in sorted(self._unseen)], phase="preflight")

    def _problem(self, name: str) -> Problem:
        keys = list(self._keys)[:_KEYS_LISTED]
        close = _closest(name, keys)
        if self._fixed_fields:
            message = f"no column {name!r} in {self._spec.display_name}; its columns: {', '.join(keys)}"
        else:
            listed = ", ".join(sorted(keys))
            message = f"no record of {self._spec.display_name} has the field {name!r}; their keys: {listed}"
        if close is not None:
            message += f" (did you mean {close!r}?)"
        return self._job.problem_at(self._needed[name], message, field=name)


def _closest(name: str, keys: list[str]) -> str | None:
    """The key `name` was most likely meant to be: the same but for case; else the longest key whose
    words it contains or that contains its words (`email` for `customer_email`, as an old export named
    it, before the nearer spelling `customer_id`); else a near spelling."""
    by_lower = {key.lower(): key for key in keys}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    words = set(_WORDS.findall(name.lower()))
    sharing = [key for lower, key in by_lower.items() if _shares_words(words, set(_WORDS.findall(lower)))]
    if sharing:
        return max(sharing, key=len)
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[close[0]] if close else None


_WORDS = re.compile(r"[a-z0-9]+")


def _shares_words(wanted: set[str], offered: set[str]) -> bool:
    return bool(wanted and offered) and (wanted <= offered or offered <= wanted)


RowCheck = Callable[[Record, Callable[[Problem], None]], None]


def _row_check(keys: DuplicateKeyFinder | None, job: Job, file: str) -> RowCheck | None:
    """Each record's checks beside its render (a duplicate key, a group out of place), reporting what
    they find; None when the job has none."""
    checks = [] if keys is None else [keys.add]
    group = job.config.request.group
    if group is not None:
        checks.append(GroupCheck(group, file).add)
    if not checks:
        return None

    def check(record: Record, report: Callable[[Problem], None]) -> None:
        for one in checks:
            if (problem := one(record)) is not None:
                report(problem)

    return check


def _render_row(
    render: Callable[[Record], PreparedRequest],
    redactor: Redactor,
    observe: RowObserver | None,
    record: Record,
    collector: _ProblemCollector,
    *,
    file: str,
) -> bool:
    """Render one row (and tell the row chooser); a row that does not render is a problem of it.
    True: a lookup with `on_miss: skip` lacks the row's key (the relay journals it unsent)."""
    try:
        request = render(record)
        if observe is not None:
            observe(record, request)
    except LookupMissed:
        return True
    except RenderError as exc:
        row, line = record.row_number, record.line
        message = redactor.redact(exc.message)  # it may quote the row's value
        collector.add(Problem(message, file=file, line=line, row=row, field=exc.field))
    return False


def run_preflight(
    job: Job,
    input_override: Path | None = None,
    env: Mapping[str, str] | None = None,
    on_rows_read: RowsRead | None = None,
    *,
    input_name: str | None = None,
    choose: RowChooser | None = None,
    source: str | None = None,
) -> Preflight:
    """Validate the whole job and input; raise `InputInvalid` with the problems found.

    `on_rows_read` hears 0 when the pass starts, then the count after every record. `choose` sees every
    record that renders, with its request, in the same pass: the rows a delta run or a shard sends are
    chosen without reading the input twice. A row it calls settled (`RowWatch`) is not rendered: its
    bytes rendered the same request under the same job before (docs/delta.md, the line scan)."""
    env = os.environ if env is None else env
    renderer, digester = _renderer_and_digester(job, env)
    shared_limit = shared_limit_url(job, env)
    spec = resolve_input(job, input_override, input_name, env, source)
    observe: RowObserver | None = None
    settled: RowSettled | None = None
    if choose is not None:
        observe, settled = choose(digester, spec)
    collector = _ProblemCollector()
    key_field = job.config.input.key
    file = spec.display_name
    keys = DuplicateKeyFinder(key_field, file, spec) if key_field else None
    row_check = _row_check(keys, job, file)
    fingerprint_of_config = config_fingerprint(job.config)
    batcher = batch_renderer(job.config, renderer, fingerprint_of_config)  # a batch or grouped job's
    # A batch job's row renders as its item (refused when it alone would cross max_bytes), with the
    # batch's URL and headers: what delta sync digests and the chooser observes.
    render = renderer.render if batcher is None else batcher.item_request
    bulk = BulkCsv.of_job(job.config)  # a bulk job's row renders as its CSV line, its key cell required
    render = render if bulk is None else bulk.item_request
    presence = _FieldPresence(job, spec)
    presence_open = True  # until the fields the job needs are settled (a CSV: its first record)
    misses = 0
    if on_rows_read is not None:
        on_rows_read(0)
    with open_records(spec, collector.add) as stream:
        for record in stream:
            if presence_open:
                presence_open = presence.add(record)
            if on_rows_read is not None:
                on_rows_read(record.row_number)
            if settled is None or not settled(record):
                misses += _render_row(render, renderer.redactor, observe, record, collector, file=file)
            if row_check is not None:
                row_check(record, collector.add)
        fingerprint = stream.fingerprint()
        expected = ExpectedInput(fingerprint, stream.identity(), stream.regions(), stream.row_starts())
    presence.check()
    if keys is not None:
        for problem in keys.duplicates(spec):
            collector.add(problem)
    if collector.total:
        raise InputInvalid(collector.problems, total=collector.total, phase="preflight")
    return Preflight(
        job=job,
        input_spec=spec,
        input_fingerprint=fingerprint,
        config_fingerprint=fingerprint_of_config,
        renderer=renderer,
        expected_input=expected,
        digester=digester,
        batcher=batcher,
        bulk=bulk,
        shared_limit=shared_limit,
        lookup_misses=misses,
    )
