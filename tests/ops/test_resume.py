"""`bulkrelay resume` through the real CLI: it refuses every change that would make continuing wrong
(naming what changed), accepts what does not change the job's meaning, survives a torn journal tail,
refuses a damaged one, and lets only one process hold a run."""

from __future__ import annotations

import shutil
import subprocess
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.store.checkpoint import read_checkpoint
from bulkrelay.store.journal import is_commit_marker
from tests.clirun import cli_env, start_cli
from tests.jobfiles import make_rows, write_csv, write_job
from tests.runsteps import (
    ROWS,
    SLOW,
    assert_each_row_once,
    resume,
    rewrite_job,
    run_job,
    sent_ids,
    stop_midway,
)
from tests.spawnedruns import wait_for_lock
from tests.targetproc import TargetProcess

# real processes: outside the fast lane (`-m "not slow"`)
pytestmark = [pytest.mark.slow, pytest.mark.target_plan(SLOW)]


def set_manifest_state(run_dir: str | Path, state: str) -> None:
    manifest = Path(run_dir) / "run.json"
    data = orjson.loads(manifest.read_bytes())
    data["state"] = state
    manifest.write_bytes(orjson.dumps(data))


# ---------------------------------------------------------------- refusals


def _flip_same_size(path: Path) -> None:
    data = path.read_bytes()
    index = data.index(b"user77@")
    path.write_bytes(data[:index] + b"usex77@" + data[index + 7 :])


def test_changed_bytes_of_the_same_size_refuse_with_input_changed(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    run_dir = stop_midway(tmp_path, job).data["run_dir"]
    _flip_same_size(tmp_path / "data.csv")

    result = resume(tmp_path, run_dir)

    assert result.exit_code == ExitCode.PRECONDITION
    assert result.error_code == "INPUT_CHANGED"
    changed = result.envelope["error"]["context"]["changed"]
    assert set(changed) == {"sha256"}
    assert changed["sha256"]["recorded"] != changed["sha256"]["now"]
    message = result.envelope["error"]["message"]
    assert changed["sha256"]["recorded"] in message and changed["sha256"]["now"] in message


def test_an_appended_row_refuses_naming_size_and_record_count(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    run_dir = stop_midway(tmp_path, job).data["run_dir"]
    write_csv(tmp_path / "data.csv", make_rows(ROWS + 1))

    result = resume(tmp_path, run_dir)

    assert result.exit_code == ExitCode.PRECONDITION
    assert result.error_code == "INPUT_CHANGED"
    changed = result.envelope["error"]["context"]["changed"]
    assert changed["record_count"] == {"recorded": ROWS, "now": ROWS + 1}
    assert changed["size"]["now"] > changed["size"]["recorded"]
    assert f"record_count {ROWS} -> {ROWS + 1}" in result.envelope["error"]["message"]


@pytest.mark.parametrize(
    ("change", "setting"),
    [
        ({"request": {"url": "URL/things/{id}"}}, "request.url"),
        ({"retry": {"max_attempts": 3}}, "retry"),
        ({"execution": {"concurrency": 2}}, "execution.concurrency"),
    ],
)
def test_a_semantic_config_change_refuses_naming_the_setting(
    tmp_path: Path, target: TargetProcess, change: dict[str, Any], setting: str
) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    run_dir = stop_midway(tmp_path, job).data["run_dir"]
    if "request" in change:
        change = {"request": {"url": f"{target.url}/things/{{id}}"}}
    rewrite_job(job, **change)

    result = resume(tmp_path, run_dir)

    assert result.exit_code == ExitCode.PRECONDITION
    assert result.error_code == "CONFIG_CHANGED"
    error = result.envelope["error"]
    assert any(name.startswith(setting) for name in error["context"]["changed"]), error
    assert setting in error["message"]
    assert f"{error['context']['recorded'][:12]} -> {error['context']['now'][:12]}" in error["message"]
    assert sum(sent_ids(target).values()) < ROWS  # nothing more was sent


def test_a_rotated_secret_and_a_new_name_do_not_block_resume(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(
        tmp_path, target.url, rows=ROWS, request={"headers": {"Authorization": "Bearer ${TEST_TOKEN}"}}
    )
    run_dir = stop_midway(tmp_path, job, env=cli_env(TEST_TOKEN="old-token")).data["run_dir"]
    rewrite_job(job, name="renamed-job")

    result = resume(tmp_path, run_dir, env=cli_env(TEST_TOKEN="new-token"))

    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    assert_each_row_once(run_dir, ROWS)
    tokens = Counter(request["headers"]["Authorization"] for request in target.requests())
    assert set(tokens) == {"Bearer old-token", "Bearer new-token"}
    assert sum(tokens.values()) == ROWS
    for path in Path(run_dir).iterdir():
        assert b"-token" not in path.read_bytes(), path  # secrets never reach the run directory


def test_completed_runs_are_not_resumable(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=20)
    done = run_job(tmp_path, job)
    assert done.exit_code == ExitCode.SUCCESS

    result = resume(tmp_path, done.data["run_dir"])

    assert result.exit_code == ExitCode.PRECONDITION
    assert result.error_code == "RUN_NOT_RESUMABLE"
    assert "completed" in result.envelope["error"]["message"]
    assert sum(sent_ids(target).values()) == 20


def test_cancelled_runs_are_not_resumable(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    run_dir = stop_midway(tmp_path, job).data["run_dir"]
    set_manifest_state(run_dir, "cancelled")

    result = resume(tmp_path, run_dir)

    assert result.exit_code == ExitCode.PRECONDITION
    assert result.error_code == "RUN_NOT_RESUMABLE"
    assert result.envelope["error"]["context"]["state"] == "cancelled"


def test_a_run_json_with_an_unknown_state_is_refused_naming_the_file_and_field(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    run_dir = stop_midway(tmp_path, job).data["run_dir"]
    sent = sum(sent_ids(target).values())
    set_manifest_state(run_dir, "paused")  # hand-edited: no state BulkRelay writes

    result = resume(tmp_path, run_dir)

    assert result.exit_code == ExitCode.PRECONDITION, result.envelope
    assert result.error_code == "JOURNAL_CORRUPT"
    context = result.envelope["error"]["context"]
    assert context == {"path": str(Path(run_dir) / "run.json"), "field": "state", "state": "paused"}
    assert "'paused'" in result.envelope["error"]["message"]
    assert sum(sent_ids(target).values()) == sent  # nothing more was sent


def test_a_missing_run_dir_is_not_found(tmp_path: Path) -> None:
    result = resume(tmp_path, tmp_path / "no-such-run")
    assert result.exit_code == ExitCode.NOT_FOUND
    assert result.error_code == "NOT_FOUND"


# ---------------------------------------------------------------- moves that do not change the meaning


def test_a_moved_input_with_the_same_bytes_is_accepted_with_input_flag(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    run_dir = stop_midway(tmp_path, job).data["run_dir"]
    moved = tmp_path / "elsewhere" / "renamed.csv"
    moved.parent.mkdir()
    shutil.move(tmp_path / "data.csv", moved)

    result = resume(tmp_path, run_dir, "--input", moved)

    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    assert_each_row_once(run_dir, ROWS)
    assert set(sent_ids(target).values()) == {1}  # no committed row was sent again


def test_a_moved_input_with_other_bytes_is_refused_with_input_flag(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    run_dir = stop_midway(tmp_path, job).data["run_dir"]
    other = write_csv(tmp_path / "other.csv", make_rows(ROWS, tag="x"))

    result = resume(tmp_path, run_dir, "--input", other)

    assert result.exit_code == ExitCode.PRECONDITION
    assert result.error_code == "INPUT_CHANGED"


def test_a_moved_input_is_accepted_when_the_job_points_to_it(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    run_dir = stop_midway(tmp_path, job).data["run_dir"]
    (tmp_path / "in").mkdir()
    shutil.move(tmp_path / "data.csv", tmp_path / "in" / "moved.csv")
    rewrite_job(job, input={"file": "in/moved.csv"})

    result = resume(tmp_path, run_dir)

    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    assert_each_row_once(run_dir, ROWS)
    assert set(sent_ids(target).values()) == {1}


def test_a_moved_input_without_input_flag_names_where_it_was_and_suggests_the_flag(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    run_dir = stop_midway(tmp_path, job).data["run_dir"]
    recorded = orjson.loads((Path(run_dir) / "run.json").read_bytes())["input"]["path"]
    shutil.move(tmp_path / "data.csv", tmp_path / "moved.csv")

    result = resume(tmp_path, run_dir)

    assert result.exit_code == ExitCode.NOT_FOUND
    assert result.error_code == "NOT_FOUND"
    error = result.envelope["error"]
    assert recorded in error["message"]
    assert error["context"]["recorded_input"] == recorded
    assert "--input NEW_PATH" in error["suggestion"] and str(run_dir) in error["suggestion"]


def test_a_moved_job_is_found_with_config_flag(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    run_dir = stop_midway(tmp_path, job).data["run_dir"]
    moved = tmp_path / "jobs"
    moved.mkdir()
    shutil.move(job, moved / "job.yaml")
    shutil.move(tmp_path / "data.csv", moved / "data.csv")  # paths in a job are relative to it

    lost = resume(tmp_path, run_dir)
    assert lost.exit_code == ExitCode.NOT_FOUND
    assert "--config" in lost.envelope["error"]["suggestion"]

    result = resume(tmp_path, run_dir, "--config", moved / "job.yaml")
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    assert_each_row_once(run_dir, ROWS)
    assert set(sent_ids(target).values()) == {1}


# ---------------------------------------------------------------- journal damage


def _line_starts(journal: Path) -> list[int]:
    starts, offset = [], 0
    for line in journal.read_bytes().splitlines(keepends=True):
        starts.append(offset)
        offset += len(line)
    return starts


def _rewind_checkpoint(run_dir: Path, lines: int) -> None:
    """Make the checkpoint say only the first `lines` lines were committed (a crash before it moved on);
    the last of them is a group's commit marker, as every frontier is."""
    journal = run_dir / "results.jsonl"
    kept = journal.read_bytes().splitlines(keepends=True)[:lines]
    assert is_commit_marker(kept[-1])
    entries = [orjson.loads(line) for line in kept if not is_commit_marker(line)]
    seq, ok = len(entries), sum(1 for entry in entries if entry["success"])
    path = run_dir / "checkpoint.json"
    data = orjson.loads(path.read_bytes())
    data.update(seq=seq, offset=_line_starts(journal)[lines], rows_done=seq, ok=ok, failed=seq - ok)
    del data["journal_prefix"]  # the digest of the later frontier: a checkpoint of then had its own
    path.write_bytes(orjson.dumps(data))


def _markers(lines: list[bytes]) -> list[int]:
    """The indexes of the commit markers among a journal's lines."""
    return [index for index, line in enumerate(lines) if is_commit_marker(line)]


@pytest.mark.parametrize("damage", ["half_line_appended", "cut_inside_the_last_group"])
def test_a_torn_tail_is_moved_aside_and_the_resume_completes(
    tmp_path: Path, target: TargetProcess, damage: str
) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    run_dir = Path(stop_midway(tmp_path, job).data["run_dir"])
    journal = run_dir / "results.jsonl"
    data = journal.read_bytes()
    lines = data.splitlines(keepends=True)
    if damage == "half_line_appended":
        torn = lines[0][: len(lines[0]) // 2]
        journal.write_bytes(data + torn)
        kept = len(lines)
    else:
        markers = _markers(lines)
        assert len(markers) >= 2, "a run stopped midway commits more than one group"
        kept = markers[-2] + 1  # the last group is torn inside its marker: its good lines go too
        _rewind_checkpoint(run_dir, kept)
        torn = b"".join(lines[kept : markers[-1]]) + lines[markers[-1]][:40]
        journal.write_bytes(b"".join(lines[:kept]) + torn)

    result = resume(tmp_path, run_dir)

    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    warning = next(w for w in result.envelope["warnings"] if w["code"] == "JOURNAL_TAIL_TRUNCATED")
    aside = Path(warning["context"]["moved_to"])
    assert aside.parent == run_dir and aside.name.startswith("results.jsonl.torn-")
    assert aside.read_bytes() == torn
    assert_each_row_once(run_dir, ROWS)
    assert journal.read_bytes().startswith(b"".join(lines[:kept]))
    resent = {row for row, count in sent_ids(target).items() if count > 1}
    lost = [line for line in lines[kept:] if not is_commit_marker(line)]
    assert resent == {str(orjson.loads(line)["row_number"]) for line in lost}  # only the lost ones


def test_a_flipped_byte_before_the_frontier_refuses_with_journal_corrupt(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    run_dir = Path(stop_midway(tmp_path, job).data["run_dir"])
    journal = run_dir / "results.jsonl"
    starts = _line_starts(journal)
    data = bytearray(journal.read_bytes())
    data[starts[4] + 10] ^= 0x01  # inside line 5, well before the checkpoint's frontier
    journal.write_bytes(bytes(data))
    before = sum(sent_ids(target).values())

    result = resume(tmp_path, run_dir)

    assert result.exit_code == ExitCode.PRECONDITION
    assert result.error_code == "JOURNAL_CORRUPT"
    context = result.envelope["error"]["context"]
    assert context["line"] == 5 and context["offset"] == starts[4]
    assert "line 5" in result.envelope["error"]["message"]
    suggestion = result.envelope["error"]["suggestion"]
    assert "cannot be continued safely" in suggestion and f"restore {journal} from a backup" in suggestion
    assert sum(sent_ids(target).values()) == before
    assert journal.read_bytes() == bytes(data)  # refused, not "repaired"


def test_a_journal_shorter_than_the_checkpoint_refuses(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    run_dir = Path(stop_midway(tmp_path, job).data["run_dir"])
    journal = run_dir / "results.jsonl"
    checkpoint = read_checkpoint(run_dir)
    assert checkpoint is not None and checkpoint.offset == journal.stat().st_size
    journal.write_bytes(journal.read_bytes()[:-5])

    result = resume(tmp_path, run_dir)

    assert result.exit_code == ExitCode.PRECONDITION
    assert result.error_code == "JOURNAL_CORRUPT"
    assert str(checkpoint.offset) in result.envelope["error"]["message"]


def test_a_flipped_byte_deep_in_the_journal_without_a_checkpoint_refuses(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    run_dir = Path(stop_midway(tmp_path, job).data["run_dir"])
    (run_dir / "checkpoint.json").unlink()
    journal = run_dir / "results.jsonl"
    starts = _line_starts(journal)
    data = bytearray(journal.read_bytes())
    data[starts[4] + 10] ^= 0x01  # line 5, with good lines after it
    journal.write_bytes(bytes(data))
    before = sum(sent_ids(target).values())

    result = resume(tmp_path, run_dir)

    assert result.exit_code == ExitCode.PRECONDITION
    assert result.error_code == "JOURNAL_CORRUPT"
    context = result.envelope["error"]["context"]
    assert context["line"] == 5 and context["offset"] == starts[4]
    assert f"line 5 (byte offset {starts[4]})" in result.envelope["error"]["message"]
    assert sum(sent_ids(target).values()) == before
    assert journal.read_bytes() == bytes(data)


def test_a_torn_tail_without_a_checkpoint_is_still_recovered(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    run_dir = Path(stop_midway(tmp_path, job).data["run_dir"])
    (run_dir / "checkpoint.json").unlink()
    journal = run_dir / "results.jsonl"
    data = journal.read_bytes()
    journal.write_bytes(data + data[: len(data.splitlines()[0]) // 2])

    result = resume(tmp_path, run_dir)

    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    assert [w["code"] for w in result.envelope["warnings"]] == ["JOURNAL_TAIL_TRUNCATED"]
    assert_each_row_once(run_dir, ROWS)
    assert set(sent_ids(target).values()) == {1}


@pytest.mark.parametrize("command", ["resume", "identical_run"])
def test_a_run_whose_journal_and_checkpoint_are_gone_is_refused_not_restarted(
    tmp_path: Path, target: TargetProcess, command: str
) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    run_dir = Path(stop_midway(tmp_path, job).data["run_dir"])
    (run_dir / "checkpoint.json").unlink()
    (run_dir / "results.jsonl").unlink()
    before = sum(sent_ids(target).values())

    result = resume(tmp_path, run_dir) if command == "resume" else run_job(tmp_path, job)

    assert result.exit_code == ExitCode.PRECONDITION, result.envelope
    assert result.error_code == "JOURNAL_CORRUPT"
    error = result.envelope["error"]
    assert "results.jsonl" in error["message"] and "missing" in error["message"]
    assert error["context"]["run_dir"] == str(run_dir)
    assert sum(sent_ids(target).values()) == before
    assert not (run_dir / "results.jsonl").exists()


def test_a_deleted_middle_line_refuses_naming_the_gap(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    run_dir = Path(stop_midway(tmp_path, job).data["run_dir"])
    journal = run_dir / "results.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    gap = len(lines) // 2  # 0-based: line gap + 1 goes, a row's line (not a commit marker)
    gap += is_commit_marker(lines[gap])
    seq = orjson.loads(lines[gap])["seq"]
    # The row may close its group (its commit marker follows): the marker goes with it, so
    # the gap reads the same whatever rows group commit happened to gather.
    end = gap + 1 + (gap + 1 < len(lines) and is_commit_marker(lines[gap + 1]))
    journal.write_bytes(b"".join([*lines[:gap], *lines[end:]]))

    result = resume(tmp_path, run_dir)

    assert result.exit_code == ExitCode.PRECONDITION
    assert result.error_code == "JOURNAL_CORRUPT"
    error = result.envelope["error"]
    offset = sum(len(line) for line in lines[:gap])
    assert error["context"]["line"] == gap + 1 and error["context"]["offset"] == offset
    assert f"line {gap + 1} (byte offset {offset})" in error["message"]
    assert f"seq {seq + 1} does not follow seq {seq - 1}" in error["message"]


# ---------------------------------------------------------------- the lock


def _spawn_resume(cwd: Path, run_dir: str) -> subprocess.Popen[bytes]:
    return start_cli("resume", run_dir, "--budget", "0", cwd=cwd)


def test_two_resumes_of_one_run_one_gets_run_locked(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    run_dir = stop_midway(tmp_path, job).data["run_dir"]
    target.set_plan({"rules": [{"delay_ms": 400}]})  # the first resume holds the run for a while
    first = _spawn_resume(tmp_path, run_dir)
    try:
        wait_for_lock(Path(run_dir), first)

        second = resume(tmp_path, run_dir)
        rerun = run_job(tmp_path, job)  # the identical invocation finds the run held, too

        assert second.exit_code == ExitCode.CONFLICT
        assert second.error_code == "RUN_LOCKED"
        assert second.envelope["error"]["retryable"] is True
        assert rerun.exit_code == ExitCode.CONFLICT and rerun.error_code == "RUN_LOCKED"
        target.set_plan(SLOW)  # let the first one finish soon
        stdout, _ = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == ExitCode.SUCCESS, stdout
    assert_each_row_once(run_dir, ROWS)
    assert set(sent_ids(target).values()) == {1}


def test_a_committed_line_rewritten_with_a_valid_checksum_refuses_naming_the_file(
    tmp_path: Path, target: TargetProcess
) -> None:
    """Each line still checks out on its own; the checkpoint's digest of the committed bytes does not."""
    job = write_job(tmp_path, target.url, rows=ROWS)
    run_dir = Path(stop_midway(tmp_path, job).data["run_dir"])
    journal = run_dir / "results.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    fields = orjson.loads(lines[0])
    del fields["crc"]
    fields["attempts"] += 1  # line 1: committed (a stop commits every finished row, then checkpoints)
    head = orjson.dumps(fields)[:-1]
    lines[0] = head + b',"crc":"%08x"}\n' % zlib.crc32(head)
    journal.write_bytes(b"".join(lines))
    before = sum(sent_ids(target).values())

    result = resume(tmp_path, run_dir)

    assert result.exit_code == ExitCode.PRECONDITION
    assert result.error_code == "JOURNAL_CORRUPT"
    assert result.envelope["error"]["context"]["file"] == str(journal)
    assert "results.jsonl" in result.envelope["error"]["message"]
    assert sum(sent_ids(target).values()) == before
