"""The loopback target the end-to-end benchmarks send to: nginx (Debian `nginx-light`) when it is
installed, answering every request (POST, PUT, ...) with 200 `{"id":1}` from a config written here,
else the built-in target in its own process with recording off. Shared by bench_run.py and
bench_delta.py so both measure BulkRelay against the same fast target, not the target's own cost."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_NGINX_CONF = """\
daemon off;
master_process on;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    keepalive_requests 10000000;
    keepalive_timeout 120s;
    server {{
        listen 127.0.0.1:{port};
        location / {{
            client_body_buffer_size 64k;
            default_type application/json;
            return 200 '{{"id":1}}';
        }}
    }}
}}
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 10
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the target exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        if time.monotonic() > deadline:
            raise RuntimeError("the target did not start listening")
        time.sleep(0.05)


@contextlib.contextmanager
def loopback_target(workdir: Path) -> Iterator[tuple[str, str]]:
    """(url, description) of a running loopback target."""
    port = _free_port()
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if nginx:
        prefix = workdir / "nginx"
        prefix.mkdir()
        (prefix / "nginx.conf").write_text(_NGINX_CONF.format(prefix=prefix, port=port))
        command = [
            nginx,
            "-p",
            str(prefix),
            "-c",
            str(prefix / "nginx.conf"),
            "-e",
            str(prefix / "error.log"),
        ]
        description = "nginx (1 worker)"
    else:
        command = [sys.executable, "-m", "bulkrelay.demo.target", "--port", str(port), "--no-record"]
        description = "built-in target (python -m bulkrelay.demo.target --no-record)"
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(port, proc)
        yield f"http://127.0.0.1:{port}", description
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def builtin_target(workdir: Path, plan: dict[str, Any] | None = None) -> Iterator[str]:
    """The URL of the built-in target in its own process, recording off, following `plan` (it still
    counts arrivals: its stats say the most in any one-second window)."""
    port_file = workdir / "builtin-target-port"
    command = [sys.executable, "-m", "bulkrelay.demo.target", "--port-file", str(port_file), "--no-record"]
    if plan is not None:
        (workdir / "builtin-target-plan.json").write_text(json.dumps(plan))
        command += ["--plan", str(workdir / "builtin-target-plan.json")]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the built-in target did not start")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port_file.read_text().strip()}"
    finally:
        proc.terminate()
        proc.wait(10)
