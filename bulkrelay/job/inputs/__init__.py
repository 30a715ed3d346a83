"""The input, read as a stream: its spec and fingerprint, the readers of each format, the stdin spool.

The face every importer uses; the modules behind it hold one format or one concept each."""

from __future__ import annotations

from bulkrelay.job.inputs.raw import InputBytes, open_input_bytes
from bulkrelay.job.inputs.spec import (
    REGION_SIZE,
    STDIN_NAME,
    ExpectedInput,
    InputFingerprint,
    InputFormat,
    InputIdentity,
    InputSpec,
    ProblemSink,
    RegionDigests,
    changed_values,
    detect_format,
    input_changed,
)
from bulkrelay.job.inputs.spool import (
    Spool,
    abandoned_spools,
    append_stdin,
    let_go_of_spool,
    spool_file,
    spool_stdin,
    spool_stdin_into,
)
from bulkrelay.job.inputs.stream import RecordStream, open_records

__all__ = [
    "REGION_SIZE",
    "STDIN_NAME",
    "ExpectedInput",
    "InputBytes",
    "InputFingerprint",
    "InputFormat",
    "InputIdentity",
    "InputSpec",
    "ProblemSink",
    "RecordStream",
    "RegionDigests",
    "Spool",
    "abandoned_spools",
    "append_stdin",
    "changed_values",
    "detect_format",
    "input_changed",
    "let_go_of_spool",
    "open_input_bytes",
    "open_records",
    "spool_file",
    "spool_stdin",
    "spool_stdin_into",
]
