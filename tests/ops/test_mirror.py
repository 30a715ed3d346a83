"""`sync: mirror` nights as real processes: keys that differ only by case or Unicode form (issue 22.5),
and deletion runs that stop, are resumed, meet 404, and are never `latest` (issue 22.6)."""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bulkrelay.errors import ExitCode
from tests.clirun import CliResult, run_cli
from tests.jobfiles import write_csv, write_job
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow

NFD_ZOE = unicodedata.normalize("NFD", "Zoë")
NFC_ZOE = unicodedata.normalize("NFC", "Zoë")


def _rows(*keys: str) -> list[dict[str, str]]:
    return [{"id": key, "email": f"{n}@example.com", "name": f"User {n}"} for n, key in enumerate(keys)]


def _mirror(target: TargetProcess, **mirror: Any) -> dict[str, Any]:
    return {
        "input": {"key": "id"},
        "request": {"method": "PUT"},
        "execution": {"concurrency": 2, "sync": "mirror"},
        "mirror": {"url": f"{target.url}/items/{{id}}", "max_deletes": 10, **mirror},
    }


def _night(cwd: Path) -> CliResult:
    return run_cli("run", cwd / "job.yaml", "--budget", "0", cwd=cwd)


def _sent(target: TargetProcess) -> Counter[tuple[str, str]]:
    return Counter((r["method"], r["path"].rsplit("/", 1)[-1]) for r in target.requests())


@pytest.fixture
def target() -> Iterator[TargetProcess]:
    with TargetProcess() as running:
        yield running


def _two_nights(tmp_path: Path, target: TargetProcess, **mirror: Any) -> CliResult:
    """Night 1 delivers ABC, Zoë (NFD) and x1; night 2's export spells them abc, Zoë (NFC), x1."""
    write_job(tmp_path, target.url, _rows("ABC", NFD_ZOE, "x1"), **_mirror(target, **mirror))
    first = _night(tmp_path)
    assert first.exit_code == ExitCode.SUCCESS, first.envelope
    target.reset()
    write_csv(tmp_path / "data.csv", _rows("abc", NFC_ZOE, "x1"))
    return _night(tmp_path)


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


@pytest.mark.parametrize(
    ("key_match", "deleted"),
    [("casefold", set()), ("nfc", {"ABC"}), ("exact", {"ABC", NFD_ZOE})],
)
def test_key_match_says_which_form_of_a_key_is_the_same_record(
    tmp_path: Path, target: TargetProcess, key_match: str, deleted: set[str]
) -> None:
    night = _two_nights(tmp_path, target, key_match=key_match)
    assert night.exit_code == ExitCode.SUCCESS, night.envelope
    upserts = Counter({("PUT", "abc"): 1, ("PUT", NFC_ZOE): 1})
    assert _sent(target) == upserts + Counter({("DELETE", key): 1 for key in deleted})
    assert night.data.get("mirror", {"deletions": 0})["deletions"] == len(deleted)
