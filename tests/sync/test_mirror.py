"""`sync: mirror` nights as real processes: keys that differ only by case or Unicode form (issue 22.5),
and deletion runs that stop, are resumed, meet 404, are never `latest` (issue 22.6), and are pruned
when they deleted nothing the sync state needs.

The target is a key-value store that keeps idempotency keys (tests/sync/nights.py's KEEPS_KEYS), in
the key form a test names (`store_keys`: a case-insensitive target, one that normalizes Unicode):
each scenario ends with the target holding exactly the last night's input, and `sync-state verify`
agreeing with the journals.
"""

from __future__ import annotations

import unicodedata
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.sync.state import SyncState, job_identity
from tests.clirun import CliResult, run_cli
from tests.jobfiles import write_csv, write_job
from tests.sync.nights import KEEPS_KEYS, holding, verified
from tests.targetproc import TargetProcess

pytestmark = [pytest.mark.slow, pytest.mark.target_plan(KEEPS_KEYS)]
CASE_INSENSITIVE: dict[str, Any] = {**KEEPS_KEYS, "store_keys": "casefold"}

NFD_ZOE = unicodedata.normalize("NFD", "Zoë")
NFC_ZOE = unicodedata.normalize("NFC", "Zoë")


def _rows(*keys: str) -> list[dict[str, str]]:
    return [{"id": key, "email": f"{n}@example.com", "name": f"User {n}"} for n, key in enumerate(keys)]


def _mirror(target: TargetProcess, **mirror: Any) -> dict[str, Any]:
    return {
        "input": {"key": "id"},
        "request": {"method": "PUT", "idempotency_key": {"header": "Idempotency-Key"}},
        "execution": {"concurrency": 2, "sync": "mirror"},
        "mirror": {"url": f"{target.url}/items/{{id}}", "max_deletes": 10, **mirror},
    }


def _night(cwd: Path) -> CliResult:
    return run_cli("run", cwd / "job.yaml", "--budget", "0", cwd=cwd)


def _in_step(cwd: Path, target: TargetProcess, rows: list[dict[str, str]]) -> None:
    """The target holds exactly `rows`, and the sync state agrees with the journals."""
    assert target.store() == holding(rows)
    verified(cwd, cwd / "job.yaml")


def _sent(target: TargetProcess) -> Counter[tuple[str, str]]:
    return Counter((r["method"], r["path"].rsplit("/", 1)[-1]) for r in target.requests())


NIGHT_1 = _rows("ABC", NFD_ZOE, "x1")
NIGHT_2 = _rows("abc", NFC_ZOE, "x1")  # night 2's export spells the same records another way


def _two_nights(tmp_path: Path, target: TargetProcess, **mirror: Any) -> CliResult:
    """Night 1 delivers ABC, Zoë (NFD) and x1; night 2's export spells them abc, Zoë (NFC), x1."""
    write_job(tmp_path, target.url, NIGHT_1, **_mirror(target, **mirror))
    first = _night(tmp_path)
    assert first.exit_code == ExitCode.SUCCESS, first.envelope
    target.reset()
    write_csv(tmp_path / "data.csv", NIGHT_2)
    return _night(tmp_path)


@pytest.mark.target_plan(CASE_INSENSITIVE)
def test_unset_key_match_refuses_a_night_whose_deletions_are_its_upserts_in_another_form(
    tmp_path: Path, target: TargetProcess
) -> None:
    """Before: `PUT abc` then `DELETE ABC` (and the same for Zoë), so a case-insensitive target lost
    the live records, exit 0."""
    night = _two_nights(tmp_path, target)
    assert night.exit_code == ExitCode.PRECONDITION, night.envelope
    assert night.error_code == "MIRROR_KEY_COLLISION"
    context = night.envelope["error"]["context"]
    assert context["collisions"] == 2
    assert sorted((e["gone"], e["tonight"]) for e in context["examples"]) == sorted(
        [("ABC", "abc"), (NFD_ZOE, NFC_ZOE)]
    )
    assert "'ABC' (gone) and 'abc' (tonight)" in night.envelope["error"]["message"]
    assert "mirror.key_match" in night.envelope["error"]["suggestion"]
    assert target.requests() == []  # refused before anything was sent, upserts included
    assert target.store() == holding(NIGHT_1)  # every live record is still there
    verified(tmp_path, tmp_path / "job.yaml")


@pytest.mark.parametrize(
    ("key_match", "deleted"),
    [("casefold", set()), ("nfc", {"ABC"}), ("exact", {"ABC", NFD_ZOE})],
)
def test_key_match_says_which_form_of_a_key_is_the_same_record(
    tmp_path: Path, key_match: str, deleted: set[str]
) -> None:
    """Each setting against the target it describes (a case-insensitive one for casefold, one that
    normalizes Unicode for nfc, an exact one): the target ends holding night 2's records, none lost."""
    with TargetProcess({**KEEPS_KEYS, "store_keys": key_match}) as target:
        night = _two_nights(tmp_path, target, key_match=key_match)
        assert night.exit_code == ExitCode.SUCCESS, night.envelope
        upserts = Counter({("PUT", "abc"): 1, ("PUT", NFC_ZOE): 1})
        assert _sent(target) == upserts + Counter({("DELETE", key): 1 for key in deleted})
        assert night.data.get("mirror", {"deletions": 0})["deletions"] == len(deleted)
        _in_step(tmp_path, target, NIGHT_2)


def test_casefold_against_a_case_insensitive_target_keeps_the_live_record_that_exact_loses(
    tmp_path: Path,
) -> None:
    """The store tells the two apart: `exact` against a case-insensitive target sends `DELETE ABC`
    after `PUT abc`, and the live record is gone; `casefold` sends no deletion and keeps it."""
    for key_match, left in (("exact", NIGHT_2[2:]), ("casefold", NIGHT_2)):  # exact: only x1 is left
        with TargetProcess(CASE_INSENSITIVE) as target:
            cwd = tmp_path / key_match
            cwd.mkdir()
            assert _two_nights(cwd, target, key_match=key_match).exit_code == ExitCode.SUCCESS
            assert target.store() == holding(left)


def _keys_in_state(cwd: Path) -> set[str]:
    runs_dir = cwd / ".bulkrelay" / "runs"
    with SyncState.for_job(runs_dir, job_identity("test-job", cwd / "job.yaml")) as state:
        return {key for key, _, _ in state.items()}


DELETES_GET_404 = {**KEEPS_KEYS, "rules": [{"match": {"method": "DELETE"}, "status": 404}]}
DELETES_GET_401 = {**KEEPS_KEYS, "rules": [{"match": {"method": "DELETE"}, "status": 401}]}
KEYS = [str(n) for n in range(1, 7)]


def _deleted_by_hand(target: TargetProcess, *keys: str) -> None:
    """Someone deletes records on the target itself; from then on a DELETE of them is answered 404."""
    for key in keys:
        request = urllib.request.Request(f"{target.url}/items/{key}", method="DELETE")
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200
    target.set_plan(DELETES_GET_404)
    target.reset()  # forget those requests; the store keeps its records


@pytest.mark.parametrize(
    ("gone_statuses", "exit_code"), [(None, ExitCode.SUCCESS), ([], ExitCode.PARTIAL_FAILURE)]
)
def test_a_delete_answered_404_is_a_success_unless_configured_otherwise(
    tmp_path: Path, target: TargetProcess, gone_statuses: list[int] | None, exit_code: ExitCode
) -> None:
    """Before, a key deleted on the target by hand got 404 every night: exit 3, the key never left."""
    mirror = {} if gone_statuses is None else {"gone_statuses": gone_statuses}
    write_job(tmp_path, target.url, _rows(*KEYS), **_mirror(target, **mirror))
    assert _night(tmp_path).exit_code == ExitCode.SUCCESS
    _deleted_by_hand(target, "5", "6")
    write_csv(tmp_path / "data.csv", _rows(*KEYS[:4]))
    night = _night(tmp_path)
    assert night.exit_code == exit_code, night.envelope
    assert _sent(target) == Counter({("DELETE", "5"): 1, ("DELETE", "6"): 1})
    left = _keys_in_state(tmp_path)
    assert ({"5", "6"} <= left) is (exit_code != ExitCode.SUCCESS)
    _in_step(tmp_path, target, _rows(*KEYS[:4]))


def test_a_stopped_deletion_run_resumes_and_a_newer_night_ends_it_and_latest_is_the_night(
    tmp_path: Path, target: TargetProcess
) -> None:
    """Before, a deletion run halted by a 401 said `resume` and `resume` answered CONFIG_INVALID about
    a field the deletions do not have; `latest` named the deletion run; it stayed resumable for ever."""
    write_job(tmp_path, target.url, _rows(*KEYS), **_mirror(target))
    assert _night(tmp_path).exit_code == ExitCode.SUCCESS
    target.set_plan(DELETES_GET_401)
    write_csv(tmp_path / "data.csv", _rows(*KEYS[:4]))
    halted = _night(tmp_path)
    assert halted.exit_code == ExitCode.AUTH_REQUIRED, halted.envelope
    deletions = halted.data["mirror"]
    assert deletions["state"] == "stopped"
    assert halted.envelope["error"]["suggestion"] == f"bulkrelay resume {deletions['run_dir']}"
    latest = run_cli("status", "latest", cwd=tmp_path)
    assert latest.data["run_id"] == halted.data["run_id"] != deletions["run_id"]  # the night, not its half
    assert target.store() == holding(_rows(*KEYS))  # nothing deleted yet

    target.set_plan(KEEPS_KEYS)
    target.reset()
    resumed = run_cli("resume", deletions["run_dir"], "--budget", "0", cwd=tmp_path)
    assert resumed.exit_code == ExitCode.SUCCESS, resumed.envelope
    assert _sent(target) == Counter({("DELETE", "5"): 1, ("DELETE", "6"): 1})
    assert _keys_in_state(tmp_path) == set(KEYS[:4])
    _in_step(tmp_path, target, _rows(*KEYS[:4]))

    target.set_plan(DELETES_GET_401)
    write_csv(tmp_path / "data.csv", _rows(*KEYS[:3]))  # key 4 goes, and its deletion halts
    stopped = _night(tmp_path)
    assert stopped.exit_code == ExitCode.AUTH_REQUIRED, stopped.envelope
    old_deletions = stopped.data["mirror"]["run_dir"]
    target.set_plan(KEEPS_KEYS)
    target.reset()
    write_csv(tmp_path / "data.csv", _rows(*KEYS[:4]))  # key 4 is back before the deletion was resumed
    back = _night(tmp_path)
    assert back.exit_code == ExitCode.SUCCESS, back.envelope
    status = run_cli("status", old_deletions, cwd=tmp_path)
    assert (status.data["state"], status.data["stop_reason"]) == ("cancelled", "superseded")
    late = run_cli("resume", old_deletions, "--budget", "0", cwd=tmp_path)
    assert late.exit_code == ExitCode.PRECONDITION and late.error_code == "RUN_NOT_RESUMABLE", late.envelope
    assert not any(r["method"] == "DELETE" for r in target.requests())  # key 4 lives
    assert _keys_in_state(tmp_path) == set(KEYS[:4])
    _in_step(tmp_path, target, _rows(*KEYS[:4]))


def test_prune_keeps_a_deletion_run_for_the_deletions_the_state_needs_and_no_other(
    tmp_path: Path, target: TargetProcess
) -> None:
    """Before, `prune` kept every deletion run newer than the oldest run the sync state needs: one
    halted by a 401 and then ended by the next night, which deleted nothing, was kept for ever
    (KEPT_FOR_SYNC_STATE), and each such night added one more."""
    write_job(tmp_path, target.url, _rows(*KEYS), **_mirror(target))
    base = _night(tmp_path)  # delivers every key: needed while they stand
    write_csv(tmp_path / "data.csv", _rows(*KEYS[:5]))
    deleting = _night(tmp_path)  # deletes key 6, which night 1 delivered: needed
    assert deleting.data["mirror"]["state"] == "completed", deleting.envelope
    target.set_plan(DELETES_GET_401)
    write_csv(tmp_path / "data.csv", _rows(*KEYS[:4]))
    halted = _night(tmp_path)  # key 5's deletion halts: it deletes nothing
    assert halted.exit_code == ExitCode.AUTH_REQUIRED, halted.envelope
    target.set_plan(KEEPS_KEYS)
    write_csv(tmp_path / "data.csv", _rows(*KEYS[:5]))  # key 5 stays after all
    last = _night(tmp_path)
    assert run_cli("status", halted.data["mirror"]["run_dir"], cwd=tmp_path).data["state"] == "cancelled"

    pruned = run_cli("prune", "--keep", "1", cwd=tmp_path)

    assert pruned.exit_code == ExitCode.SUCCESS, pruned.envelope
    assert sorted(pruned.data["removed"]) == sorted(
        [deleting.data["run_id"], halted.data["run_id"], halted.data["mirror"]["run_id"]]
    )
    [kept] = [w for w in pruned.envelope["warnings"] if w["code"] == "KEPT_FOR_SYNC_STATE"]
    assert kept["context"]["runs"] == sorted([base.data["run_id"], deleting.data["mirror"]["run_id"]])
    assert Path(last.data["run_dir"]).is_dir()
    _in_step(tmp_path, target, _rows(*KEYS[:5]))
    again = _night(tmp_path)  # the state the journals left still knows key 6 is gone, and the rest sent
    assert again.data["progress"]["total"] == 0 and "mirror" not in again.data, again.envelope
    _in_step(tmp_path, target, _rows(*KEYS[:5]))

    write_csv(tmp_path / "data.csv", _rows(*KEYS))  # key 6 comes back: its deletion no longer counts
    back = _night(tmp_path)
    assert back.data["progress"]["total"] == 1, back.envelope
    pruned = run_cli("prune", "--keep", "1", cwd=tmp_path)
    assert sorted(pruned.data["removed"]) == sorted(
        [deleting.data["mirror"]["run_id"], last.data["run_id"], again.data["run_id"]]
    ), pruned.envelope
    [kept] = [w for w in pruned.envelope["warnings"] if w["code"] == "KEPT_FOR_SYNC_STATE"]
    assert kept["context"]["runs"] == [base.data["run_id"]]
    _in_step(tmp_path, target, _rows(*KEYS))
