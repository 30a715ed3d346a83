"""The public names are pinned: adding or removing one is a deliberate change to this list."""

from __future__ import annotations

import bulkrelay


def test_public_names() -> None:
    assert sorted(bulkrelay.__all__) == [
        "BulkRelayError",
        "ExitCode",
        "Job",
        "Preflight",
        "Problem",
        "__version__",
        "load_job",
        "run_preflight",
    ]
    for name in bulkrelay.__all__:
        assert hasattr(bulkrelay, name), name
