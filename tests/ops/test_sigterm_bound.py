"""SIGTERM ends every run within the documented bound (docs/running.md): the rows in flight each end by
their exchange deadline (connect + write + read) on both clients, and a start held by a Retry-After
pause ends at once, leaving its row pending. Real processes against loopback servers (issue 22.11)."""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bulkrelay.errors import ExitCode
from tests.spawnedruns import finish, run_dir_of, start_run
from tests.taggedjobs import journal, write_job
from tests.targetproc import TargetProcess
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

_TIMEOUTS = {"connect_seconds": 1, "write_seconds": 1, "read_seconds": 1}  # each silence < read_seconds


@contextmanager
def _trickling_server() -> Iterator[tuple[str, list[int]]]:
    """An HTTP server that answers headers, then one body byte every 100 ms for as long as the client
    stays: never silent for a read timeout, never done. Yields its URL and the connections it served."""
    listener = socket.create_server(("127.0.0.1", 0))
    served: list[int] = []
    done = threading.Event()

    def trickle(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            served.append(1)
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n")
                while not done.wait(0.1):
                    conn.sendall(b"x")
            except OSError:
                return  # the client gave up on the answer

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=trickle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", served
    finally:
        done.set()
        listener.close()


@pytest.mark.parametrize("client", ["reqwest", "httpx"])
def test_sigterm_ends_a_run_whose_answers_trickle_on_both_clients(tmp_path: Path, client: str) -> None:
    with _trickling_server() as (url, served):
        execution = {"concurrency": 2, "client": client, "timeout": _TIMEOUTS}
        job = write_job(tmp_path, url, rows=4, execution=execution)
        proc = start_run(job)
        wait_for(lambda: len(served) >= 1, "a request at the trickling server")
        proc.send_signal(signal.SIGTERM)
        result = finish(proc)  # httpx never ended here: no deadline on the whole exchange
    assert result.exit_code == ExitCode.SIGTERM, result.envelope
    assert result.data["state"] == "stopped"
    cut = journal(run_dir_of(job))  # the rows in flight, each ended by its deadline (one attempt: final)
    assert 1 <= len(cut) <= 2 and {entry["classification"] for entry in cut} == {"timeout_error"}


def test_sigterm_during_a_retry_after_pause_ends_the_run_at_once_and_sends_nothing_more(
    tmp_path: Path,
) -> None:
    """One 429 asking for 10 minutes (capped at 300 s) pauses every start; the workers held by the pause
    end on SIGTERM instead of waiting it out, and never send after it."""
    plan = {"rules": [{"times": 1, "status": 429, "retry_after": "600"}]}
    with TargetProcess(plan) as target:
        job = write_job(tmp_path, target.url, rows=20, execution={"concurrency": 4})
        proc = start_run(job)
        wait_for(lambda: target.stats()["by_status"].get("429"), "the 429 that pauses every start")
        wait_for(lambda: len(journal(run_dir_of(job))) == target.stats()["requests"], "the rows in flight")
        signalled_at = target.stats()["requests"]
        proc.send_signal(signal.SIGTERM)
        result = finish(proc)
        requests = target.stats()["requests"]
    assert result.exit_code == ExitCode.SIGTERM, result.envelope
    assert result.data["state"] == "stopped"
    assert requests == signalled_at < 20  # nothing was sent after the signal, the pause not waited out
    assert result.data["progress"]["done"] == requests  # the paused rows stay pending, for the resume
