"""Unattended operation: the crontab line, the systemd unit and the CronJob of examples/scheduling/ run
as written (only paths substituted), with the environment those schedulers give; --quiet and --human;
the warning when a budget hands work off with nobody watching."""

from __future__ import annotations

import configparser
import getpass
import shlex
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from bulkrelay.cli.parser import parse_command_line
from bulkrelay.errors import ExitCode
from tests.clirun import cli_env, run_cli, run_cli_raw
from tests.jobfiles import write_job
from tests.runfiles import metric, read_log, read_metrics
from tests.targetproc import TargetProcess
from tests.waiting import HANG_S, wait_for

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "scheduling"
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # what systemd gives a service
ROWS = 10


class Host:
    """The paths the examples name, moved under a test's directory."""

    def __init__(self, root: Path) -> None:
        self.workdir = root / "srv"
        self.textfile = root / "textfile_collector"
        self.logs = root / "log"
        self.home = root / "home"
        for directory in (self.workdir, self.textfile, self.logs, self.home):
            directory.mkdir()
        self.paths = {
            "/opt/bulkrelay/.venv/bin": str(Path(sys.executable).parent),
            "/srv/bulkrelay": str(self.workdir),
            "/var/lib/prometheus/node-exporter": str(self.textfile),
            "/var/log/bulkrelay": str(self.logs),
        }

    def substitute(self, text: str) -> str:
        for example, here in self.paths.items():
            text = text.replace(example, here)
        return text

    @property
    def metrics(self) -> Path:
        return self.textfile / "bulkrelay-nightly.prom"


def crontab_entry(host: Host) -> tuple[dict[str, str], str]:
    """The environment cron gives the crontab's command, and that command: cron's own variables
    (HOME, LOGNAME, SHELL, PATH) overridden by the crontab's assignments."""
    env = {"HOME": str(host.home), "LOGNAME": getpass.getuser(), "SHELL": "/bin/sh", "PATH": "/usr/bin:/bin"}
    commands = []
    for raw in (EXAMPLES / "crontab").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if sep and name.isidentifier():
            env[name] = host.substitute(value)
        else:
            commands.append(line.split(None, 5)[5])
    assert len(commands) == 1, commands
    return env, host.substitute(commands[0])


def _start_cron_line(env: dict[str, str], command: str) -> subprocess.Popen[bytes]:
    """As cron does: the user's shell, no terminal anywhere, output captured (cron mails it)."""
    return subprocess.Popen(
        [env["SHELL"], "-c", command],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _wait_until(condition: Callable[[], bool], what: str, timeout: float = HANG_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting: {what}")
        time.sleep(0.05)


def _running_metrics(path: Path) -> bool:
    try:
        return metric(read_metrics(path), "bulkrelay_run_state", job_name="nightly", state="running") == 1
    except (FileNotFoundError, KeyError):
        return False


def _answered_2xx(target: TargetProcess) -> Counter[str]:
    return Counter(
        r["path"] for r in target.requests() if r["status"] is not None and 200 <= r["status"] < 300
    )


def test_the_crontab_line_runs_as_written_one_run_at_a_time(tmp_path: Path) -> None:
    host = Host(tmp_path)
    env, command = crontab_entry(host)
    assert "--budget 0" in command and "--quiet" in command
    # Row 5 gets 503 (retried once a second, up to 100 times) until the test lets it through, so the
    # first night is surely still running when the second one starts.
    hold = {"rules": [{"match": {"path_contains": "/items/5"}, "status": 503}]}
    with TargetProcess(hold) as target:
        write_job(
            host.workdir,
            target.url,
            rows=ROWS,
            job_name="nightly.yaml",
            name="nightly",
            request={"headers": {"Authorization": "Bearer ${API_TOKEN}"}},
            retry={
                "max_attempts": 100,
                "initial_backoff_seconds": 1,
                "max_backoff_seconds": 1,
                "jitter_ratio": 0,
            },
        )
        (host.workdir / "secrets.env").write_text("API_TOKEN=cron-token\n")
        first = _start_cron_line(env, command)
        try:
            _wait_until(
                lambda: "/items/5" in {r["path"] for r in target.requests()}, "the first run reaches row 5"
            )
            _wait_until(lambda: _running_metrics(host.metrics), "metrics saying the first run is running")
            second = subprocess.run(
                [env["SHELL"], "-c", command],
                check=False,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=120,
            )
            target.set_plan({})
            out, err = first.communicate(timeout=180)
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()
        received = _answered_2xx(target)
        tokens = {
            v for r in target.requests() for k, v in r["headers"].items() if k.lower() == "authorization"
        }

    # The second night did not relay beside the first: it was refused (6, RUN_LOCKED).
    assert second.returncode in (ExitCode.SUCCESS, ExitCode.CONFLICT), second
    if second.returncode == ExitCode.CONFLICT:
        assert b"RUN_LOCKED" in second.stderr  # --quiet: the failure is told, cron mails it
    assert (first.returncode, out, err) == (ExitCode.SUCCESS, b"", b"")  # --quiet: success says nothing
    assert received == Counter({f"/items/{n}": 1 for n in range(1, ROWS + 1)})
    assert tokens == {"Bearer cron-token"}

    samples = read_metrics(host.metrics)
    assert metric(samples, "bulkrelay_run_state", job_name="nightly", state="completed") == 1
    assert metric(samples, "bulkrelay_run_exit_code", job_name="nightly") == 0
    assert metric(samples, "bulkrelay_rows", job_name="nightly", outcome="succeeded") == ROWS
    assert metric(samples, "bulkrelay_last_success_timestamp_seconds", job_name="nightly") > 0
    exits = [line["exit_code"] for line in read_log(host.logs / "nightly.log") if line["event"] == "exit"]
    assert sorted(exits) == sorted([ExitCode.SUCCESS, second.returncode])


def test_the_systemd_units_exec_start_runs_as_written(tmp_path: Path) -> None:
    host = Host(tmp_path)
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.read(EXAMPLES / "bulkrelay-nightly.service")
    service = unit["Service"]
    assert service["Type"] == "oneshot"
    exec_start = shlex.split(host.substitute(service["ExecStart"]))
    assert exec_start[1:4] == ["run", "nightly.yaml", "--budget"] and exec_start[4] == "0"
    with TargetProcess() as target:
        write_job(host.workdir, target.url, rows=ROWS, job_name="nightly.yaml", name="nightly")
        proc = subprocess.run(
            exec_start,
            check=False,
            cwd=host.substitute(service["WorkingDirectory"]),
            env={"PATH": SYSTEMD_PATH},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=120,
        )
        assert target.stats()["requests"] == ROWS
    assert proc.returncode == ExitCode.SUCCESS, proc.stderr
    assert b"completed" in proc.stdout and b"summary" in proc.stdout  # --human: the journal shows text
    assert not proc.stdout.lstrip().startswith(b"{")
    assert metric(read_metrics(host.metrics), "bulkrelay_run_exit_code", job_name="nightly") == 0

    timer = configparser.ConfigParser(interpolation=None, strict=False)
    timer.read(EXAMPLES / "bulkrelay-nightly.timer")
    assert timer["Timer"]["Unit"] == "bulkrelay-nightly.service"
    assert timer["Timer"]["OnCalendar"] and timer["Timer"]["Persistent"] == "true"


def test_the_kubernetes_cronjob_never_overlaps_and_runs_a_valid_command() -> None:
    manifest: dict[str, Any] = yaml.safe_load((EXAMPLES / "cronjob.yaml").read_text())
    assert (manifest["apiVersion"], manifest["kind"]) == ("batch/v1", "CronJob")
    spec = manifest["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    args = parse_command_line(container["args"])
    assert (args.command, args.budget) == ("run", 0)
    assert args.runs_dir.parent.as_posix() in {m["mountPath"] for m in container["volumeMounts"]}
    assert args.metrics_file.parent.parent.as_posix() in {m["mountPath"] for m in container["volumeMounts"]}
    failing = spec["jobTemplate"]["spec"]["podFailurePolicy"]["rules"][1]  # after evictions' Ignore
    assert failing["action"] == "FailJob" and ExitCode.PARTIAL_FAILURE in failing["onExitCodes"]["values"]


# ----------------------------------------------------------------------------- --quiet, --human


def test_quiet_prints_the_human_summary_when_the_run_fails(tmp_path: Path) -> None:
    with TargetProcess({"rules": [{"match": {"path_contains": "/items/2"}, "status": 422}]}) as target:
        job = write_job(tmp_path, target.url, rows=4)
        proc = run_cli_raw("run", job, "--budget", "0", "--quiet", cwd=tmp_path)
    assert proc.returncode == ExitCode.PARTIAL_FAILURE
    assert b"completed_with_failures" in proc.stdout and b"summary" in proc.stdout
    assert b"PARTIAL_FAILURE" in proc.stderr and b"retry-failed" in proc.stderr
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(proc.stdout)


def test_human_forces_the_summary_without_a_terminal_and_contradicts_json(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=3)
        proc = run_cli_raw("--human", "run", job, "--budget", "0", cwd=tmp_path)
    assert proc.returncode == ExitCode.SUCCESS
    assert b"3 of 3 done" in proc.stdout and b"completed" in proc.stdout
    assert proc.stderr == b""  # no progress bar or line for a run this short
    both = run_cli("run", job, "--json", "--human", cwd=tmp_path)
    assert both.exit_code == ExitCode.ARG_ERROR and both.error_code == "USAGE_ERROR"


# ------------------------------------------------------------------- the unattended hand-off


def test_a_budget_handing_off_work_with_nobody_watching_says_so_loudly(tmp_path: Path) -> None:
    env = cli_env(BULKRELAY_STATE_DIR=str(tmp_path / "state"))
    # Every answer is 503, retried once a second: the job runs until the test cancels it.
    with TargetProcess({"rules": [{"status": 503}]}) as target:
        retry = {"max_attempts": 100, "initial_backoff_seconds": 1, "max_backoff_seconds": 1}
        job = write_job(tmp_path, target.url, rows=5, retry=retry)
        prom, log = tmp_path / "m.prom", tmp_path / "nightly.log"
        reports = ("--metrics-file", prom, "--log-file", log)
        handed = run_cli("run", job, "--budget", "300ms", *reports, cwd=tmp_path, env=env)
        assert handed.exit_code == ExitCode.INCOMPLETE, handed.envelope
        (warning,) = [w for w in handed.envelope["warnings"] if w["code"] == "BUDGET_HANDOFF_UNATTENDED"]
        assert "--budget 0" in warning["message"] and warning["context"]["job_id"] == handed.data["job_id"]
        assert "warning BUDGET_HANDOFF_UNATTENDED" in handed.stderr and "--budget 0" in handed.stderr

        agent = run_cli("run", job, cwd=tmp_path, env={**env, "AGENT_CALL_BUDGET_MS": "300"})
        assert agent.exit_code == ExitCode.INCOMPLETE  # attached to the same job, still running
        assert agent.data["job_id"] == handed.data["job_id"]
        assert agent.envelope["warnings"] == [] and "BUDGET_HANDOFF_UNATTENDED" not in agent.stderr

        # Cancelled once the worker has sent a request: its 503 is then in the metrics, whatever the load.
        wait_for(lambda: target.stats()["requests"] >= 1, "the worker's first request")
        cancelled = run_cli("job", "cancel", handed.data["job_id"], cwd=tmp_path, env=env)
        assert cancelled.exit_code == ExitCode.SUCCESS and cancelled.data["state"] == "cancelled"

    # The background worker kept the metrics and the log the front process was given.
    samples = read_metrics(prom)
    assert metric(samples, "bulkrelay_run_state", state="cancelled") == 1
    assert metric(samples, "bulkrelay_run_exit_code") == ExitCode.SIGTERM
    assert metric(samples, "bulkrelay_requests_total", status_class="5xx") >= 1
    by_process: dict[int, list[dict[str, Any]]] = {}
    for line in read_log(log):  # two processes append to the file, their lines interleave
        by_process.setdefault(line["pid"], []).append(line)
    front, worker = sorted(by_process.values(), key=len)
    assert [line["event"] for line in front] == ["start", "exit"]
    assert front[1]["exit_code"] == ExitCode.INCOMPLETE and front[1]["job_id"] == handed.data["job_id"]
    assert [line["event"] for line in worker][:2] == ["start", "preflight_done"]
    assert [line["event"] for line in worker][-3:] == ["stop_requested", "stop", "exit"]
    assert worker[-3]["reason"] == "cancelled" and worker[-1]["exit_code"] == ExitCode.SIGTERM
