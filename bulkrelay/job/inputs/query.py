"""A query input (`input.query` on `input.database`), taken once into a JSON Lines snapshot.

The query runs read-only in one consistent snapshot (PostgreSQL: a REPEATABLE READ READ ONLY transaction
with a server-side cursor, rows streamed; SQLite: the file opened read-only, one read transaction), and
each row becomes one line of a private, fsynced `.jsonl` file: from there the run is a JSON Lines run.
Values map to JSON as docs/inputs.md tables them; a value with no JSON form is refused naming its row
and column. The database's identity (host, port, database; a SQLite file's path) names it in the run's
manifest and in errors; its credentials are used to connect and nowhere else."""

from __future__ import annotations

import base64
import ipaddress
import math
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from datetime import time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import unquote, urlsplit

import orjson

from bulkrelay.errors import ConfigInvalid, InputInvalid, InputUnavailable, Problem, UsageError
from bulkrelay.job.redact import host_port_shown, url_split_safely
from bulkrelay.job.template import SecretRef, compile_template, resolve_secrets
from bulkrelay.private import open_private

if TYPE_CHECKING:
    import psycopg

QUERY_NAME = "<query>"  # what messages call the rows of a query (never the snapshot's path)
_FETCH = 2000  # rows a server-side cursor brings at a time: memory flat in the row count
_CURSOR = "bulkrelay_snapshot"
_DECLARE = f'DECLARE "{_CURSOR}" CURSOR FOR '  # what psycopg puts before a server-side cursor's query
_CONNECT_TIMEOUT_SECONDS = 10
_READING_WORDS = ("SELECT", "WITH", "VALUES", "TABLE")
_ROWS_TOLD_EVERY = 1000
# Values written as their text: network addresses (inet, cidr) and UUIDs orjson does not know as such.
_AS_TEXT = (
    ipaddress.IPv4Address,
    ipaddress.IPv6Address,
    ipaddress.IPv4Network,
    ipaddress.IPv6Network,
    ipaddress.IPv4Interface,
    ipaddress.IPv6Interface,
    uuid.UUID,
)
RowsRead = Callable[[int], None]


@dataclass(frozen=True)
class Database:
    """Where a query runs: `kind` (postgresql or sqlite), `identity` (no credentials: what the manifest
    and messages name), and what connecting needs (`url`, which may hold a password: never shown)."""

    kind: str
    identity: str
    host: str
    url: str
    path: Path | None = None  # sqlite: the file

    def __repr__(self) -> str:  # the URL may hold a password: never in a traceback or a log
        return f"Database({self.identity!r})"


@dataclass(frozen=True)
class QuerySpec:
    """A query as the job file gives it, its `${...}` resolved: what `take_snapshot` runs. An input's
    (`input.query`, with `input.params`) or a lookup's (`lookups.NAME.query`: no parameters, and two
    columns, the key then the value)."""

    query: str
    params: Mapping[str, Any]
    database: Database
    job_file: str  # where problems point (the query's line)
    query_line: int | None = None
    field: str = "input.query"  # where the query is in the job file: what problems name
    params_field: str | None = "input.params"  # where its `:name` values are given; None: it takes none
    columns: tuple[str, ...] | None = None  # what each column must be, in order; None: any columns


def database_of(text: str, env: Mapping[str, str], base_dir: Path) -> Database:
    """The database `input.database` names: `postgresql://...` or `sqlite:///path` (relative to the job
    file's directory; `sqlite:////abs/path` is absolute), `${NAME}` taken from the environment."""
    parts = compile_template(text).parts
    secrets = resolve_secrets([p.name for p in parts if isinstance(p, SecretRef)], env)
    url = "".join(secrets[p.name] if isinstance(p, SecretRef) else str(p) for p in parts)
    scheme = url.partition(":")[0].lower()
    if scheme == "sqlite":
        if not url.lower().startswith("sqlite:///"):
            raise _bad_url("a SQLite database is written sqlite:///path/to.db")
        path = base_dir / url[len("sqlite:///") :]
        shown = str(path.resolve())
        return Database("sqlite", f"sqlite:///{shown}", shown, url, path.resolve())
    if scheme in ("postgresql", "postgres"):
        try:
            split = url_split_safely(url)
        except ValueError as exc:
            raise _bad_url(f"input.database {exc}") from None
        where = host_port_shown(split.hostname or "localhost", split.port or 5432)
        name = unquote(split.path.lstrip("/")) or unquote(split.username or "")
        return Database("postgresql", f"postgresql://{where}/{name}", where, url)
    raise _bad_url("input.database must begin with postgresql:// or sqlite:///")


def _bad_url(message: str) -> UsageError:
    # The URL itself is never repeated: it may hold a password.
    return UsageError(message, context={"field": "input.database"})


def take_snapshot(spec: QuerySpec, out: BinaryIO, on_rows: RowsRead | None = None) -> int:
    """Run the query once and write its rows to `out` as JSON Lines; the row count."""
    refuse_writing(spec)
    check_params(spec)
    with _rows_of(spec) as (columns, kinds, rows):
        _refuse_duplicates(spec, columns)
        _require_columns(spec, columns)
        return _write_rows(spec, (columns, kinds, rows), out, on_rows)


def snapshot_into(spec: QuerySpec, dest: Path, on_rows: RowsRead | None = None) -> int:
    """`take_snapshot` into a new private (0600) file `dest`, fsynced before the count is returned; a
    failed snapshot is removed."""
    return write_private(dest, lambda out: take_snapshot(spec, out, on_rows))


def write_private(dest: Path, write: Callable[[BinaryIO], int]) -> int:
    """`write` into a new private (0600) file `dest`, fsynced before its count is returned; a file not
    written whole is removed."""
    try:
        with open(dest, "xb", opener=open_private) as out:
            count = write(out)
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return count


def refuse_writing(spec: QuerySpec) -> None:
    """A statement that would write is refused before it runs (the read-only transaction would
    refuse it too): a query begins with SELECT, WITH, VALUES or TABLE."""
    word = _first_word(spec.query)
    if word.upper() not in _READING_WORDS:
        shown = word or "nothing"
        raise ConfigInvalid(
            [_query_problem(spec, f"{spec.field} must only read (SELECT, WITH, VALUES, TABLE), not {shown}")]
        )


def check_params(spec: QuerySpec) -> None:
    """Every `:name` of the query has a value in its params (input.params; a lookup's query takes
    none), and every value is used."""
    used, given = query_parameters(spec.query), set(spec.params)
    where = spec.params_field
    problems = [
        _query_problem(
            spec, f"{where} has no value for :{name}" if where else f"{spec.field} takes no :{name}"
        )
        for name in sorted(used - given)
    ]
    problems += [
        _query_problem(spec, f"{where}.{name} is not used by the query (no :{name} in it)")
        for name in sorted(given - used)
    ]
    if problems:
        raise ConfigInvalid(problems)


def _first_word(sql: str) -> str:
    text = _without_comments(sql).lstrip(" \t\r\n(")
    end = 0
    while end < len(text) and (text[end].isalnum() or text[end] == "_"):
        end += 1
    return text[:end]


def _without_comments(sql: str) -> str:
    """The query with its leading comments (`-- ...`, `/* ... */`) taken off."""
    text = sql.lstrip()
    while text.startswith(("--", "/*")):
        end = "\n" if text.startswith("--") else "*/"
        text = text.partition(end)[2].lstrip()
    return text


def _query_problem(spec: QuerySpec, message: str) -> Problem:
    return Problem(message, file=spec.job_file, line=spec.query_line, path=spec.field)


def _refuse_duplicates(spec: QuerySpec, columns: Sequence[str]) -> None:
    seen: set[str] = set()
    twice: set[str] = set()
    for name in columns:
        (twice if name in seen else seen).add(name)
    if twice:
        listed = ", ".join(repr(name) for name in sorted(twice))
        plural = "s" if len(twice) > 1 else ""
        message = f"the query returns the column{plural} {listed} twice; name each once (AS)"
        raise ConfigInvalid([_query_problem(spec, message)])


def _require_columns(spec: QuerySpec, columns: Sequence[str]) -> None:
    """A query whose columns have roles (a lookup's: the key, then the value) returns one a role, no
    fewer (a map of nothing but nulls) and no more (a column quietly left out)."""
    roles = spec.columns
    if roles is None or len(columns) == len(roles):
        return
    listed = ", ".join(repr(name) for name in columns) or "none"
    plural = "" if len(columns) == 1 else "s"
    message = (
        f"the query returns {len(columns)} column{plural} ({listed}); it must return exactly "
        f"{len(roles)} columns: {', then '.join(roles)}"
    )
    raise ConfigInvalid([_query_problem(spec, message)])


def _write_rows(spec: QuerySpec, answer: Rows, out: BinaryIO, on_rows: RowsRead | None) -> int:
    columns, kinds, rows = answer
    count = 0
    dumps, default, finite = orjson.dumps, _json_default, _finite
    if on_rows is not None:
        on_rows(0)
    for count, row in enumerate(rows, 1):
        try:
            if any(type(value) is float for value in row):
                finite(row)
            line = dumps(dict(zip(columns, row, strict=True)), default=default)
        except (TypeError, ValueError) as exc:
            raise _no_json_form(spec, (columns, kinds), row, count, exc) from None
        out.write(line)
        out.write(b"\n")
        if on_rows is not None and not count % _ROWS_TOLD_EVERY:
            on_rows(count)
    if on_rows is not None:
        on_rows(count)
    return count


def json_line(record: Mapping[str, Any], kinds: Mapping[str, str] | None = None) -> bytes:
    """One record as a JSON Lines line, its values mapped as docs/inputs.md tables them; ValueError
    naming the column whose value has no JSON form (and its type, as `kinds` names the columns')."""
    try:
        if any(type(value) is float for value in record.values()):
            _finite(list(record.values()))
        return orjson.dumps(record, default=_json_default) + b"\n"
    except (TypeError, ValueError):
        column = next((name for name, value in record.items() if not _writable(value)), None)
        kind = None if column is None or kinds is None else kinds.get(column)
        reason = "a value has no JSON form" if column is None else _no_form(record[column], kind)
        raise ValueError(f"column {column!r}: {reason}") from None


def _finite(row: Sequence[Any]) -> None:
    for value in row:
        if type(value) is float and not math.isfinite(value):
            raise ValueError(f"{value} has no JSON form")


def _json_default(value: Any) -> Any:
    """What orjson cannot write itself: numeric as text (no precision lost), bytes as base64, network
    addresses and UUIDs as text; anything else (an interval, a range, a geometry) has no JSON form."""
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"numeric {value} has no JSON form")
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, _AS_TEXT):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value} has no JSON form")
    raise TypeError(f"a value of type {type(value).__name__} has no JSON form")


def _no_json_form(
    spec: QuerySpec,
    header: tuple[Sequence[str], Sequence[str | None]],
    row: Sequence[Any],
    number: int,
    exc: Exception,
) -> InputInvalid:
    columns, kinds = header
    culprit = next(
        (
            (name, kind, value)
            for name, kind, value in zip(columns, kinds, row, strict=True)
            if not _writable(value)
        ),
        None,
    )
    column = None if culprit is None else culprit[0]
    reason = str(exc) if culprit is None else _no_form(culprit[2], culprit[1])
    message = f"{reason}; cast it in the query (for example ::text)"
    problem = Problem(message, file=QUERY_NAME, row=number, field=column, path=spec.field)
    return InputInvalid([problem], phase="snapshot")


def _no_form(value: Any, kind: str | None = None) -> str:
    """Why `value` (of the source's type `kind`, when it says) has no JSON form, in the source's words."""
    if isinstance(value, float | Decimal):
        return f"the value {value} has no JSON form"
    named = kind or _PYTHON_KINDS.get(type(value), type(value).__name__)
    at = _integer_beyond_64_bits(value)
    if at is not None:
        return f"the {named} value holds an integer beyond 64 bits at {at}, which JSON readers round"
    return f"a value of type {named} has no JSON form"


# What the Python values a driver gives are called in SQL when the source does not name its type.
_PYTHON_KINDS = {timedelta: "interval", time: "time with a time zone"}


def _integer_beyond_64_bits(value: Any, at: str = "$") -> str | None:
    """The JSON path of the first integer in `value` outside 64 bits, or None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return at if not -(2**63) <= value < 2**64 else None
    if isinstance(value, dict):
        items: Iterable[tuple[str, Any]] = ((f"{at}.{key}", item) for key, item in value.items())
    elif isinstance(value, list | tuple):
        items = ((f"{at}[{index}]", item) for index, item in enumerate(value))
    else:
        return None
    return next((found for path, item in items if (found := _integer_beyond_64_bits(item, path))), None)


def _writable(value: Any) -> bool:
    try:
        if type(value) is float:
            _finite([value])
        orjson.dumps(value, default=_json_default)
    except (TypeError, ValueError):
        return False
    return True


# --- the two databases ------------------------------------------------------------------------

# The columns' names, their types as the database names them (None: it does not say), and the rows.
Rows = tuple[list[str], list[str | None], Iterator[Sequence[Any]]]


def _rows_of(spec: QuerySpec) -> AbstractContextManager[Rows]:
    if spec.database.kind == "sqlite":
        return _sqlite_rows(spec)
    return _postgres_rows(spec)


@contextmanager
def _sqlite_rows(spec: QuerySpec) -> Iterator[Rows]:
    path = spec.database.path
    assert path is not None
    if not path.is_file():
        raise _unavailable(spec, "no such file")
    try:
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        raise _unavailable(spec, str(exc)) from None
    try:
        conn.execute("PRAGMA query_only = ON")
        conn.execute("BEGIN")  # one read transaction: every row from the same state of the file
        try:
            cursor = conn.execute(spec.query, dict(spec.params))
        except sqlite3.ProgrammingError as exc:
            raise _query_failed(spec, str(exc), None) from None
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                raise _unavailable(spec, str(exc)) from None
            raise _query_failed(spec, str(exc), None) from None
        columns = [str(d[0]) for d in cursor.description or ()]
        yield columns, [None] * len(columns), _sqlite_stream(spec, cursor)
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def _sqlite_stream(spec: QuerySpec, cursor: sqlite3.Cursor) -> Iterator[Sequence[Any]]:
    """The cursor's rows. A loop, not `yield from`: a stream left half read (a row refused) is closed
    by the garbage collector after the connection, and `yield from` would then close the cursor on a
    closed database, an error Python prints with its traceback on stderr. The connection's owner
    closes the cursor."""
    try:
        for row in cursor:  # noqa: UP028 - `yield from` would close the cursor (see the docstring)
            yield row
    except sqlite3.DatabaseError as exc:
        raise _query_failed(spec, str(exc), None) from None


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise UsageError(
            "a PostgreSQL input needs psycopg, which the extra bulkrelay[postgres] installs",
            suggestion="pip install 'bulkrelay[postgres]' (or: uv add 'bulkrelay[postgres]')",
        ) from None
    return psycopg


@contextmanager
def _postgres_rows(spec: QuerySpec) -> Iterator[Rows]:
    pg = _psycopg()
    conn = _connect(pg, spec)
    try:
        conn.read_only = True
        conn.isolation_level = pg.IsolationLevel.REPEATABLE_READ
        cursor = conn.cursor(name=_CURSOR)
        cursor.itersize = _FETCH
        try:
            try:
                conn.execute("SET TIME ZONE 'UTC'")  # timestamptz values come out in UTC
                cursor.execute(pg_placeholders(spec.query), dict(spec.params))
            except pg.Error as exc:
                raise _pg_failed(pg, spec, exc) from None
            columns = [column.name for column in cursor.description or ()]
            kinds: list[str | None] = [column.type_display for column in cursor.description or ()]
            yield columns, kinds, _pg_stream(pg, spec, cursor)
        finally:
            with suppress(pg.Error):
                cursor.close()
        conn.rollback()
    finally:
        conn.close()


def _connect(pg: Any, spec: QuerySpec) -> psycopg.Connection[Any]:
    try:
        conn: psycopg.Connection[Any] = pg.connect(
            spec.database.url, connect_timeout=_CONNECT_TIMEOUT_SECONDS, application_name="bulkrelay"
        )
    except pg.Error as exc:
        raise _unavailable(spec, _pg_message(exc, spec.database)) from None
    return conn


def _pg_stream(pg: Any, spec: QuerySpec, cursor: Any) -> Iterator[Sequence[Any]]:
    """The cursor's rows; a loop, not `yield from`, as `_sqlite_stream` says."""
    try:
        for row in cursor:  # noqa: UP028 - as in _sqlite_stream
            yield row
    except pg.Error as exc:
        raise _pg_failed(pg, spec, exc) from None


def _pg_failed(pg: Any, spec: QuerySpec, exc: Any) -> Exception:
    if isinstance(exc, pg.OperationalError) and getattr(exc, "sqlstate", None) is None:
        return _unavailable(spec, _pg_message(exc, spec.database))  # the connection went away
    diag = exc.diag
    position = None
    if diag.statement_position and diag.statement_position.isdigit():
        position = original_position(spec.query, int(diag.statement_position))
    return _query_failed(spec, diag.message_primary or _pg_message(exc, spec.database), position)


def _pg_message(exc: Exception, database: Database) -> str:
    """libpq's words, without a password it might repeat."""
    text = " ".join(str(exc).split())
    password = urlsplit(database.url).password
    return text.replace(password, "***") if password else text


def _unavailable(spec: QuerySpec, reason: str) -> InputUnavailable:
    where = spec.database.host
    if spec.database.kind == "sqlite":
        suggestion = (
            "check that input.database names the SQLite file (sqlite:///path relative to the job file's"
            " directory, sqlite:////absolute/path) and that no other program holds it locked"
        )
    else:
        suggestion = "check that the database is up and input.database (its host, port, user) is right"
    return InputUnavailable(
        f"cannot read the database at {where}: {reason}",
        context={"database": spec.database.identity, "host": where},
        suggestion=suggestion,
    )


def _query_failed(spec: QuerySpec, message: str, position: int | None) -> InputInvalid:
    at = f" (at character {position} of {spec.field})" if position else ""
    problem = _query_problem(spec, f"the query failed: {message}{at}")
    return InputInvalid([problem], phase="snapshot")


def pg_placeholders(sql: str) -> str:
    """`:name` placeholders as psycopg writes them (`%(name)s`), and a literal `%` doubled; quoted
    text, quoted names, dollar-quoted bodies, comments and `::type` casts are left as they are."""
    return "".join(ours for _, ours, _ in _pieces(sql))


def original_position(sql: str, server_position: int) -> int | None:
    """Where in `sql` (1-based) the server's 1-based position in the statement it ran falls: psycopg
    sends `DECLARE "name" CURSOR FOR ` and the query with `$1`, `$2` for the placeholders."""
    at = server_position - 1 - len(_DECLARE)
    if at < 0:
        return None
    for start, _, sent in _pieces(sql):
        if at < len(sent):
            return start + 1
        at -= len(sent)
    return None


def _pieces(sql: str) -> Iterator[tuple[int, str, str]]:
    """The query in pieces: (where it starts in `sql`, what psycopg is given, what the server runs)."""
    numbers: dict[str, int] = {}
    i, n = 0, len(sql)
    while i < n:
        skip = _quoted_end(sql, i)
        if skip > i:
            yield i, sql[i:skip].replace("%", "%%"), sql[i:skip]
            i = skip
            continue
        char = sql[i]
        if char == ":" and i + 1 < n and sql[i + 1] == ":":
            yield i, "::", "::"
            i += 2
        elif char == ":" and i + 1 < n and (sql[i + 1].isalpha() or sql[i + 1] == "_"):
            end = i + 1
            while end < n and (sql[end].isalnum() or sql[end] == "_"):
                end += 1
            name = sql[i + 1 : end]
            number = numbers.setdefault(name, len(numbers) + 1)
            yield i, f"%({name})s", f"${number}"
            i = end
        else:
            yield i, "%%" if char == "%" else char, char
            i += 1


def query_parameters(sql: str) -> set[str]:
    """The `:name` placeholders a query uses (outside quotes and comments)."""
    found: set[str] = set()
    text = pg_placeholders(sql)
    start = 0
    while (at := text.find("%(", start)) >= 0:
        end = text.find(")s", at)
        found.add(text[at + 2 : end])
        start = end
    return found


def _quoted_end(sql: str, i: int) -> int:
    """Where a quoted piece or comment starting at `i` ends (`i` itself when none starts there)."""
    char = sql[i]
    if char in "'\"":
        end = i + 1
        while end < len(sql):
            if sql[end] == char:
                if end + 1 < len(sql) and sql[end + 1] == char:
                    end += 2
                    continue
                return end + 1
            end += 1
        return len(sql)
    if sql.startswith("--", i):
        end = sql.find("\n", i)
        return len(sql) if end < 0 else end
    if sql.startswith("/*", i):
        end = sql.find("*/", i + 2)
        return len(sql) if end < 0 else end + 2
    if char == "$":
        tag_end = sql.find("$", i + 1)
        tag = sql[i : tag_end + 1] if tag_end > 0 else ""
        if tag and all(c.isalnum() or c == "_" for c in tag[1:-1]) and not tag[1:2].isdigit():
            close = sql.find(tag, tag_end + 1)
            return len(sql) if close < 0 else close + len(tag)
    return i
