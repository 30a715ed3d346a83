"""BulkRelay is POSIX only, and says so on another system at once, instead of failing half-way through."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from bulkrelay.cli import main as cli_main
from bulkrelay.errors import ExitCode

ROOT = Path(__file__).resolve().parents[2]


def test_on_windows_it_refuses_to_start_with_a_clear_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(os, "name", "nt")
    with pytest.raises(SystemExit) as ended:
        cli_main.main(["validate", "job.yaml"])
    assert ended.value.code == ExitCode.GENERAL_ERROR
    assert "Linux and macOS" in capsys.readouterr().err


def test_uvloop_is_not_asked_for_where_it_cannot_install() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    uvloop = next(spec for spec in dependencies if spec.startswith("uvloop"))
    assert "sys_platform != 'win32'" in uvloop
