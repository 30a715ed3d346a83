"""Fingerprints over canonical bytes: the same meaning always hashes the same."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson

from bulkrelay.job.config import JobConfig, config_semantic_dict


def canonical_bytes(value: Any) -> bytes:
    """JSON with sorted keys and fixed separators, so dict order never changes a hash."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def canonical_sha256(value: Any) -> str:
    return hashlib.sha256(canonical_bytes(value)).hexdigest()


def file_sha256(path: Path) -> str:
    with path.open("rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def config_fingerprint(config: JobConfig) -> str:
    """The semantic fingerprint: what the job does, not where its files are or what its secrets hold.

    `${NAME}` references stay as written, so rotating a token keeps the fingerprint;
    the input path and the job's label are left out, so moving files keeps it too.
    """
    return canonical_sha256(config_semantic_dict(config))
