"""Headless Chromium (Debian's `chromium`, installed by `.ci/run`) to look at a page as a person would.

    shot = screenshot(page, tmp_path / "page.png")      # the PNG, and what the browser logged
    dom = dump_dom(page)                                 # the DOM after the browser parsed it

A test that needs it skips, naming the package, when it is absent.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--hide-scrollbars",
    "--no-first-run",
    "--disable-extensions",
    "--enable-logging=stderr",
    "--v=0",
)


def chromium() -> str:
    found = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    if found is None:
        pytest.skip("needs Debian's `chromium` package (apt-get install chromium)")
    return found


@dataclass(frozen=True)
class Shot:
    png: Path
    log: str  # what the browser wrote on stderr: console messages, refused fetches

    def console_errors(self) -> list[str]:
        """Console messages and refusals (CSP, failed loads) the page caused; Chromium's own start-up
        noise (D-Bus, GPU) is not the page's."""
        flagged = ("CONSOLE", "Refused to", "net::ERR", "Uncaught")
        return [line for line in self.log.splitlines() if any(word in line for word in flagged)]


def _browse(page: Path, *extra: str, profile: Path) -> subprocess.CompletedProcess[str]:
    command = [chromium(), *_FLAGS, f"--user-data-dir={profile}", *extra, page.resolve().as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)


def screenshot(page: Path, png: Path, size: tuple[int, int] = (1200, 3000)) -> Shot:
    done = _browse(
        page, f"--screenshot={png}", f"--window-size={size[0]},{size[1]}", profile=png.parent / "profile"
    )
    assert png.is_file(), done.stderr
    return Shot(png, done.stderr)


def dump_dom(page: Path, profile: Path) -> str:
    done = _browse(page, "--dump-dom", profile=profile)
    assert done.returncode == 0, done.stderr
    return done.stdout
