"""`bulkrelay run` end to end against naive pyreqwest and aiohttp loops, GNU parallel + curl, peak RSS.

    uv run python benchmarks/bench_run.py [--rows 40000,200000] [--concurrency 64] [--rss-rows 100000,1000000]
    uv run python benchmarks/bench_run.py --profile [--profile-rows 200000]

The target is a loopback nginx (Debian `nginx-light`) answering every POST with 200 `{"id":1}` from a config
this script writes, or, without nginx, the built-in target in its own process with recording off.

Measured at each --rows size, all against the same target and the same input file:
  (a) a naive pyreqwest loop on uvloop (the baseline): `concurrency` workers read the CSV, split each line,
      orjson.dumps it and POST it with pyreqwest; no journal, no validation, nothing else;
  (a') the same naive loop with aiohttp, beside it for comparison with earlier figures;
  (a1) with --ceiling, the same naive loop with every thread held to one CPU, as `bulkrelay run` holds its
      own (execution.pin_cpu): what a relay doing no work of its own could reach there. It splits the
      ratio b / a into b / a1 (the share of that ceiling our work leaves) times a1 / a (what one CPU
      costs the client itself on this machine);
  (b) `bulkrelay run job.yaml --budget 0` as a whole process (start-up and preflight included), journal on
      local disk: rows / wall time, and the ratio b / a (issue 29: >= 0.8 at 200k rows, >= 0.7 at 40k);
      (a) and (b) alternate run by run, and each run prints its CPU per row (the process's, every thread;
      its main thread's; nginx's meanwhile), which load moves far less than rows/s;
  (c) GNU parallel + curl with --joblog on a few thousand rows, if GNU parallel is installed (not
      moreutils' parallel) and --parallel-rows is not 0;
  (d) peak RSS of `bulkrelay run` at each --rss-rows size; the largest over the smallest should stay <= 1.3;
  (e) the fixed cost of a one-row `bulkrelay run` (start-up, preflight, run directory, one commit), run
      first so that the modules' bytecode is cached for the rest (child processes run without
      PYTHONDONTWRITEBYTECODE, as an installed bulkrelay does);
  (f) a batched `bulkrelay run` (request.batch, --batch-items rows a request, docs/batching.md) over the
      same rows as (a), each row still journaled: its rows/s beside the naive per-row loop's (issue 24:
      >= 1.5);
  (g) `bulkrelay run` with `execution.workers: auto` (issue 44: one process a CPU), alternated with (a)
      and (b): its rows/s, its CPU a row in all, and split between the parent and its workers;
  (h) latency-bound (issue 44): the built-in target answering every request --latency-ms late (100),
      (a) and (b) alternated over --latency-rows rows at the same concurrency (the relay >= 0.95 x);
      then (b) with `rate_limit: --latency-limit` (500/s): its rows/s and the most requests the target
      saw arrive in any one-second window (never above the limit, and >= 0.98 x it).
With --profile, instead: one in-process `bulkrelay run` of --profile-rows rows (of (f)'s batched job with
--profile-batch) under cProfile, its top entries by own time, and where the time goes per row (preflight,
render, send, journal, commit, other) from the profile's cumulative times. cProfile slows Python code
down (about 2x), so those microseconds are larger than in a plain run; the shares are what to steer by.
Prints figures; asserts nothing about timing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import os
import pstats
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import aiohttp
import orjson
import uvloop
from nginx import builtin_target, loopback_target  # benchmarks/nginx.py
from pyreqwest.client import ClientBuilder

from bulkrelay.relay.affinity import relay_cpu

# ----------------------------------------------------------------------------- inputs


def _body(n: int) -> bytes:
    return orjson.dumps({"id": n, "email": f"user{n}@example.com", "name": f"Customer {n}"})


def _write_input(path: Path, rows: int) -> None:
    with path.open("w", buffering=1 << 20) as out:
        out.write("id,email,name\n")
        for n in range(1, rows + 1):
            out.write(f"{n},user{n}@example.com,Customer {n}\n")


def _write_job(  # noqa: PLR0917
    workdir: Path, url: str, input_name: str, concurrency: int, rate: int = 0, workers: str = "1"
) -> Path:
    job = workdir / f"job-{input_name}{f'-{rate}-a-second' if rate else ''}-workers-{workers}.yaml"
    limit = f", rate_limit: {{ requests_per_second: {rate} }}" if rate else ""
    limit += f", workers: {workers}" if workers != "1" else ""
    job.write_text(
        f"""version: 1
name: bench
input: {{ file: {input_name}, key: id }}
request:
  method: POST
  url: "{url}/v1/customers"
  json:
    id: {{ from: id, type: integer }}
    email: {{ from: email }}
    name: {{ from: name }}
execution: {{ concurrency: {concurrency}{limit} }}
"""
    )
    return job


def _write_batch_job(workdir: Path, url: str, input_name: str, concurrency: int, items: int) -> Path:
    job = workdir / f"job-batch-{input_name}.yaml"
    job.write_text(
        f"""version: 1
name: bench-batch
input: {{ file: {input_name}, key: id }}
request:
  method: POST
  url: "{url}/v1/customers/batch"
  batch:
    max_items: {items}
    item:
      id: {{ from: id, type: integer }}
      email: {{ from: email }}
      name: {{ from: name }}
execution: {{ concurrency: {concurrency} }}
"""
    )
    return job


# ----------------------------------------------------------------------------- (a) naive loops


def _csv_rows(path: Path) -> Iterator[bytes]:
    """The JSON body of each line of the input: what a naive loop does per row (split, dumps)."""
    with path.open() as lines:
        next(lines)  # the header
        for line in lines:
            n, email, name = line.rstrip("\n").split(",")
            yield orjson.dumps({"id": int(n), "email": email, "name": name})


async def _naive_reqwest(url: str, path: Path, concurrency: int) -> tuple[int, float]:
    """(rows, seconds) of `concurrency` workers POSTing each row with pyreqwest: the baseline."""
    bodies = _csv_rows(path)
    sent = failures = 0
    client = ClientBuilder().max_connections(concurrency).build()
    target = f"{url}/v1/customers"

    async def worker() -> None:
        nonlocal sent, failures
        for body in bodies:  # one iterator shared by every worker
            request = client.post(target).header("Content-Type", "application/json").body_bytes(body)
            async with request.build_streamed() as response:
                await response.bytes()
                failures += response.status != 200
                sent += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    await client.close()
    if failures:
        raise RuntimeError(f"naive pyreqwest loop: {failures} non-200 answers")
    return sent, elapsed


async def _naive_aiohttp(url: str, path: Path, concurrency: int) -> tuple[int, float]:
    """(rows, seconds) of the same loop with aiohttp (asyncio's default loop, as it was measured before)."""
    bodies = _csv_rows(path)
    sent = failures = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal sent, failures
            for body in bodies:
                async with session.post(f"{url}/v1/customers", data=body, headers=headers) as response:
                    await response.read()
                    failures += response.status != 200
                    sent += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"naive aiohttp loop: {failures} non-200 answers")
    return sent, elapsed


def _process_cpu(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def _target_cpu() -> float:
    """CPU seconds used so far by the loopback target: the processes named nginx (or the built-in
    target's python) among this script's descendants, from /proc (0 where there is no /proc)."""
    parents: dict[int, tuple[int, str, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = entry.read_text()
            name = text[text.index("(") + 1 : text.rindex(")")]
            fields = text[text.rindex(")") + 2 :].split()
            parents[int(entry.parent.name)] = (
                int(fields[1]),
                name,
                (int(fields[11]) + int(fields[12])) / tick,
            )
    mine = {os.getpid()}
    for _ in range(3):  # the target, its master's workers
        mine |= {pid for pid, (ppid, _, _) in parents.items() if ppid in mine}
    return sum(cpu for pid, (_, name, cpu) in parents.items() if pid in mine and name == "nginx")


def _cpu_text(process: float, main_thread: float | None, rows: int, target: float | None = None) -> str:
    """CPU per row: the whole process's (every thread: the event loop, pyreqwest's Tokio thread, the
    journal's writer) and the main thread's, in µs; and the target's. Load moves these far less than
    rows/s."""
    text = f"CPU {process / rows * 1e6:5.1f} µs/row"
    if main_thread is not None:
        text += f" (main thread {main_thread / rows * 1e6:5.1f})"
    if target is not None:
        text += f", nginx {target / rows * 1e6:4.1f}"
    return text


def _best_naive(name: str, url: str, path: Path, concurrency: int, repeats: int) -> float:
    best = 0.0
    for attempt in range(repeats):
        process, thread = _process_cpu(resource.getrusage(resource.RUSAGE_SELF)), time.thread_time()
        target = _target_cpu()
        if name == "pyreqwest-one-cpu":  # (a1): every thread of this process on one CPU meanwhile
            with relay_cpu(True):
                sent, elapsed = uvloop.run(_naive_reqwest(url, path, concurrency))
        elif name == "pyreqwest":
            sent, elapsed = uvloop.run(_naive_reqwest(url, path, concurrency))
        else:
            sent, elapsed = asyncio.run(_naive_aiohttp(url, path, concurrency))
        process = _process_cpu(resource.getrusage(resource.RUSAGE_SELF)) - process
        cpu = _cpu_text(process, time.thread_time() - thread, sent, _target_cpu() - target)
        print(f"    run {attempt + 1}: {sent / elapsed:10,.0f} rows/s  ({elapsed:.2f} s; {cpu})")
        best = max(best, sent / elapsed)
    return best


# ----------------------------------------------------------------------------- (b), (d) bulkrelay run


# `bulkrelay run` as installed: with its modules' bytecode cached. With PYTHONDONTWRITEBYTECODE (set in
# some sandboxes and CI images) every process compiles ~170 modules from source, about a second here.
_CHILD_ENVIRONMENT = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


# `python -m bulkrelay`, and at exit the main thread's CPU time and the process's own (without its
# worker processes', which wait4 adds to it) written where BENCH_THREAD_TIME_FILE says.
_MAIN_WITH_THREAD_TIME = """\
import atexit, os, resource, time
def _times():
    own = resource.getrusage(resource.RUSAGE_SELF)
    text = repr((time.thread_time(), own.ru_utime + own.ru_stime))
    open(os.environ["BENCH_THREAD_TIME_FILE"], "w").write(text)
atexit.register(_times)
from bulkrelay.cli.main import main
main()
"""


class RunMeasure(NamedTuple):
    """One `bulkrelay run` process: wall seconds, peak RSS (KiB), CPU seconds (every thread's, its
    worker processes' too; the main thread's; the target's meanwhile), its envelope, and the CPU
    seconds of the process itself (without its workers')."""

    elapsed: float
    peak_kib: int
    cpu: float
    main_thread: float
    target: float
    envelope: dict[str, object]
    own_cpu: float


def _bulkrelay_run(job: Path, runs_dir: Path) -> RunMeasure:
    """One `bulkrelay run` process, measured."""
    thread_file = runs_dir.with_name(runs_dir.name + ".thread-time")
    command = [
        sys.executable,
        "-c",
        _MAIN_WITH_THREAD_TIME,
        "run",
        str(job),
        "--budget",
        "0",
        "--runs-dir",
        str(runs_dir),
    ]
    environment = {**_CHILD_ENVIRONMENT, "BENCH_THREAD_TIME_FILE": str(thread_file)}
    target = _target_cpu()
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            command, cwd=job.parent, stdout=out, stderr=subprocess.DEVNULL, env=environment
        )
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        envelope = orjson.loads(out.read())
    if proc.returncode != 0:
        raise RuntimeError(f"bulkrelay run exited {proc.returncode}: {envelope.get('error')}")
    main_thread, own_cpu = eval(thread_file.read_text())
    thread_file.unlink()
    target = _target_cpu() - target
    cpu = _process_cpu(usage)
    return RunMeasure(elapsed, int(usage.ru_maxrss), cpu, main_thread, target, envelope, own_cpu)


# ----------------------------------------------------------------------------- (c) GNU parallel + curl


def _gnu_parallel() -> str | None:
    """GNU parallel's path; None when `parallel` is missing or another one (moreutils' has no --version)."""
    parallel = shutil.which("parallel")
    if parallel is None:
        return None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        probe = subprocess.run(
            [parallel, "--version"],
            check=False,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=10,
        )
        if probe.returncode == 0 and probe.stdout.startswith("GNU parallel"):
            return parallel
    return None


def _parallel_curl(workdir: Path, url: str, rows: int, concurrency: int) -> str:
    parallel = _gnu_parallel()
    if parallel is None:
        return (
            "GNU parallel is not installed (apt-get install parallel; moreutils' parallel differs): skipped"
        )
    bodies = workdir / "bodies.txt"
    bodies.write_bytes(b"".join(_body(n) + b"\n" for n in range(1, rows + 1)))
    joblog = workdir / "parallel.joblog"
    command = [
        parallel,
        "--will-cite",
        "-q",
        "-j",
        str(concurrency),
        "--joblog",
        str(joblog),
        "-a",
        str(bodies),
        "curl",
        "-s",
        "-o",
        "/dev/null",
        "--fail",
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        "{}",
        f"{url}/v1/customers",
    ]  # fmt: skip  (-q: keep "Content-Type: application/json" one word)
    started = time.perf_counter()
    subprocess.run(command, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    elapsed = time.perf_counter() - started
    jobs = joblog.read_text().splitlines()[1:]
    failed = sum(1 for line in jobs if line.split("\t")[6] != "0")
    detail = f"{rows} rows in {elapsed:.2f} s, {len(jobs)} jobs logged, {failed} failed"
    return f"{rows / elapsed:10,.0f} rows/s  ({detail})"


# ----------------------------------------------------------------------------- main


def _measure_run(  # noqa: PLR0917
    workdir: Path, url: str, path: Path, concurrency: int, repeats: int, first: int = 0, workers: str = "1"
) -> float:
    rows = _count_rows(path)
    job = _write_job(workdir, url, path.name, concurrency, workers=workers)
    best = 0.0
    for attempt in range(first, first + repeats):
        run = _bulkrelay_run(job, workdir / f"runs-{path.stem}-{workers}-{attempt}")
        data = run.envelope["data"]
        assert isinstance(data, dict)
        engine_rate = data["summary"]["this_call"]["rows_per_second"]
        split = ""
        if workers != "1":  # the parent (journal, progress) and its workers, each a row
            parent, children = run.own_cpu / rows * 1e6, (run.cpu - run.own_cpu) / rows * 1e6
            split = f"; parent {parent:.1f} µs, workers {children:.1f} µs"
        print(
            f"    run {attempt + 1}: {rows / run.elapsed:10,.0f} rows/s whole process "
            f"({run.elapsed:.2f} s; engine alone {engine_rate:,.0f} rows/s; "
            f"{_cpu_text(run.cpu, run.main_thread, rows, run.target)}{split})"
        )
        best = max(best, rows / run.elapsed)
    return best


def _count_rows(path: Path) -> int:
    with path.open("rb") as lines:
        return sum(1 for _ in lines) - 1


def _compare(
    workdir: Path,
    url: str,
    rows: int,
    concurrency: int,
    repeats: int,
    *,
    with_aiohttp: bool = True,
    ceiling: bool = False,
    workers: bool = True,
) -> None:
    """(a), (a'), (a1), (b) and (g) over the same input file, best of `repeats` each; (a), (a1), (b)
    and (g) alternate, run by run, so that a change in the machine's load falls on each."""
    path = workdir / f"rows-{rows}.csv"
    _write_input(path, rows)
    reqwest = relay = one_cpu = every_core = 0.0
    for attempt in range(repeats):
        print(f"(a) naive pyreqwest loop (uvloop), {rows:,} POSTs, concurrency {concurrency}, no journal")
        reqwest = max(reqwest, _best_naive("pyreqwest", url, path, concurrency, 1))
        if ceiling:
            print(f"(a1) the same naive loop, every thread on one CPU, {rows:,} POSTs")
            one_cpu = max(one_cpu, _best_naive("pyreqwest-one-cpu", url, path, concurrency, 1))
        print(f"(b) bulkrelay run, {rows:,} rows, concurrency {concurrency}, journal on disk")
        relay = max(relay, _measure_run(workdir, url, path, concurrency, 1, attempt))
        if workers:
            print(f"(g) bulkrelay run, execution.workers: auto, {rows:,} rows, concurrency {concurrency}")
            every_core = max(every_core, _measure_run(workdir, url, path, concurrency, 1, attempt, "auto"))
    goal = 0.8 if rows >= 200_000 else 0.7
    summary = (
        f"==> {rows:,} rows, best of {repeats}: bulkrelay {relay:,.0f} rows/s; naive pyreqwest "
        f"{reqwest:,.0f} rows/s: ratio {relay / reqwest:.2f} (issue 29: >= {goal}; issue 44: >= 0.75)"
    )
    if workers:
        goal = 0.95 if rows >= 200_000 else 0.8
        summary += (
            f"; workers: auto {every_core:,.0f} rows/s: ratio {every_core / reqwest:.2f} "
            f"(issue 44: >= {goal}), {every_core / relay:.2f} x one worker"
        )
    if ceiling:
        summary += (
            f"; on one CPU {one_cpu:,.0f} rows/s: bulkrelay / one CPU {relay / one_cpu:.2f}, "
            f"one CPU / naive {one_cpu / reqwest:.2f}"
        )
    if with_aiohttp:
        print(f"(a') naive aiohttp loop, {rows:,} POSTs, concurrency {concurrency}, no journal")
        aiohttp_rate = _best_naive("aiohttp", url, path, concurrency, repeats)
        summary += f"; naive aiohttp {aiohttp_rate:,.0f} rows/s: ratio {relay / aiohttp_rate:.2f}"
    print(summary)
    path.unlink()


def _compare_batched(
    workdir: Path, url: str, rows: int, concurrency: int, repeats: int, *, items: int
) -> None:
    """(f): the batched run against the naive per-row loop, over the same input file."""
    path = workdir / f"batch-rows-{rows}.csv"
    _write_input(path, rows)
    job = _write_batch_job(workdir, url, path.name, min(concurrency, 8), items)
    best = naive = 0.0
    for attempt in range(repeats):  # alternated, as (a) and (b)
        print(f"(a) naive pyreqwest loop (uvloop), {rows:,} POSTs, concurrency {concurrency}, no journal")
        naive = max(naive, _best_naive("pyreqwest", url, path, concurrency, 1))
        print(f"(f) batched bulkrelay run, {rows:,} rows, {items} a request, every row journaled")
        run = _bulkrelay_run(job, workdir / f"runs-batch-{attempt}")
        data = run.envelope["data"]
        assert isinstance(data, dict) and data["summary"]["rows_done"] == rows
        cpu = _cpu_text(run.cpu, run.main_thread, rows, run.target)
        rate = rows / run.elapsed
        print(f"    run {attempt + 1}: {rate:10,.0f} rows/s whole process ({run.elapsed:.2f} s; {cpu})")
        best = max(best, rows / run.elapsed)
    print(
        f"==> {rows:,} rows, best of {repeats}: batched bulkrelay {best:,.0f} rows/s; naive per-row "
        f"pyreqwest {naive:,.0f} rows/s: ratio {best / naive:.2f} (goal >= 1.5)"
    )
    path.unlink()


def _measure_rss(workdir: Path, url: str, sizes: list[int], concurrency: int) -> None:
    peaks = []
    for rows in sizes:
        name = f"rss-{rows}.csv"
        _write_input(workdir / name, rows)
        job = _write_job(workdir, url, name, concurrency)
        run = _bulkrelay_run(job, workdir / f"runs-rss-{rows}")
        peaks.append(run.peak_kib)
        print(
            f"    {rows:>9,} rows: peak RSS {run.peak_kib / 1024:7.1f} MiB  "
            f"({rows / run.elapsed:,.0f} rows/s, {run.elapsed:.1f} s)"
        )
        (workdir / name).unlink()
    print(f"    ratio largest / smallest: {peaks[-1] / peaks[0]:.2f}  (goal <= 1.3)")


def _one_row_cost(workdir: Path, url: str, concurrency: int, repeats: int) -> None:
    """(e) the wall time of a one-row run: what every call pays whatever its size."""
    _write_input(workdir / "one.csv", 1)
    job = _write_job(workdir, url, "one.csv", concurrency)
    first = _bulkrelay_run(job, workdir / "runs-one-first").elapsed
    times = [_bulkrelay_run(job, workdir / f"runs-one-{n}").elapsed for n in range(repeats)]
    if not times:
        print(f"    the first run: {first * 1000:.0f} ms (the cache warmed; --no-fixed-cost)")
        return
    print(
        f"    best {min(times) * 1000:.0f} ms, median {sorted(times)[len(times) // 2] * 1000:.0f} ms "
        f"(the first run: {first * 1000:.0f} ms)"
    )


# ----------------------------------------------------------------------------- (h) latency-bound


def _control(url: str, action: str) -> dict[str, object]:
    """The built-in target's control API: `stats` (GET) or `reset` (POST)."""
    request = urllib.request.Request(
        f"{url}/_control/{action}", method="GET" if action == "stats" else "POST"
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        text = answer.read()
    return orjson.loads(text) if text.strip() else {}


def _compare_latency(workdir: Path, args: argparse.Namespace) -> None:
    """(h): the naive loop and the relay against a target answering --latency-ms late, alternated;
    then the relay under a rate limit, and the most requests the target saw in any one second."""
    rows, concurrency, limit = args.latency_rows, args.concurrency, args.latency_limit
    path = workdir / f"latency-rows-{rows}.csv"
    _write_input(path, rows)
    naive = relay = 0.0
    late = f"answered {args.latency_ms} ms late, concurrency {concurrency}"
    with builtin_target(workdir, {"rules": [{"delay_ms": args.latency_ms}]}) as url:
        for attempt in range(args.repeats):
            print(f"(h) naive pyreqwest loop, {rows:,} POSTs, {late}")
            naive = max(naive, _best_naive("pyreqwest", url, path, concurrency, 1))
            print(f"(h) bulkrelay run, {rows:,} rows, {late}")
            relay = max(relay, _measure_run(workdir, url, path, concurrency, 1, attempt + 100))
        print(
            f"==> latency-bound, {rows:,} rows, best of {args.repeats}: bulkrelay {relay:,.0f} rows/s; "
            f"naive pyreqwest {naive:,.0f} rows/s: ratio {relay / naive:.2f} (issue 44: >= 0.95)"
        )
        _control(url, "reset")
        run = _bulkrelay_run(
            _write_job(workdir, url, path.name, concurrency, limit), workdir / "runs-limited"
        )
        stats = _control(url, "stats")
        most = stats["max_arrivals_in_any_second"]
        print(
            f"==> rate_limit {limit}/s, {rows:,} rows: {rows / run.elapsed:,.0f} rows/s whole process "
            f"({run.elapsed:.2f} s; {_cpu_text(run.cpu, run.main_thread, rows)}); the target saw "
            f"{stats['requests']:,} requests, at most {most} in any one-second window "
            f"(issue 44: <= {limit} and >= {int(limit * 0.98)})"
        )
    path.unlink()


# ----------------------------------------------------------------------------- --profile

# Where a row's time goes, as cumulative times of these functions (file suffix, function name). Nested
# phases are not double counted: render and send happen inside the sender, which is "other".
_PHASES = (
    ("preflight", "job/preflight.py", ("run_preflight",)),
    ("render", "job/request.py", ("_keyed", "_unkeyed")),  # RowRequests: the sender's render (and key)
    ("send", "relay/transport/reqwest.py", ("send",)),
    ("journal", "store/journal/rows.py", ("submit", "offer")),
    ("commit", "store/journal/rows.py", ("_commit",)),
)

_StatKey = tuple[str, int, str]
_StatTable = dict[_StatKey, tuple[int, int, float, float, object]]  # pstats: (cc, calls, tt, ct, callers)


def _profile(workdir: Path, url: str, args: argparse.Namespace) -> None:
    """One in-process `bulkrelay run` under cProfile: the top entries and the per-row breakdown."""
    from bulkrelay.cli.main import main as cli_main  # imported before profiling: the run, not imports

    rows, concurrency, top, save = args.profile_rows, args.concurrency, args.top, args.profile_save
    _write_input(workdir / "rows.csv", rows)
    if args.profile_batch:  # (f)'s job: what a row costs when a request carries 100 of them
        job = _write_batch_job(workdir, url, "rows.csv", min(concurrency, 8), args.batch_items)
    else:
        job = _write_job(workdir, url, "rows.csv", concurrency)
    argv = ["run", str(job), "--budget", "0", "--runs-dir", str(workdir / "runs-profile")]
    profiler = cProfile.Profile()
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8")  # the envelope goes to sys.stdout.buffer
    started = time.perf_counter()
    with contextlib.chdir(workdir), contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        profiler.runcall(cli_main, argv)
    elapsed = time.perf_counter() - started
    out.flush()
    envelope = orjson.loads(raw.getvalue())
    if not envelope.get("ok"):
        raise RuntimeError(f"the profiled run failed: {envelope.get('error')}")
    stats = pstats.Stats(profiler)
    if save is not None:
        stats.dump_stats(save)  # for `python -m pstats` or snakeviz
    table: _StatTable = stats.stats  # type: ignore[attr-defined]
    print(f"cProfile of `bulkrelay run`, {rows:,} rows, in process: {elapsed:.2f} s wall under the profiler")
    print(f"top {top} by own time (tottime):")
    print(f"    {'tottime s':>9} {'cumtime s':>9} {'calls':>9}  function")
    for key, (_, calls, own, cumulative, _) in sorted(table.items(), key=lambda kv: -kv[1][2])[:top]:
        print(f"    {own:9.2f} {cumulative:9.2f} {calls:9,}  {_where(key)}")
    _print_breakdown(table, rows, float(stats.total_tt))  # type: ignore[attr-defined]


def _where(key: _StatKey) -> str:
    file, line, name = key
    if file == "~":
        return name
    parts = Path(file).parts
    short = "/".join(parts[parts.index("bulkrelay") :]) if "bulkrelay" in parts else "/".join(parts[-2:])
    return f"{short}:{line} {name}"


def _cumulative(table: _StatTable, suffix: str, names: tuple[str, ...]) -> float:
    return sum(v[3] for (file, _, func), v in table.items() if func in names and file.endswith(suffix))


def _print_breakdown(table: _StatTable, rows: int, total: float) -> None:
    """Microseconds per row of each phase; "other" is the rest of the main thread's profiled time."""
    phases = [(label, _cumulative(table, suffix, name)) for label, suffix, name in _PHASES]
    other = total - sum(seconds for _, seconds in phases)  # uvloop's own C code is not seen: it is in here
    print(f"per row (µs, of {total:.2f} s profiled on the main thread; fsync runs on a worker thread):")
    for label, seconds in [*phases, ("other", other)]:
        print(f"    {label:<16} {seconds / rows * 1e6:8.1f} µs  {seconds / total:6.1%}")


# ----------------------------------------------------------------------------- main


def _latency_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--latency-rows", type=int, default=12_800, help="rows of (h); 0 to skip it")
    parser.add_argument("--latency-ms", type=int, default=100, help="the answer's delay in (h)")
    parser.add_argument("--latency-limit", type=int, default=500, help="the rate limit of (h), a second")
    parser.add_argument("--only-latency", action="store_true", help="only (h), the latency-bound case")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="40000,200000", help="comma list of input sizes for (a) and (b)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="best of this many of (a) and (b)")
    parser.add_argument("--parallel-rows", type=int, default=2_000)
    parser.add_argument("--rss-rows", default="100000,1000000", help="comma list; empty to skip (d)")
    parser.add_argument("--workdir", type=Path, help="on local disk (default: a temp dir under /var/tmp)")
    parser.add_argument("--batch-rows", type=int, default=200_000, help="rows of (f); 0 to skip it")
    parser.add_argument("--batch-items", type=int, default=100, help="rows a request in (f)")
    parser.add_argument("--only-batch", action="store_true", help="only (f), the batched run")
    parser.add_argument("--no-aiohttp", action="store_true", help="skip (a'), the aiohttp loop")
    parser.add_argument("--no-workers", action="store_true", help="skip (g), the run in worker processes")
    _latency_options(parser)
    parser.add_argument("--no-fixed-cost", action="store_true", help="skip (e), the one-row run")
    parser.add_argument(
        "--ceiling", action="store_true", help="(a1): the naive loop on one CPU, alternated too"
    )
    parser.add_argument("--profile", action="store_true", help="only the cProfile of one in-process run")
    parser.add_argument("--profile-rows", type=int, default=200_000)
    parser.add_argument("--profile-batch", action="store_true", help="profile (f)'s batched job instead")
    parser.add_argument("--top", type=int, default=30, help="profile entries to print")
    parser.add_argument("--profile-save", type=Path, help="also write the profile's stats to this file")
    args = parser.parse_args()
    base = args.workdir or Path("/var/tmp" if os.path.isdir("/var/tmp") else tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-run-", dir=base) as tmp:
        workdir = Path(tmp)
        with loopback_target(workdir) as (url, description):
            print(f"target: {description} at {url}; {os.cpu_count()} CPUs; workdir {workdir}")
            if args.profile:
                _profile(workdir, url, args)
                return
            if args.only_latency:
                _compare_latency(workdir, args)
                return
            if args.only_batch:
                _compare_batched(
                    workdir, url, args.batch_rows, args.concurrency, args.repeats, items=args.batch_items
                )
                return
            if os.environ.get("PYTHONDONTWRITEBYTECODE"):
                print("PYTHONDONTWRITEBYTECODE is set: bulkrelay processes run without it (bytecode cached)")
            print("(e) fixed cost of a one-row bulkrelay run, whole process (the first run warms the cache)")
            _one_row_cost(workdir, url, args.concurrency, 0 if args.no_fixed_cost else max(args.repeats, 3))
            for rows in [int(s) for s in args.rows.split(",") if s.strip()]:
                _compare(
                    workdir,
                    url,
                    rows,
                    args.concurrency,
                    args.repeats,
                    with_aiohttp=not args.no_aiohttp,
                    ceiling=args.ceiling,
                    workers=not args.no_workers,
                )
            if args.parallel_rows > 0:
                print(f"(c) GNU parallel + curl --joblog, {args.parallel_rows:,} rows, -j {args.concurrency}")
                print(f"    {_parallel_curl(workdir, url, args.parallel_rows, args.concurrency)}")
            if args.batch_rows:
                _compare_batched(
                    workdir, url, args.batch_rows, args.concurrency, args.repeats, items=args.batch_items
                )
            if args.latency_rows:
                _compare_latency(workdir, args)
            sizes = [int(s) for s in args.rss_rows.split(",") if s.strip()]
            if sizes:
                print("(d) peak RSS of bulkrelay run by input size")
                _measure_rss(workdir, url, sizes, args.concurrency)


if __name__ == "__main__":
    main()
