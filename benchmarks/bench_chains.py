"""The cost of issue 39's results sink and lookups, as ratios against the same work without them.

    uv run python benchmarks/bench_chains.py [--rows 200000] [--repeats 2] [--keys 1000000]

(a) the results sink: `bulkrelay run` of --rows rows (a whole process, start-up and preflight included)
    with `results: {to: sqlite:///results.db}` and without, alternated, best of --repeats each: rows/s
    and the ratio with / without (issue 39: >= 0.95 at 200k rows on SQLite). The table is checked to
    hold every row after each run with it. Each run also prints the CPU time a row of the relay's own
    process and of the processes it waited for (the sink's feeder): on a shared machine, where rows/s
    follow the other users' load, they say what the sink costs the relay, and what it costs at all.
(b) a lookup of --keys keys: the peak RSS the map adds (a child process builds it from (key, value)
    pairs, as ops/lookups.py does, against one that builds the pairs alone; issue 39: <= 150 MB), and
    the cost a row of a `{lookup: ...}` leaf against a `{from: ...}` leaf over the same fields (the
    render function preflight and the relay call, one million rows; issue 39: <= 3 us).
The target is benchmarks/nginx.py's loopback (nginx when installed, else the built-in target).
Prints figures; asserts nothing about timing.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from nginx import loopback_target  # benchmarks/nginx.py

_JOB = """version: 1
name: bench
input: {{ file: {input}, key: id }}
request:
  method: POST
  url: "{url}/v1/customers"
  json: {{ id: {{ from: id, type: integer }}, email: {{ from: email }} }}
execution: {{ concurrency: 64 }}
"""

# The child of (b): reads a frozen map (as a run does) unless told not to; prints its peak RSS (KiB),
# VmHWM: ru_maxrss would carry the parent's peak across exec.
_MAP_CHILD = """
import sys
from pathlib import Path
from bulkrelay.job.inputs.lookups import read_frozen
if sys.argv[2] == "map":
    table = read_frozen(Path(sys.argv[1]))
status = Path("/proc/self/status").read_text()
print(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))
"""


def _table(keys: int) -> dict[str, str]:
    """Salesforce-shaped ids by external id: the map a chain's lookup holds."""
    return {f"acct-{n:08d}": f"0015g00000{n:08d}AAA" for n in range(keys)}


def _write_input(path: Path, rows: int) -> None:
    with path.open("w", buffering=1 << 20) as out:
        out.write("id,email\n")
        for n in range(1, rows + 1):
            out.write(f"{n},user{n}@example.com\n")


# `bulkrelay run` in a process that then prints (on stderr) its own CPU seconds and those of the
# processes it waited for: the command's main, as a caller in its own process calls it.
_RUN_CHILD = """
import resource, sys
from bulkrelay.cli.main import main
try:
    main(sys.argv[1:])
finally:
    own, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    print(own.ru_utime + own.ru_stime, waited.ru_utime + waited.ru_stime, file=sys.stderr)
"""


def _run(job: Path, runs_dir: Path) -> tuple[float, float, float]:
    """Rows/s of one `bulkrelay run` process (wall time), and the µs of CPU a row of the process and of
    the processes it waited for."""
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_CHILD, "run", str(job), "--budget", "0", "--runs-dir", str(runs_dir)],
        cwd=job.parent,
        capture_output=True,
        check=False,
    )
    elapsed = time.perf_counter() - started
    envelope = orjson.loads(proc.stdout)
    if proc.returncode != 0:
        raise RuntimeError(f"bulkrelay run exited {proc.returncode}: {envelope.get('error')}")
    rows = int(envelope["data"]["progress"]["done"])
    own, waited = map(float, proc.stderr.split()[-2:])
    return rows / elapsed, own / rows * 1e6, waited / rows * 1e6


def _sink_cost(workdir: Path, url: str, rows: int, repeats: int) -> None:
    _write_input(workdir / "input.csv", rows)
    plain = workdir / "plain.yaml"
    plain.write_text(_JOB.format(input="input.csv", url=url))
    sunk = workdir / "sunk.yaml"
    sunk.write_text(_JOB.format(input="input.csv", url=url) + 'results: { to: "sqlite:///results.db" }\n')
    best = {"without": 0.0, "with": 0.0}
    cpu: dict[str, list[float]] = {"without": [], "with": []}
    for attempt in range(repeats):
        for name, job in (("without", plain), ("with", sunk)):
            rate, own, waited = _run(job, workdir / f"runs-{name}-{attempt}")
            best[name] = max(best[name], rate)
            cpu[name].append(own)
            print(
                f"  (a) {name:>7} sink: {rate:10,.0f} rows/s; CPU a row: relay {own:5.1f} us, "
                f"its feeder {waited:4.1f} us (load {os.getloadavg()[0]:.2f})"
            )
        with sqlite3.connect(workdir / "results.db") as db:
            held = db.execute("SELECT count(*) FROM bulkrelay_results").fetchone()[0]
        db.close()
        assert held == rows, f"the sink holds {held} rows of {rows}"
    ratio = best["with"] / best["without"]
    print(f"(a) results sink at {rows:,} rows: best {best['with']:,.0f} vs {best['without']:,.0f} rows/s")
    print(f"    ratio with / without: {ratio:.3f} (target >= 0.95)")
    least = {name: min(values) for name, values in cpu.items()}
    print(f"    the relay's CPU a row, least with / without: {least['with'] / least['without']:.3f}")


def _child_rss(frozen: Path, what: str) -> int:
    command = [sys.executable, "-c", _MAP_CHILD, str(frozen), what]
    return int(subprocess.run(command, capture_output=True, check=True).stdout) * 1024


def _map_memory(keys: int, workdir: Path) -> None:
    from bulkrelay.job.inputs.lookups import freeze

    frozen = workdir / "ids.jsonl"
    freeze(frozen, _table(keys))
    without, with_map = _child_rss(frozen, "none"), _child_rss(frozen, "map")
    added = (with_map - without) / 1e6
    print(f"(b) a lookup of {keys:,} keys read from its frozen file: {added:,.0f} MB of peak RSS added")
    print(f"    ({with_map / 1e6:,.0f} MB with it, {without / 1e6:,.0f} MB without; target <= 150 MB added)")


def _leaf_cost(keys: int) -> None:
    from bulkrelay.job.config import RequestConfig
    from bulkrelay.job.inputs.lookupmap import CompactMap
    from bulkrelay.job.records import Record
    from bulkrelay.job.request import RequestRenderer

    table = CompactMap(_table(keys).items())  # as a run holds it (job/inputs/lookupmap.py)
    records = [Record(n, n, {"ref": f"acct-{n:08d}", "id": str(n)}) for n in range(keys)]
    plain = {
        "method": "POST",
        "url": "https://x.example/c",
        "json": {"accountId": {"from": "ref"}, "id": {"from": "id"}},
    }
    looked = {
        "method": "POST",
        "url": "https://x.example/c",
        "json": {"accountId": {"lookup": "ids", "key": {"from": "ref"}}, "id": {"from": "id"}},
    }
    costs = {}
    for name, request in (("from", plain), ("lookup", looked)):
        renderer = RequestRenderer.from_config(
            RequestConfig.model_validate(request), os.environ, lookups={"ids": table}
        )
        render = renderer.render
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            for record in records:
                render(record)
            best = min(best, time.perf_counter() - started)
        costs[name] = best / keys * 1e6
        print(f"  (b) render with a {name:>6} leaf: {costs[name]:.2f} us a row")
    print(f"(b) a lookup leaf costs {costs['lookup'] - costs['from']:.2f} us a row more (target <= 3 us)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows of (a); 0 to skip it")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--keys", type=int, default=1_000_000, help="keys of (b); 0 to skip it")
    args = parser.parse_args()
    base = Path("/var/tmp" if os.path.isdir("/var/tmp") else tempfile.gettempdir())
    if args.keys:
        with tempfile.TemporaryDirectory(prefix="bench-lookup-", dir=base) as tmp:
            _map_memory(args.keys, Path(tmp))
        _leaf_cost(args.keys)
    if args.rows:
        with (
            tempfile.TemporaryDirectory(prefix="bench-chains-", dir=base) as tmp,
            loopback_target(Path(tmp)) as (url, description),
        ):
            print(f"target: {description} at {url}; {os.cpu_count()} CPUs")
            _sink_cost(Path(tmp), url, args.rows, args.repeats)


if __name__ == "__main__":
    main()
