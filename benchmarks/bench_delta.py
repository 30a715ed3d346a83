"""Delta sync: the cost of a nightly delta run against a plain `validate` of the same file.

    uv run python benchmarks/bench_delta.py [--rows 1000000] [--changed 0.01]

Night 1 is simulated: a completed run whose journal holds a success for every row (with the digest
BulkRelay computes) is written directly and the sync state rebuilt from it, as
`bulkrelay sync-state rebuild` does; sending a million requests would only time the target. A real
night 1 also leaves in the state the digest of each row's input line (docs/delta.md), which the
journal does not hold: a delta run on the same file, which sends nothing, puts them there. Then
`--changed` of the rows get a new email, and fresh processes are timed on the same file, in turns,
`--rounds` times (the best of each is compared: this machine's noise is not the code's):
`bulkrelay validate`, and `bulkrelay run` of the delta job on a copy of night 1's state
(preflight with the line scan beside it, the changed rows sent to a loopback target, the state
updated). The target is a loopback nginx when installed, else the built-in one
(benchmarks/nginx.py, as bench_run.py), and the output says which: the built-in target's own CPU
would otherwise be timed as the relay's. Printed, all measured in this one run (issue targets in
brackets):

- whole-process time of the delta run / validate, best of each    [<= 1.5]
  (and the same in CPU seconds, steadier when the machine is busy; how much of a validate the relay
  of the changed rows takes; and a third night on the same file, with no row changed: what choosing
  the rows costs on its own)
- peak RSS of the delta run at `--rows` / at 100k rows            [<= 1.3]
- sync state bytes on disk per key                                [<= 100]

Nothing here asserts timing.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from nginx import loopback_target  # benchmarks/nginx.py

from bulkrelay.job.config import load_job
from bulkrelay.job.digest import RequestDigester
from bulkrelay.job.inputs import open_records
from bulkrelay.job.preflight import resolve_input
from bulkrelay.job.request import RequestRenderer
from bulkrelay.store.journal import JournalEntry, encode_line
from bulkrelay.store.manifest import InputRecord, RunPlan
from bulkrelay.store.rundir import RunDir, RunState
from bulkrelay.sync.state import job_identity, rebuild_state, state_path

JOB = """\
version: 1
name: bench-delta
input: {{file: {csv}, key: id}}
request:
  method: PUT
  url: "{url}/v1/customers/{{id}}"
  headers: {{Authorization: "Bearer ${{BENCH_TOKEN}}"}}
  json:
    email: {{from: email}}
    name: {{from: name}}
    age: {{from: age, type: integer}}
    city: {{from: city}}
  idempotency_key: {{header: Idempotency-Key}}
execution: {{concurrency: 16, sync: delta}}
"""
# The processes timed run as an installed bulkrelay does, with their modules' bytecode cached (the
# 100k-row night runs first and warms the cache). With PYTHONDONTWRITEBYTECODE (set in some sandboxes
# and CI images) each would compile its modules from source, a run more of them than a validate.
ENV = {
    **{name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"},
    "BENCH_TOKEN": "bench-token",
}


def write_csv(path: Path, rows: int, changed_every: int | None) -> None:
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["id", "email", "name", "age", "city"])
        for n in range(1, rows + 1):
            tag = "-new" if changed_every and n % changed_every == 0 else ""
            writer.writerow(
                [n, f"user{n}{tag}@example.org", f"User Number {n}", 18 + n % 70, f"City {n % 500}"]
            )


def seed_night_1(job_path: Path, runs_dir: Path) -> None:
    """A completed run that delivered every row of the job's input, and the state rebuilt from it;
    then a delta run on the same file (nothing to send) gives the state each row's line, as the
    deliveries of a real night 1 would have."""
    job = load_job(job_path)
    renderer = RequestRenderer.from_config(job.config.request, ENV, sorted_json=True)
    digester = RequestDigester(job.config.request, renderer.redactor, sorted_json=True)
    no_input = InputRecord("/jobs/input.csv", "csv", gzip=False, sha256="0" * 64, size=0, record_count=0)
    plan = RunPlan(job_path=str(job.path), input=no_input, config_sha256="0" * 64, name=job.config.name)
    run = RunDir.create(runs_dir, plan)
    with run.journal_path.open("wb") as journal, open_records(resolve_input(job, None), print) as records:
        for record in records:
            request = renderer.render(record)
            entry = JournalEntry(
                row_number=record.row_number,
                success=True,
                classification="success",
                status_code=200,
                attempts=1,
                retryable=False,
                error=None,
                duration_ms=1.0,
                key=record.fields["id"],
                digest=digester.digest(request, record.fields).hex(),
            )
            journal.write(encode_line(record.row_number, entry))
    run.mark_ended(RunState.COMPLETED, None)
    rebuild_state(runs_dir, job_identity(job.config.name, job.path))
    timed("run", str(job_path), "--budget", "0", "--runs-dir", str(runs_dir), cwd=job_path.parent)


def timed(*args: str, cwd: Path) -> tuple[float, float, int, dict[str, object]]:
    """(wall seconds, CPU seconds, peak RSS in KiB, envelope) of one fresh `bulkrelay` process."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        command = [sys.executable, "-m", "bulkrelay", *args]
        proc = subprocess.Popen(command, cwd=cwd, env=ENV, stdout=out, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - started
        out.seek(0)
        envelope = orjson.loads(out.read())
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"bulkrelay {args[0]} failed: {envelope.get('error')}")
    return elapsed, usage.ru_utime + usage.ru_stime, int(usage.ru_maxrss), envelope


def night_2(folder: Path, url: str, rows: int, changed: float, rounds: int) -> dict[str, float]:
    """Seed night 1 for `rows` rows, change some, and time validate, the delta run and a night with
    nothing changed, in fresh processes, `rounds` times in turns; the best of each."""
    folder.mkdir()
    data = folder / "customers.csv"
    job = folder / "job.yaml"
    job.write_text(JOB.format(csv=data.name, url=url))
    night_1 = folder / "night-1"
    write_csv(data, rows, None)
    seed_night_1(job, night_1)
    write_csv(data, rows, round(1 / changed))
    runs_dir = folder / "runs"
    best: dict[str, float] = {}
    ratios: list[float] = []  # each round's delta run / validate, for the median
    for _ in range(rounds):
        shutil.rmtree(runs_dir, ignore_errors=True)
        shutil.copytree(night_1, runs_dir)
        validate_s, validate_cpu, _, _ = timed("validate", str(job), cwd=folder)
        run_s, run_cpu, run_kib, envelope = timed(
            "run", str(job), "--budget", "0", "--runs-dir", str(runs_dir), cwd=folder
        )
        # Night 3: the same file again, so no row has changed: what choosing the rows costs on its own.
        unchanged_s, _, _, _ = timed(
            "run", str(job), "--budget", "0", "--runs-dir", str(runs_dir), cwd=folder
        )
        summary = envelope["data"]["summary"]  # type: ignore[index]
        measured = {
            "validate_s": validate_s,
            "validate_cpu": validate_cpu,
            "run_s": run_s,
            "run_cpu": run_cpu,
            "unchanged_s": unchanged_s,
            "relay_s": summary["this_call"]["elapsed_seconds"],
        }
        for name, value in measured.items():
            best[name] = min(best.get(name, value), value)
        best["run_kib"] = max(best.get("run_kib", 0), run_kib)  # the peak: the worst round
        ratios.append(run_s / validate_s)
        best["sent"], best["skipped"] = summary["rows_done"], summary["skipped_unchanged"]
    state = state_path(runs_dir, job_identity("bench-delta", job))
    best["state_bytes_per_key"] = state.stat().st_size / rows
    best["median_ratio"] = statistics.median(ratios)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changed", type=float, default=0.01)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-delta-") as tmp:
        folder = Path(tmp)
        with loopback_target(folder) as (url, description):
            print(f"target: {description} at {url}; {os.cpu_count()} CPUs")
            small = night_2(folder / "small", url, 100_000, args.changed, args.rounds)
            big = night_2(folder / "big", url, args.rows, args.changed, args.rounds)
    for label, m in ((f"{100_000:,} rows", small), (f"{args.rows:,} rows", big)):
        print(
            f"{label:>16}: validate {m['validate_s']:.2f} s, delta run {m['run_s']:.2f} s "
            f"(of which relaying {m['sent']:,} rows {m['relay_s']:.2f} s; skipped unchanged "
            f"{m['skipped']:,}); peak RSS of the delta run {m['run_kib'] / 1024:.0f} MiB"
        )
    time_ratio = big["run_s"] / big["validate_s"]
    cpu_ratio = big["run_cpu"] / big["validate_cpu"]
    rss_ratio = big["run_kib"] / small["run_kib"]
    print(
        f"delta run / validate, whole process, {args.rows:,} rows, best of {args.rounds} each: "
        f"{time_ratio:.2f}  [<= 1.5]  (the median of the rounds' own ratios: {big['median_ratio']:.2f})"
    )
    print(
        f"  of which relaying the {big['sent']:,} changed rows: {big['relay_s'] / big['validate_s']:.2f} "
        f"of a validate; a delta run with no row changed: {big['unchanged_s'] / big['validate_s']:.2f}"
    )
    print(
        f"the same in CPU seconds of the process (steadier on a busy machine; the target's CPU not "
        f"counted): {cpu_ratio:.2f}"
    )
    print(f"peak RSS of the delta run, {args.rows:,} / 100,000 rows: {rss_ratio:.2f}  [<= 1.3]")
    print(f"sync state on disk: {big['state_bytes_per_key']:.1f} bytes per key  [<= 100]")


if __name__ == "__main__":
    main()
