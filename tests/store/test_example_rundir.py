"""The example run directory in `.bulkrelay.example/` loads through the project's own models."""

from __future__ import annotations

from pathlib import Path

import orjson

from bulkrelay.job.inputs import InputFingerprint
from bulkrelay.store.checkpoint import read_checkpoint
from bulkrelay.store.journal import scan_journal
from bulkrelay.store.rundir import CHECKPOINT, JOURNAL, LOCK, MANIFEST, SUMMARY, RunDir, RunState
from bulkrelay.store.summary import summarize, summarized_outcomes

EXAMPLE_RUNS = Path(__file__).resolve().parents[2] / ".bulkrelay.example" / "runs"


def example_run() -> RunDir:
    (path,) = [p for p in EXAMPLE_RUNS.iterdir() if p.is_dir()]
    return RunDir.open(path)


def test_example_holds_every_file_of_the_contract() -> None:
    run = example_run()
    names = {p.name for p in run.path.iterdir()}
    assert {MANIFEST, JOURNAL, SUMMARY, LOCK} <= names
    assert run.state is RunState.COMPLETED and CHECKPOINT not in names  # a completed run keeps none


def test_example_manifest_summary_and_journal_agree() -> None:
    # The example's journal predates commit markers: it must read as it always did.
    run = example_run()
    fingerprint = InputFingerprint.from_dict(run.plan.input.fingerprint())
    assert read_checkpoint(run.path) is None
    scan = scan_journal(
        run.journal_path, committed_seq=0, committed_offset=0, row_count=fingerprint.record_count
    )
    assert scan.torn_tail is None
    assert (scan.ok, scan.failed) == summarized_outcomes(run.path)


def test_example_summary_is_what_the_journal_says() -> None:
    run = example_run()
    stored = orjson.loads((run.path / SUMMARY).read_bytes())
    rebuilt = summarize(run.journal_path, total_rows=run.plan.input.record_count).to_json()
    for key in ("rows_total", "rows_done", "by_outcome", "by_status", "by_classification", "attempts"):
        assert stored[key] == rebuilt[key], key
