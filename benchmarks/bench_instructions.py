"""Instructions per row under callgrind: the naive pyreqwest loop against an in-process `bulkrelay run`.

    uv run python benchmarks/bench_instructions.py [--rows 4000] [--batch]

Rows per second on a shared 2-core machine move by a factor of two with the neighbours' load; the
instructions a row costs do not (valgrind counts them, whatever else runs). On a machine whose two
cores the naive loop already saturates (its event loop, pyreqwest's Tokio thread and nginx), the
ratio of instructions per row predicts the ratio of rows per second of bench_run.py: measured here,
0.45 by instructions against 0.45-0.50 by rows/s. Both sides count every thread of their process
(the event loop, Tokio, the journal's writer), not nginx, which does the same work for both.

Each side runs in its own `valgrind --tool=callgrind --instr-atstart=no` process (Debian `valgrind`),
passes over the rows once to warm up (connections, caches, lazy imports), then counts the instructions
of a second pass only (`callgrind_control -i on/off` around it). The relay's pass is a whole `run`:
preflight, run directory, journal with its fsyncs, summary. About two minutes for 4,000 rows.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import uvloop
from bench_run import _naive_reqwest, _write_batch_job, _write_input, _write_job
from nginx import loopback_target  # benchmarks/nginx.py


def _instrument(on: bool) -> None:
    command = ["callgrind_control", "-i", "on" if on else "off", str(os.getpid())]
    subprocess.run(command, check=True, capture_output=True)


def _child(side: str, rows: int) -> None:
    """In the valgrind process: warm up, then one counted pass of `side` over `rows` rows."""
    from bulkrelay.cli.main import main as cli_main  # imported before counting

    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp, loopback_target(Path(tmp)) as (url, _):
        workdir = Path(tmp)
        path = workdir / "rows.csv"
        _write_input(path, rows)
        if side == "batch":  # issue 29 item 2: 100 items a request, as bench_run.py's (f)
            job = _write_batch_job(workdir, url, path.name, 8, 100)
        else:
            job = _write_job(workdir, url, path.name, 64)
        for counted in (False, True):
            if counted:
                _instrument(True)
            if side == "naive":
                uvloop.run(_naive_reqwest(url, path, 64))
            else:
                argv = ["run", str(job), "--budget", "0", "--runs-dir", str(workdir / f"runs-{counted}")]
                out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
                quiet = contextlib.redirect_stdout(out)
                with contextlib.chdir(workdir), quiet, contextlib.suppress(SystemExit):
                    cli_main(argv)
            if counted:
                _instrument(False)


def _count(side: str, rows: int) -> int:
    """The instructions of one counted pass of `side`, from valgrind's own summary."""
    command = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        __file__,
        "--child",
        side,
        "--rows",
        str(rows),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--child", choices=("naive", "relay", "batch"), help=argparse.SUPPRESS)
    parser.add_argument("--batch", action="store_true", help="count a batched run (100 items a request) too")
    args = parser.parse_args()
    if args.child is not None:
        _child(args.child, args.rows)
        return
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed (apt-get install valgrind): nothing measured")
        return
    naive = _count("naive", args.rows) / args.rows
    relay = _count("relay", args.rows) / args.rows
    print(f"naive pyreqwest loop: {naive:10,.0f} instructions a row ({args.rows:,} rows)")
    print(f"bulkrelay run:        {relay:10,.0f} instructions a row (preflight, journal, fixed costs in)")
    print(f"==> ratio naive / bulkrelay: {naive / relay:.2f} (what bench_run.py's rows/s ratio tends to)")
    if args.batch:
        batch = _count("batch", args.rows) / args.rows
        print(f"batched bulkrelay run: {batch:10,.0f} instructions a row (100 items a request)")
        # Not a forecast of rows/s: a request's kernel and loopback work (a hundred times less of it in a
        # batched run) is not counted here, while the interpreter's per-row work is.
        print(f"==> ratio naive / batched: {naive / batch:.2f} (user-space work only; rows/s: bench_run.py)")


if __name__ == "__main__":
    main()
