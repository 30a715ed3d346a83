"""`--help` and `--version` answer a person without loading the human views (rich, the result types,
asyncio through the rate limiter): what keeps them under the 0.1 s bar of benchmarks/bench_startup.py.
Checked by the modules loaded, not by a timing, so it holds on a busy machine."""

from __future__ import annotations

import subprocess
import sys

import pytest

# real processes: outside the fast lane (`-m "not slow"`)
pytestmark = pytest.mark.slow

_LOADED = """\
import sys, runpy
sys.argv = ["bulkrelay", *sys.argv[1:]]
try:
    runpy.run_module("bulkrelay", run_name="__main__")
except SystemExit:
    pass
names = ("rich", "bulkrelay.cli.human", "bulkrelay.ops.results", "asyncio")
heavy = sorted(name for name in names if name in sys.modules)
sys.stderr.write("LOADED " + ",".join(heavy) + "\\n")
"""


@pytest.mark.parametrize(("args", "shown"), [(["--help"], "usage: bulkrelay"), (["--version"], "bulkrelay ")])
def test_help_and_version_for_a_person_load_no_rich(args: list[str], shown: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _LOADED, *args, "--human"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.stdout.startswith(shown)
    loaded = [line for line in done.stderr.splitlines() if line.startswith("LOADED ")]
    assert loaded == ["LOADED "]
