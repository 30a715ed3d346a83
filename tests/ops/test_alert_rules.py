"""examples/monitoring/alerts.yaml through Debian's promtool (`promtool check rules`, `promtool test
rules`), and docs/scheduling.md pointing at that file instead of keeping a copy of its rules (issue 28.2:
the documented BulkRelayStuck never fired, BulkRelayNightlyMissed missed "never ran")."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

MONITORING = Path(__file__).resolve().parents[2] / "examples" / "monitoring"
DOCS = MONITORING.parents[1] / "docs" / "scheduling.md"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return subprocess.run([binary, *args], cwd=MONITORING, capture_output=True, text=True, check=False)


@pytest.mark.slow
def test_the_rules_are_valid_and_fire_when_they_should() -> None:
    checked = _promtool("check", "rules", "alerts.yaml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = _promtool("test", "rules", "alerts.test.yaml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_docs_point_at_the_rules_file_and_keep_no_copy_of_its_rules() -> None:
    rules = yaml.safe_load((MONITORING / "alerts.yaml").read_text())["groups"][0]["rules"]
    text = DOCS.read_text()
    assert "examples/monitoring/alerts.yaml" in text
    for rule in rules:
        assert f"`{rule['alert']}`" in text  # each alert is named
        assert f"alert: {rule['alert']}" not in text  # but not copied, to drift from the file
    assert "expr:" not in text
