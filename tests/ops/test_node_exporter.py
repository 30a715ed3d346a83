"""The metrics file as an operator serves it: Debian's node_exporter, running as an unprivileged user
(Debian's runs as `prometheus`), reads it through its textfile collector (issue 28.1: the file was
0600, so the scrape said `node_textfile_scrape_error 1`)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bulkrelay.errors import ExitCode
from tests.clirun import run_cli
from tests.jobfiles import write_job
from tests.nodeexporter import NodeExporter, require_node_exporter
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow


@pytest.fixture
def textfile_directory() -> Iterator[Path]:
    """A collector directory another user can enter and list (pytest's own tmp_path is 0700, root's)."""
    directory = Path(tempfile.mkdtemp(prefix="bulkrelay-textfile-"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory)


def _run_with_umask(tmp_path: Path, url: str, metrics: Path, umask: int) -> int:
    job = write_job(tmp_path, url, rows=4)

    def set_umask() -> None:
        os.umask(umask)

    result = run_cli(
        "run",
        job,
        "--budget",
        "0",
        "--metrics-file",
        metrics,
        cwd=tmp_path,
        preexec_fn=set_umask,
    )
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    return stat.S_IMODE(metrics.stat().st_mode)


def test_node_exporter_as_an_unprivileged_user_reads_the_metrics_file(
    tmp_path: Path, textfile_directory: Path
) -> None:
    require_node_exporter()
    metrics = textfile_directory / "bulkrelay-nightly.prom"
    with TargetProcess() as target:
        mode = _run_with_umask(tmp_path, target.url, metrics, 0o022)
    with NodeExporter(textfile_directory) as scrape:
        text = scrape()
    assert "node_textfile_scrape_error 0" in text.splitlines()
    assert 'bulkrelay_rows{job_name="test-job",outcome="succeeded"} 4' in text.splitlines()
    assert 'bulkrelay_run_exit_code{job_name="test-job"} 0' in text.splitlines()
    assert mode == 0o644


def test_a_stricter_umask_still_wins_over_the_metrics_files_mode(tmp_path: Path) -> None:
    metrics = tmp_path / "bulkrelay.prom"
    with TargetProcess() as target:
        mode = _run_with_umask(tmp_path, target.url, metrics, 0o077)
    assert mode == 0o600
