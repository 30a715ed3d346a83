"""Start-up cost: `bulkrelay --help` and `--version` against bare Python, and the fixed cost of a one-row run.

    uv run python benchmarks/bench_startup.py [--repeats 15]

Each command runs in a fresh interpreter (`python -m bulkrelay ...`, as the console script does), best of
`--repeats`. The bar for `--help` and `--version` is 0.1 s; the ratio to a bare `python -c pass` shows what
BulkRelay itself adds. Then `python -X importtime` names the modules `--help` loads, heaviest first, and a
one-row `run --budget 0` against the embedded target (in its own process) gives the fixed cost of a run.
Prints figures; asserts nothing about timing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from servers import builtin_target  # benchmarks/servers.py


def _best_of(command: Sequence[str], repeats: int, cwd: Path | None = None) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        best = min(best, time.perf_counter() - started)
    return best


def _heaviest_imports(args: Sequence[str], top: int = 8) -> list[tuple[int, str]]:
    """(cumulative microseconds, module) of the top-level imports `python -X importtime` reports."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "bulkrelay", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    rows: list[tuple[int, str]] = []
    for line in proc.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit() and not parts[2].startswith("   "):
            rows.append((int(parts[1]), parts[2].strip()))
    return sorted(rows, reverse=True)[:top]


def _one_row_run(repeats: int) -> float:
    with builtin_target() as url, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "one.csv").write_text("id,email\n1,a@example.com\n")
        job = work / "job.yaml"
        job.write_text(
            "version: 1\ninput: {file: one.csv}\n"
            f"request: {{method: POST, url: '{url}/items/{{id}}', json: {{email: {{from: email}}}}}}\n"
        )
        best = float("inf")
        for n in range(repeats):
            command = [sys.executable, "-m", "bulkrelay", "run", str(job), "--budget", "0"]
            runs = ["--runs-dir", str(work / f"runs{n}")]  # a fresh runs dir: never the identical re-run
            best = min(best, _best_of([*command, *runs], 1, cwd=work))
        return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    bare = _best_of([sys.executable, "-c", "pass"], args.repeats)
    print(f"bare python -c pass          {bare * 1000:7.1f} ms")
    for flag in ("--help", "--version"):
        took = _best_of([sys.executable, "-m", "bulkrelay", flag], args.repeats)
        verdict = "ok" if took <= 0.1 else "over the 0.1 s bar"
        ratio = took / bare
        print(f"bulkrelay {flag:<10}         {took * 1000:7.1f} ms   {ratio:4.1f}x bare python   {verdict}")
    print("heaviest imports of --help (cumulative):")
    for micros, module in _heaviest_imports(["--help"]):
        print(f"    {micros / 1000:7.1f} ms  {module}")
    run = _one_row_run(max(3, args.repeats // 3))
    print(f"one-row run --budget 0       {run * 1000:7.1f} ms   {run / bare:4.1f}x bare python")


if __name__ == "__main__":
    main()
