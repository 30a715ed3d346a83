"""`notify:`: a message when a run ends as named (success, failure, halt), POSTed to a webhook.

It carries the headline (the result in words), the counts, the top failure reasons and the report's
path; Slack's format is a `text` with the same lines. Each webhook is tried a few times with a short
backoff, all within a few seconds; one that cannot be sent, for any reason (a URL that is no URL, a
trailing newline from a secret file, a receiver that is down), is a `NOTIFY_FAILED` warning, which even
`--quiet` prints, never a change to the run's exit code. The webhook URL is usually a secret: it is read
from the environment when the message is sent and never written; a warning names the entry by its place
(`notify[0]`) and what is wrong with its URL, never a part of it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import httpx
import orjson

from bulkrelay.envelope import EnvelopeWarning
from bulkrelay.errors import BulkRelayError
from bulkrelay.job.config import JobConfig, NotifyConfig
from bulkrelay.job.template import compile_template, resolve_secrets
from bulkrelay.ops.results import RunResult
from bulkrelay.relay.retry import counts_as_success
from bulkrelay.relay.stopping import StopReason
from bulkrelay.report.words import count, percent, verdict
from bulkrelay.store.manifest import RunState

ATTEMPTS = 3
BACKOFF_SECONDS = (0.25, 0.75)  # between the attempts: all of them well within a few seconds
TIMEOUT_SECONDS = 2.0
TOP_REASONS = 3


def outcome_of(result: RunResult, stop_reason: str | None) -> str | None:
    """The `on:` name of how the run ended: success, failure or halt (None: cancelled, or running)."""
    if result.state == RunState.COMPLETED:
        return "success"
    if stop_reason == StopReason.LIMIT:  # a canary stops as asked: it failed only if its rows did
        return "failure" if result.summary.failed else "success"
    if stop_reason in StopReason.__members__.values() and StopReason(str(stop_reason)).halts:
        return "halt"
    if result.state in (RunState.COMPLETED_WITH_FAILURES, RunState.STOPPED, RunState.FORCED):
        return "failure"
    return None


def message(job_name: str, result: RunResult, stop_reason: str | None) -> dict[str, Any]:
    summary = result.summary
    reasons = sorted(
        ((name, rows) for name, rows in summary.by_classification.items() if not counts_as_success(name)),
        key=lambda item: -item[1],
    )[:TOP_REASONS]
    return {
        "job": job_name,
        "run_id": result.run_id,
        "state": str(result.state),
        "headline": verdict(str(result.state), stop_reason, False, summary.failed),
        "rows_total": summary.rows_total,
        "rows_done": summary.rows_done,
        "succeeded": summary.succeeded,
        "failed": summary.failed,
        "top_failure_reasons": [{"classification": name, "rows": rows} for name, rows in reasons],
        "run_dir": result.run_dir,
        "report": result.report,
    }


def slack_text(body: dict[str, Any]) -> str:
    lines = [
        f"*{body['job']}*: {body['headline']}",
        f"{count(body['rows_done'])} of {count(body['rows_total'])} rows done, "
        f"{count(body['failed'])} failed ({percent(body['failed'], body['rows_done'])})",
    ]
    lines += [f"• {r['classification']}: {count(r['rows'])} rows" for r in body["top_failure_reasons"]]
    lines.append(f"report: {body['report']}" if body["report"] else f"run: {body['run_dir']}")
    return "\n".join(lines)


def notify(
    config: JobConfig,
    result: RunResult,
    stop_reason: str | None,
    env: Mapping[str, str] | None = None,
) -> list[EnvelopeWarning]:
    """Send every `notify:` entry whose `on:` names how the run ended; the warnings of those not sent."""
    outcome = outcome_of(result, stop_reason)
    if outcome is None or not config.notify:
        return []
    body = message(config.name or "job", result, stop_reason)
    warnings = []
    for place, entry in enumerate(config.notify):
        if outcome not in entry.on:
            continue
        problem = _send(entry, body, os.environ if env is None else env)
        if problem is not None:
            text = f"notify[{place}] ({entry.format}, on {outcome}) was not delivered: {problem}"
            warnings.append(
                EnvelopeWarning("NOTIFY_FAILED", text, {"notify": place, "run_id": result.run_id})
            )
    return warnings


def _send(entry: NotifyConfig, body: dict[str, Any], env: Mapping[str, str]) -> str | None:
    """None when the webhook took the message, else why not (no URL, no secret in it)."""
    template = compile_template(entry.webhook)
    try:
        url = template.bind(resolve_secrets(template.secrets, env)).render({})
    except BulkRelayError as exc:
        return exc.message  # names the missing variable, never a value
    wrong = url_problem(url)
    if wrong is not None:
        return wrong  # tried again, it would be as wrong
    payload = {"text": slack_text(body)} if entry.format == "slack" else body
    data = orjson.dumps(payload)
    problem: str | None = None
    for attempt in range(ATTEMPTS):
        if attempt:
            time.sleep(BACKOFF_SECONDS[attempt - 1])
        problem = _post(url, data)
        if problem is None:
            return None
    return f"{problem} after {ATTEMPTS} attempts"


def url_problem(url: str) -> str | None:
    """What makes the webhook no URL to POST to, in words that show no part of it (it is a secret)."""
    unprintable = next((at for at, char in enumerate(url) if not char.isprintable() or char.isspace()), None)
    if unprintable is not None:
        where = "at its end" if unprintable == len(url) - 1 else f"at position {unprintable}"
        return (
            f"the webhook URL holds a control character or space {where} "
            "(a secret read from a file with its newline?)"
        )
    try:
        scheme = httpx.URL(url).scheme
    except httpx.InvalidURL as exc:
        reason = str(exc).split(":", 1)[0].rstrip(".")  # `Invalid port: '…'`: the words, not the text
        return f"the webhook is not a valid URL ({reason})"
    if scheme not in ("http", "https"):
        return "the webhook is not an http:// or https:// URL"
    return None


def _post(url: str, data: bytes) -> str | None:
    """None when the webhook answered 2xx, else why not. Any failure is only the message's: the run has
    ended and its exit code stands, so nothing raised here may reach the caller."""
    try:
        answer = httpx.post(
            url, content=data, headers={"Content-Type": "application/json"}, timeout=TIMEOUT_SECONDS
        )
    except Exception as exc:  # httpx's, and any other: an httpx message would carry the URL
        return type(exc).__name__
    return None if answer.is_success else f"HTTP {answer.status_code}"
