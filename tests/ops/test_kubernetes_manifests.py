"""The Kubernetes manifests in examples/ are valid for every Kubernetes version they say they need
(`kubernetes-validate`, offline schemas, strict: no unknown field), and their podFailurePolicy never
retries a pod whose exit code says "done" or "fix first" (issue 28.4: a shard that ended 3 was retried,
and the retry sent the whole shard again)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from bulkrelay.errors import ExitCode

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
INDEXED_JOB = EXAMPLES / "kubernetes" / "indexed-job.yaml"
CRONJOB = EXAMPLES / "scheduling" / "cronjob.yaml"
# Each manifest and the oldest Kubernetes it states (in its header), to the newest the schemas know.
MANIFESTS = [
    INDEXED_JOB,
    CRONJOB,
    EXAMPLES / "kubernetes" / "redis.yaml",
    EXAMPLES / "kubernetes" / "runs-pvc.yaml",
]
NEWEST = tuple(int(n) for n in kubernetes_validate.latest_version().split(".")[:2])
RETRYABLE = {1, 10, 12, 130, 143}  # a retry continues the run from its journal
FINAL = {2, 3, 4, 5, 8}  # done (3) or fix first


def _minimum(path: Path) -> tuple[int, int]:
    """The version a manifest names itself (`Kubernetes 1.29 or later`); the ones that do not: 1.29,
    the oldest any of the examples needs."""
    found = re.search(r"Kubernetes (\d+)\.(\d+) or later", path.read_text())
    return (int(found.group(1)), int(found.group(2))) if found else (1, 29)


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _cases() -> list[tuple[Path, str]]:
    return [(path, f"1.{minor}.0") for path in MANIFESTS for minor in range(_minimum(path)[1], NEWEST[1] + 1)]


@pytest.mark.parametrize(("path", "version"), _cases(), ids=lambda v: v.name if isinstance(v, Path) else v)
def test_each_manifest_is_valid_for_every_version_it_claims(path: Path, version: str) -> None:
    for document in _documents(path):
        kubernetes_validate.validate(document, version, strict=True)


def _policy(job_spec: dict[str, Any], action: str) -> tuple[dict[str, Any], ...]:
    rules = job_spec["podFailurePolicy"]["rules"]
    return tuple(rule["onExitCodes"] for rule in rules if rule["action"] == action and "onExitCodes" in rule)


def _fails_for_good(rules: tuple[dict[str, Any], ...], code: int) -> bool:
    """Whether the first rule matching a pod that exited `code` fails it (the policy's order)."""
    for rule in rules:
        inside = code in rule["values"]
        if inside == (rule["operator"] == "In"):
            return True
    return False


@pytest.mark.parametrize(
    ("path", "action"), [(INDEXED_JOB, "FailIndex"), (CRONJOB, "FailJob")], ids=["indexed-job", "cronjob"]
)
def test_only_the_exit_codes_a_retry_can_fix_are_retried(path: Path, action: str) -> None:
    (document,) = _documents(path)
    spec = document["spec"] if document["kind"] == "Job" else document["spec"]["jobTemplate"]["spec"]
    rules = _policy(spec, action)
    codes = {int(code) for code in ExitCode} | RETRYABLE | FINAL
    failed = {code for code in codes - {0} if _fails_for_good(rules, code)}
    assert failed == codes - {0} - RETRYABLE  # 2, 3, 4, 5, 8, and every other code but the retryable
    assert failed >= FINAL and not RETRYABLE & failed
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy requires it
    disruption = spec["podFailurePolicy"]["rules"][0]
    assert disruption["action"] == "Ignore" and disruption["onPodConditions"][0]["type"] == "DisruptionTarget"
