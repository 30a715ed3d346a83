"""Shell completion as a person meets it: a real interactive bash under tmux, the script sourced from
`bulkrelay completion bash`, and Tab pressed after a command. zsh and fish get the same completers."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bulkrelay.cli.completion import completion_script
from tests.waiting import wait_for

pytestmark = pytest.mark.slow  # a real bash in tmux

RUN_IDS = ("20261201T010000Z-aaaa1111", "20261201T020000Z-bbbb2222")


class Tmux:
    """One detached tmux session running an interactive bash with nothing of the user's set-up."""

    def __init__(self, cwd: Path) -> None:
        self.name = f"bulkrelay-{uuid.uuid4().hex[:8]}"
        # A tmux server of its own: on the shared default server, one test's last session ending stops
        # the server while another test's `new-session` is connecting to it ("server exited unexpectedly").
        self.tmux = ["tmux", "-L", self.name]
        bin_dir = Path(sys.executable).parent  # where `uv run` put the bulkrelay command
        command = f"env -i PATH={bin_dir}:/usr/bin:/bin HOME={cwd} TERM=xterm bash --norc --noprofile"
        subprocess.run(
            [
                *self.tmux,
                "new-session",
                "-d",
                "-s",
                self.name,
                "-x",
                "250",
                "-y",
                "50",
                "-c",
                str(cwd),
                command,
            ],
            check=True,
        )
        self.type("PS1='$ '; source <(bulkrelay completion bash); echo sourced")
        wait_for(lambda: self.screen().count("sourced") >= 2, "the completion script to be sourced")

    def type(self, *keys: str) -> None:
        subprocess.run([*self.tmux, "send-keys", "-t", self.name, *keys], check=True)
        if keys[-1] not in ("Tab",):
            subprocess.run([*self.tmux, "send-keys", "-t", self.name, "Enter"], check=True)

    def screen(self) -> str:
        shown = subprocess.run(
            [*self.tmux, "capture-pane", "-p", "-t", self.name], capture_output=True, check=True
        )
        return shown.stdout.decode()

    def completes(self, line: str, expected: str) -> str:
        """Type `line`, press Tab until `expected` shows, then clear the line. Tab is pressed again after each
        look, never twice at once: bash takes a second Tab that comes while it completes as a first."""
        self.type(line, "Tab")
        screen = wait_for(
            lambda: self._showing(expected), f"Tab after {line!r} to show {expected!r}", interval=0.3
        )
        subprocess.run([*self.tmux, "send-keys", "-t", self.name, "C-u"], check=True)
        self.type("clear")
        wait_for(lambda: line not in self.screen(), "the screen to clear")
        return screen

    def _showing(self, expected: str) -> str | None:
        screen = self.screen()
        if expected in screen:
            return screen
        self.type("Tab")  # a second Tab lists the candidates when there are several
        return None

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], check=False)


@pytest.fixture
def bash(tmp_path: Path) -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (Debian package: tmux)")
    for run_id in RUN_IDS:
        (tmp_path / ".bulkrelay" / "runs" / run_id).mkdir(parents=True)
    (tmp_path / "nightly-job.yaml").write_text("version: 1\n")
    (tmp_path / "records-2026.csv").write_text("id\n1\n")
    session = Tmux(tmp_path)
    yield session
    session.close()


def test_bash_completes_job_files_inputs_and_outputs(bash: Tmux) -> None:
    assert "nightly-job.yaml" in bash.completes("bulkrelay validate nightly-j", "nightly-job.yaml")
    assert "records-2026.csv" in bash.completes(
        "bulkrelay run nightly-job.yaml --input reco", "records-2026.csv"
    )
    assert "records-2026.csv" in bash.completes("bulkrelay export latest -o reco", "records-2026.csv")


def test_bash_completes_run_ids_and_latest(bash: Tmux) -> None:
    screen = bash.completes("bulkrelay status 2026120", RUN_IDS[1])
    assert all(run_id in screen for run_id in RUN_IDS)
    assert "latest" in bash.completes("bulkrelay resume lat", "latest")


def test_bash_completes_a_run_directory_s_path(bash: Tmux) -> None:
    assert ".bulkrelay/" in bash.completes("bulkrelay status .bulk", ".bulkrelay/")
    screen = bash.completes("bulkrelay report .bulkrelay/runs/", RUN_IDS[1])
    assert f".bulkrelay/runs/{RUN_IDS[0]}" in screen or RUN_IDS[0] in screen


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_complete_the_same_arguments(shell: str) -> None:
    script = completion_script(shell)
    runs_lister = "ls -1 ${BULKRELAY_RUNS_DIR:-.bulkrelay/runs}"
    assert runs_lister in script  # RUN: run ids and latest
    files = {"zsh": "_files", "fish": "__fish_complete_path"}[shell]
    assert files in script  # JOB, --input FILE, -o FILE
    directories = {"zsh": "'dirs:run directory:_files -/'", "fish": "__fish_complete_directories"}[shell]
    assert directories in script  # RUN: a run directory's path too
