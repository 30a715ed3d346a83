"""Debian's real `prometheus-node-exporter`, run as an unprivileged user (as Debian runs it, as
`prometheus`) over a textfile directory, on a free loopback port, scraped over HTTP.

    with NodeExporter(directory) as scrape: text = scrape()

`.ci/run` installs the package; where it is missing the test is skipped naming it, never passed.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import pytest

from tests.waiting import wait_for

BINARY = "/usr/bin/prometheus-node-exporter"
UNPRIVILEGED = ("nobody", "nogroup")


def require_node_exporter() -> str:
    if not os.access(BINARY, os.X_OK):
        pytest.skip(
            "prometheus-node-exporter is not installed (Debian: apt-get install prometheus-node-exporter)"
        )
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed (Debian: util-linux)")
    return BINARY


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class NodeExporter:
    def __init__(self, textfile_directory: Path) -> None:
        self._directory = textfile_directory
        self._proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def __enter__(self) -> Callable[[], str]:
        binary = require_node_exporter()
        user, group = UNPRIVILEGED
        for _ in range(5):  # a port free a moment ago may be taken by the time it binds
            port = _free_port()
            self.url = f"http://127.0.0.1:{port}/metrics"
            self._proc = subprocess.Popen(
                [
                    "setpriv",
                    f"--reuid={user}",
                    f"--regid={group}",
                    "--clear-groups",
                    binary,
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--collector.disable-defaults",
                    "--collector.textfile",
                    f"--collector.textfile.directory={self._directory}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if wait_for(self._ready_or_gone, "node_exporter to listen") == "ready":
                return self.scrape
        raise RuntimeError("prometheus-node-exporter did not start")

    def _ready_or_gone(self) -> str | None:
        assert self._proc is not None
        if self._proc.poll() is not None:
            return "gone"
        try:
            self.scrape()
        except OSError:
            return None
        return "ready"

    def scrape(self) -> str:
        with urllib.request.urlopen(self.url, timeout=30) as answer:
            return str(answer.read().decode())

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
