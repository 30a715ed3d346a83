"""The example systemd unit is hardened, and `systemd-analyze security` (offline: no systemd needed)
scores it as docs/scheduling.md says (issue 28.5: it scored 9.2 UNSAFE)."""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "scheduling"
UNIT = EXAMPLES / "bulkrelay-nightly.service"
DOCS = EXAMPLES.parents[1] / "docs" / "scheduling.md"


def _service() -> configparser.SectionProxy:
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.read(UNIT)
    return unit["Service"]


def test_the_unit_writes_only_where_the_run_and_the_metrics_file_live() -> None:
    service = _service()
    for directive, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
    }.items():
        assert service[directive] == value, directive
    writable = service["ReadWritePaths"].split()
    metrics = Path(shlex.split(service["ExecStart"]).pop(-1))  # --metrics-file PATH ends the line
    assert service["WorkingDirectory"] in writable  # the job's .bulkrelay/runs
    assert str(metrics.parent) == "/var/lib/prometheus/node-exporter" and str(metrics.parent) in writable


@pytest.mark.slow
def test_systemd_analyze_scores_the_unit_as_the_docs_say() -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd)")
    answer = subprocess.run(
        [analyze, "security", "--offline=yes", "--no-pager", str(UNIT)],
        capture_output=True,
        text=True,
        check=False,
    )
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d) (\w+)", answer.stdout)
    assert found is not None, answer.stdout + answer.stderr
    score, verdict = float(found.group(1)), found.group(2)
    assert score <= 2.0 and verdict == "OK", answer.stdout
    assert f"{score:.1f} OK" in re.sub(r"\s+", " ", DOCS.read_text())
    assert f"{score:.1f} OK" in UNIT.read_text()
