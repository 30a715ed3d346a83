"""BulkRelay: turn a file of records into HTTP requests, durably and resumably.

The public surface is the command line (docs/commands.md) and the few names below, for programs
that embed a preflight; every other module is internal and may change. The names load on first use,
so that `bulkrelay --help` does not pay for pydantic and the preflight.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bulkrelay._version import __version__

if TYPE_CHECKING:
    from bulkrelay.errors import BulkRelayError, ExitCode, Problem
    from bulkrelay.job.config import Job, load_job
    from bulkrelay.job.preflight import Preflight, run_preflight

_LAZY = {
    "BulkRelayError": "bulkrelay.errors",
    "ExitCode": "bulkrelay.errors",
    "Problem": "bulkrelay.errors",
    "Job": "bulkrelay.job.config",
    "load_job": "bulkrelay.job.config",
    "Preflight": "bulkrelay.job.preflight",
    "run_preflight": "bulkrelay.job.preflight",
}

__all__ = [
    "BulkRelayError",
    "ExitCode",
    "Job",
    "Preflight",
    "Problem",
    "__version__",
    "load_job",
    "run_preflight",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'bulkrelay' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
