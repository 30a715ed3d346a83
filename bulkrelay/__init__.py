"""BulkRelay: turn a file of records into HTTP requests, durably and resumably.

The public surface is the command line (docs/commands.md) and the few names below, for programs
that embed a preflight; every other module is internal and may change.
"""

__version__ = "0.1.0"

from bulkrelay.config import Job, load_job
from bulkrelay.errors import BulkRelayError, ExitCode, Problem
from bulkrelay.preflight import Preflight, run_preflight

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
