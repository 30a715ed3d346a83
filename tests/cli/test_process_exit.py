"""The process ends with its envelope's exit code even though pyreqwest's Tokio threads outlive it:
no interpreter finalization for them to meet (bulkrelay/cli/process_exit.py), and still everything an
ordinary exit does for the program itself."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bulkrelay.cli.main import main

PROGRAM = """\
import atexit, concurrent.futures, sys, threading, time
{imports}
from bulkrelay.cli.process_exit import exit_process


class Global:
    def __del__(self):  # runs only when the interpreter finalizes this module
        sys.stdout.write("finalized\\n")
        sys.stdout.flush()


held = Global()
atexit.register(lambda: sys.stdout.write("atexit ran\\n"))


def late_writer():
    time.sleep(0.2)
    open(sys.argv[1], "w").write("written")


threading.Thread(target=late_writer).start()
pool = concurrent.futures.ThreadPoolExecutor(1)  # left open: its idle worker ends only when told to
pool.submit(time.sleep, 0)
sys.stdout.write("envelope\\n")  # still in stdout's buffer (a pipe) when exit_process is called
exit_process(8)
"""


def _run(tmp_path: Path, imports: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    written = tmp_path / "thread.txt"
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(PROGRAM.format(imports=imports)))
    done = subprocess.run(
        [sys.executable, str(program), str(written)], check=False, capture_output=True, text=True, timeout=60
    )
    return done, written


@pytest.mark.slow  # starts a Python process
def test_with_pyreqwest_loaded_the_process_skips_finalization_but_not_what_exit_does(tmp_path: Path) -> None:
    done, written = _run(tmp_path, "import pyreqwest.client")
    assert done.returncode == 8, done.stderr
    assert done.stdout.splitlines() == ["envelope", "atexit ran"]  # flushed, handlers run, no teardown
    assert written.read_text() == "written"  # the other thread was waited for
    assert "Fatal Python error" not in done.stderr


@pytest.mark.slow  # starts a Python process
def test_without_pyreqwest_the_process_exits_as_python_does(tmp_path: Path) -> None:
    done, written = _run(tmp_path, "")
    assert done.returncode == 8, done.stderr
    assert done.stdout.splitlines() == ["envelope", "atexit ran", "finalized"]
    assert written.read_text() == "written"


def test_main_called_with_arguments_raises_system_exit_even_with_pyreqwest_loaded(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A caller that goes on after main (a test, the benchmark's profile) gets SystemExit, never os._exit."""
    import pyreqwest.client  # noqa: F401 - loaded, as after any run

    with pytest.raises(SystemExit) as ended:
        main(["--version", "--json"])
    assert ended.value.code == 0
    assert '"ok":true' in capsys.readouterr().out


MAIN_PROGRAM = """\
import sys
import pyreqwest.client  # as after any request
from bulkrelay.cli.main import main


class Global:
    def __del__(self):  # runs only when the interpreter finalizes this module
        sys.stderr.write("finalized\\n")


held = Global()
sys.argv = ["bulkrelay", "--version", "--json"]
main()  # as `bulkrelay` and `python -m bulkrelay` call it
"""


@pytest.mark.slow  # starts a Python process
def test_the_program_itself_ends_through_exit_process(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text(MAIN_PROGRAM)
    done = subprocess.run(
        [sys.executable, str(program)], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert '"ok":true' in done.stdout
    assert "finalized" not in done.stderr  # os._exit: no finalization for a Tokio thread to meet
