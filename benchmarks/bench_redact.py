"""Per-row cost of redaction on what the journal keeps, against the same work without secrets.

    uv run python benchmarks/bench_redact.py [--rows 20000] [--body-bytes 4096] [--limit 2048]

For each case the script times `ResponseReader.failure_body` (a failure body cut at `--limit`) and
`ResponseReader.captured` (three captured values) with a job holding one 24-character secret, and
the same calls with no secret (the baseline: decoding and cutting only), and prints microseconds a
row and the ratio. It also times `redact_rendered`, which the idempotency key runs on every row, on a
URL, a header and a JSON body. A job without secrets pays nothing: its ratio is 1 by construction.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import orjson

from bulkrelay.job.redact import Redactor
from bulkrelay.relay.response import ResponseReader

SECRET = "tok-5ecr3t-Zq81xv-A7c9Lm"


def _per_row_us(rows: int, call: Callable[[], object]) -> float:
    start = time.perf_counter()
    for _ in range(rows):
        call()
    return (time.perf_counter() - start) / rows * 1e6


def _report(name: str, rows: int, baseline: Callable[[], object], measured: Callable[[], object]) -> None:
    base, cost = _per_row_us(rows, baseline), _per_row_us(rows, measured)
    print(
        f"{name:34s} no secret {base:8.2f} us/row   one secret {cost:8.2f} us/row   ratio {cost / base:6.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--body-bytes", type=int, default=4096)
    parser.add_argument("--limit", type=int, default=2048)
    args = parser.parse_args()
    words = b'{"error": "validation failed", "field": "email", "detail": "must be an address"} '
    body = (words * (args.body_bytes // len(words) + 1))[: args.body_bytes]
    capture = {"id": "/id", "name": "/name", "tags": "/tags"}
    answer = orjson.dumps({"id": "8812", "name": "Ada Lovelace", "tags": ["a", "b"], "other": "x" * 200})
    plain, secret = Redactor([]), Redactor([SECRET])
    readers = [ResponseReader(capture, args.limit, redactor) for redactor in (plain, secret)]
    _report(
        "failure body",
        args.rows,
        lambda: readers[0].failure_body(body),
        lambda: readers[1].failure_body(body),
    )
    _report(
        "captured values", args.rows, lambda: readers[0].captured(answer), lambda: readers[1].captured(answer)
    )
    texts = ["https://api.test/v1/customers/12345?source=migration", f"Bearer {SECRET}", answer.decode()]
    _report(
        "redact_rendered (request, per row)",
        args.rows,
        lambda: [plain.redact_rendered(t) for t in texts],
        lambda: [secret.redact_rendered(t) for t in texts],
    )


if __name__ == "__main__":
    main()
