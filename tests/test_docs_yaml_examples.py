"""Every ```yaml block of docs/*.md is read as a user would copy it: the text as written, through the
strict loader (no dumper quoting a key for us), then, when it is a job or a part of one, validated as a
job file. A documented spelling the loader refuses (`on:` of `notify:` read as a boolean) fails here."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from bulkrelay.job.config import JobConfig, parse_job
from bulkrelay.job.yamlload import load_yaml

ROOT = Path(__file__).resolve().parent.parent
_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)
# A part of a job is validated inside this one (`customer_id`: a mirror's URL may use only the key).
_BASE = {
    "version": 1,
    "input": {"file": "customers.csv", "key": "customer_id"},
    "request": {"method": "POST", "url": "http://127.0.0.1/x"},
}
# Blocks that are not a whole part of a job: an excerpt (`...`), alternatives (`# or`), one leaf of a body.
_EXCERPT = re.compile(r"^\s*(?:\.\.\.|#\s*or\s*$)|\{ \.\.\. \}", re.MULTILINE)


def _blocks() -> list[Any]:
    found = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        text = page.read_text()
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 2  # the block's first line
            found.append(pytest.param(match.group(1), id=f"{page.name}:{line}"))
    return found


def _merged(base: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in part.items():
        if key != "input" and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


@pytest.mark.parametrize("block", _blocks())
def test_a_documented_yaml_block_loads_and_validates_as_written(block: str) -> None:
    if re.search(r"^\s*\.\.\.\s*$", block, re.MULTILINE):
        return  # an excerpt: not YAML as a whole
    value, _ = load_yaml(textwrap.dedent(block), "doc.yaml")
    if block[0].isspace() or not isinstance(value, dict) or _EXCERPT.search(block):
        return
    if not set(value) <= set(JobConfig.model_fields):
        return  # another file's block (.bulkrelay/config.yaml) or a leaf of a body
    job = value if "version" in value else _merged(_BASE, value)
    parse_job(yaml.safe_dump(job), file="doc.yaml")  # the loader has read the text as written above


def test_the_documented_notify_block_is_read_as_written() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    block = next(b for b in _BLOCK.findall(text) if b.startswith("notify:"))
    value, _ = load_yaml(block, "doc.yaml")
    assert value["notify"][0]["on"] == ["failure", "halt"]
