"""`bulkrelay run` end to end against a naive aiohttp loop, GNU parallel + curl, and peak RSS by input size.

    uv run python benchmarks/bench_run.py [--rows 40000] [--concurrency 64] [--rss-rows 100000,1000000]

The target is a loopback nginx (Debian `nginx-light`) answering every POST with 200 `{"id":1}` from a config
this script writes, or, without nginx, the built-in target in its own process with recording off.

Measured, all against the same target and the same JSON bodies:
  (a) a naive aiohttp loop: `concurrency` workers, no journal, nothing else (the baseline);
  (b) `bulkrelay run job.yaml --budget 0` as a whole process (start-up and preflight included), journal on
      local disk: rows / wall time, and the ratio b / a (the goal is >= 0.7);
  (c) GNU parallel + curl with --joblog on a few thousand rows, if `parallel` is installed;
  (d) peak RSS of `bulkrelay run` at each --rss-rows size; the largest over the smallest should stay <= 1.3.
Prints figures; asserts nothing about timing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson

_NGINX_CONF = """\
daemon off;
master_process on;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    keepalive_requests 10000000;
    keepalive_timeout 120s;
    server {{
        listen 127.0.0.1:{port};
        location / {{
            client_body_buffer_size 64k;
            default_type application/json;
            return 200 '{{"id":1}}';
        }}
    }}
}}
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 10
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the target exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        if time.monotonic() > deadline:
            raise RuntimeError("the target did not start listening")
        time.sleep(0.05)


@contextlib.contextmanager
def _target(workdir: Path) -> Iterator[tuple[str, str]]:
    """(url, description) of a running loopback target."""
    port = _free_port()
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if nginx:
        prefix = workdir / "nginx"
        prefix.mkdir()
        (prefix / "nginx.conf").write_text(_NGINX_CONF.format(prefix=prefix, port=port))
        command = [
            nginx,
            "-p",
            str(prefix),
            "-c",
            str(prefix / "nginx.conf"),
            "-e",
            str(prefix / "error.log"),
        ]
        description = "nginx (1 worker)"
    else:
        command = [sys.executable, "-m", "bulkrelay.demo.target", "--port", str(port), "--no-record"]
        description = "built-in target (python -m bulkrelay.demo.target --no-record)"
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(port, proc)
        yield f"http://127.0.0.1:{port}", description
    finally:
        proc.terminate()
        proc.wait(10)


# ----------------------------------------------------------------------------- inputs


def _body(n: int) -> bytes:
    return orjson.dumps({"id": n, "email": f"user{n}@example.com", "name": f"Customer {n}"})


def _write_input(path: Path, rows: int) -> None:
    with path.open("w", buffering=1 << 20) as out:
        out.write("id,email,name\n")
        for n in range(1, rows + 1):
            out.write(f"{n},user{n}@example.com,Customer {n}\n")


def _write_job(workdir: Path, url: str, input_name: str, concurrency: int) -> Path:
    job = workdir / f"job-{input_name}.yaml"
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
execution: {{ concurrency: {concurrency} }}
"""
    )
    return job


# ----------------------------------------------------------------------------- (a) naive aiohttp


async def _naive(url: str, rows: int, concurrency: int) -> float:
    next_row = 1
    failures = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal next_row, failures
            while next_row <= rows:
                n = next_row
                next_row += 1
                async with session.post(f"{url}/v1/customers", data=_body(n), headers=headers) as response:
                    await response.read()
                    failures += response.status != 200

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"naive loop: {failures} non-200 answers")
    return rows / elapsed


# ----------------------------------------------------------------------------- (b), (d) bulkrelay run


def _bulkrelay_run(job: Path, runs_dir: Path) -> tuple[float, int, dict[str, object]]:
    """(wall seconds, peak RSS in KiB, envelope) of one `bulkrelay run` process."""
    command = [
        sys.executable,
        "-m",
        "bulkrelay",
        "run",
        str(job),
        "--budget",
        "0",
        "--runs-dir",
        str(runs_dir),
    ]
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(command, cwd=job.parent, stdout=out, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        envelope = orjson.loads(out.read())
    if proc.returncode != 0:
        raise RuntimeError(f"bulkrelay run exited {proc.returncode}: {envelope.get('error')}")
    return elapsed, int(usage.ru_maxrss), envelope


# ----------------------------------------------------------------------------- (c) GNU parallel + curl


def _parallel_curl(workdir: Path, url: str, rows: int, concurrency: int) -> str:
    parallel = shutil.which("parallel")
    if parallel is None:
        return "GNU parallel is not installed (apt-get install parallel): skipped"
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


def _measure_run(workdir: Path, url: str, rows: int, concurrency: int, repeats: int) -> float:
    _write_input(workdir / "rows.csv", rows)
    job = _write_job(workdir, url, "rows.csv", concurrency)
    best = 0.0
    for attempt in range(repeats):
        elapsed, _, envelope = _bulkrelay_run(job, workdir / f"runs-{attempt}")
        data = envelope["data"]
        assert isinstance(data, dict)
        engine_rate = data["summary"]["this_call"]["rows_per_second"]
        print(
            f"    run {attempt + 1}: {rows / elapsed:10,.0f} rows/s whole process "
            f"({elapsed:.2f} s; engine alone {engine_rate:,.0f} rows/s)"
        )
        best = max(best, rows / elapsed)
    return best


def _measure_rss(workdir: Path, url: str, sizes: list[int], concurrency: int) -> None:
    peaks = []
    for rows in sizes:
        name = f"rss-{rows}.csv"
        _write_input(workdir / name, rows)
        job = _write_job(workdir, url, name, concurrency)
        elapsed, peak_kib, _ = _bulkrelay_run(job, workdir / f"runs-rss-{rows}")
        peaks.append(peak_kib)
        print(
            f"    {rows:>9,} rows: peak RSS {peak_kib / 1024:7.1f} MiB  "
            f"({rows / elapsed:,.0f} rows/s, {elapsed:.1f} s)"
        )
        (workdir / name).unlink()
    print(f"    ratio largest / smallest: {peaks[-1] / peaks[0]:.2f}  (goal <= 1.3)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="best of this many of (a) and (b)")
    parser.add_argument("--parallel-rows", type=int, default=2_000)
    parser.add_argument("--rss-rows", default="100000,1000000", help="comma list; empty to skip (d)")
    parser.add_argument("--workdir", type=Path, help="on local disk (default: a temp dir under /var/tmp)")
    args = parser.parse_args()
    base = args.workdir or Path("/var/tmp" if os.path.isdir("/var/tmp") else tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-run-", dir=base) as tmp:
        workdir = Path(tmp)
        with _target(workdir) as (url, description):
            print(f"target: {description} at {url}; {os.cpu_count()} CPUs; workdir {workdir}")
            print(f"(a) naive aiohttp loop, {args.rows:,} POSTs, concurrency {args.concurrency}, no journal")
            naive = 0.0
            for attempt in range(args.repeats):
                rate = asyncio.run(_naive(url, args.rows, args.concurrency))
                print(f"    run {attempt + 1}: {rate:10,.0f} rows/s")
                naive = max(naive, rate)
            print(f"(b) bulkrelay run, {args.rows:,} rows, concurrency {args.concurrency}, journal on disk")
            relay = _measure_run(workdir, url, args.rows, args.concurrency, args.repeats)
            print(
                f"==> best: bulkrelay {relay:,.0f} rows/s vs naive {naive:,.0f} rows/s: "
                f"ratio {relay / naive:.2f} (goal >= 0.7)"
            )
            print(f"(c) GNU parallel + curl --joblog, {args.parallel_rows:,} rows, -j {args.concurrency}")
            print(f"    {_parallel_curl(workdir, url, args.parallel_rows, args.concurrency)}")
            sizes = [int(s) for s in args.rss_rows.split(",") if s.strip()]
            if sizes:
                print("(d) peak RSS of bulkrelay run by input size")
                _measure_rss(workdir, url, sizes, args.concurrency)


if __name__ == "__main__":
    main()
