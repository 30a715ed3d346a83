"""`--metrics-push URL` / BULKRELAY_METRICS_PUSH: at the end of a run the same metrics go to a
Pushgateway, grouped by job name and shard; a push that fails is a warning, never a failed run; neither
the flag nor the variable is part of the run's identity (issue 28.3). Real runs against a loopback HTTP
endpoint that records what it received, as a Pushgateway would."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bulkrelay.background.call import RunArgs
from bulkrelay.background.jobs import arguments_key
from bulkrelay.cli.parser import parse_call
from bulkrelay.errors import ExitCode
from tests.clirun import cli_env, run_cli
from tests.jobfiles import write_job
from tests.targetproc import TargetProcess

Received = list[tuple[str, str, bytes]]  # method, path, body


@contextmanager
def _gateway(status: int = 200) -> Iterator[tuple[str, Received]]:
    received: Received = []

    class Record(BaseHTTPRequestHandler):
        def _record(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            received.append((self.command, self.path, body))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:
            self._record()

        def do_PUT(self) -> None:
            self._record()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Record)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _samples(body: bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


@pytest.mark.slow
def test_a_shard_pushes_its_metrics_once_at_the_end_grouped_by_job_name_and_shard(tmp_path: Path) -> None:
    with _gateway() as (url, received), TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=6)
        done = run_cli("run", job, "--budget", "0", "--shard", "1/2", "--metrics-push", url, cwd=tmp_path)
    assert done.exit_code == ExitCode.SUCCESS, done.envelope
    assert done.envelope["warnings"] == []
    assert [(method, path) for method, path, _ in received] == [
        ("POST", "/metrics/job/bulkrelay/job_name/test-job/shard/1")
    ]
    samples = _samples(received[0][2])
    labels = frozenset({"job_name": "test-job"}.items())
    owned = done.data["summary"]["rows_total"]
    assert samples[("bulkrelay_rows", labels | {("outcome", "succeeded")})] == owned > 0
    assert samples[("bulkrelay_run_exit_code", labels)] == 0
    assert samples[("bulkrelay_run_state", labels | {("state", "completed")})] == 1


@pytest.mark.slow
@pytest.mark.parametrize("answer", ["refused", 500])
def test_a_push_that_fails_is_a_warning_and_the_run_succeeds(tmp_path: Path, answer: object) -> None:
    with TargetProcess() as target, _gateway(500) as (failing, received):
        if answer == "refused":
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                url = f"http://user:pushsecret@127.0.0.1:{probe.getsockname()[1]}"
        else:
            url = failing
        job = write_job(tmp_path, target.url, rows=3)
        done = run_cli("run", job, "--budget", "0", cwd=tmp_path, env=cli_env(BULKRELAY_METRICS_PUSH=url))
        sent = target.stats()["effects"]
    assert done.exit_code == ExitCode.SUCCESS, done.envelope
    assert sent == 3 and done.data["state"] == "completed"
    (warning,) = done.envelope["warnings"]
    assert warning["code"] == "METRICS_PUSH_FAILED"
    assert len(received) == (1 if answer == 500 else 0)
    assert b"pushsecret" not in orjson.dumps(done.envelope)


def test_the_push_is_not_part_of_the_invocation_identity(tmp_path: Path) -> None:
    plain = parse_call(["run", str(tmp_path / "job.yaml"), "--budget", "5s"])
    pushed = parse_call(
        ["run", str(tmp_path / "job.yaml"), "--budget", "5s", "--metrics-push", "http://127.0.0.1:9091"]
    )
    assert isinstance(pushed.options, RunArgs) and pushed.options.metrics_push == "http://127.0.0.1:9091"
    assert arguments_key(plain, None) == arguments_key(pushed, None)
