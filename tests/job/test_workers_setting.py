"""`execution.workers`: a count or `auto`, out of the fingerprint, and refused where rows travel many a
request (job/config.py)."""

from __future__ import annotations

from textwrap import dedent
from typing import Any

import pytest
from pydantic import ValidationError

from bulkrelay.cli.parser import build_parser
from bulkrelay.errors import ConfigInvalid, UsageError
from bulkrelay.job.config import JobConfig, parse_job
from bulkrelay.job.fingerprint import config_fingerprint


def _config(**execution: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "input": {"file": "data.csv", "key": "id"},
        "request": {"method": "POST", "url": "http://127.0.0.1:9/items/{id}"},
        "execution": execution,
    }


def test_workers_is_a_count_or_auto_and_changes_no_fingerprint() -> None:
    one = JobConfig.model_validate(_config())
    four = JobConfig.model_validate(_config(workers=4))
    auto = JobConfig.model_validate(_config(workers="auto"))
    assert (one.execution.workers, four.execution.workers, auto.execution.workers) == (1, 4, "auto")
    assert config_fingerprint(one) == config_fingerprint(four) == config_fingerprint(auto)  # resume with any


@pytest.mark.parametrize("bad", [0, -1, 65, "all", 2.5])
def test_workers_out_of_range_or_misspelt_is_refused(bad: Any) -> None:
    with pytest.raises(ValidationError, match="workers"):
        JobConfig.model_validate(_config(workers=bad))


def test_several_workers_are_refused_for_a_batch_job_and_auto_is_one_process() -> None:
    batch = _config(workers=3)
    batch["request"] = {
        "method": "POST",
        "url": "http://127.0.0.1:9/batch",
        "batch": {"max_items": 10, "item": {"id": {"from": "id"}}},
    }
    with pytest.raises(ValidationError, match=r"execution.workers: 3 .* request.batch"):
        JobConfig.model_validate(batch)
    batch["execution"] = {"workers": "auto"}
    assert JobConfig.model_validate(batch).execution.workers == "auto"  # run by one process (ops/lifecycle)


@pytest.mark.parametrize("bad", [0, "AUTO", True])
def test_a_bad_workers_value_is_one_message_naming_auto(bad: Any) -> None:
    with pytest.raises(ValidationError) as refused:
        JobConfig.model_validate(_config(workers=bad))
    assert refused.value.error_count() == 1
    assert "expected auto or a whole number from 1 to 64" in str(refused.value)


@pytest.mark.parametrize("bad", ["AUTO", "0", "", "\uff12"])  # the last: a full-width 2
def test_the_workers_flag_refuses_what_is_neither_auto_nor_a_count(bad: str) -> None:
    with pytest.raises(UsageError, match="--workers: expected auto or a whole number from 1 to 64"):
        build_parser().parse_args(["run", "job.yaml", "--workers", bad])


def test_a_batch_jobs_several_workers_are_named_at_their_own_line() -> None:
    """A check of the whole job names its field first; the problem points at that field's line, not
    at the file's first key."""
    text = dedent(
        """\
        version: 1
        input: {file: data.csv, key: id}
        request:
          method: POST
          url: http://127.0.0.1:9/batch
          batch: {max_items: 10, item: {id: {from: id}}}
        execution:
          concurrency: 4
          workers: 2
        """
    )
    with pytest.raises(ConfigInvalid) as refused:
        parse_job(text, file="job.yaml")
    (problem,) = refused.value.problems
    assert (problem.line, problem.path) == (9, "execution.workers"), problem
    assert problem.message.startswith("execution.workers: 2 splits"), problem
    assert problem.describe().startswith("job.yaml:9: execution.workers: 2 splits")  # the field said once


def test_a_delta_job_without_its_key_is_named_at_its_sync_line() -> None:
    text = dedent(
        """\
        version: 1
        input: {file: data.csv}
        request:
          method: POST
          url: http://127.0.0.1:9/items
        execution:
          concurrency: 4
          sync: delta
        """
    )
    with pytest.raises(ConfigInvalid) as refused:
        parse_job(text, file="job.yaml")
    (problem,) = refused.value.problems
    assert (problem.line, problem.path) == (8, "execution.sync"), problem


def test_a_whole_job_check_naming_a_key_the_file_lacks_points_at_its_nearest_section() -> None:
    text = dedent(
        """\
        version: 1
        input: {file: data.csv, key: id}
        request:
          method: POST
          url: http://127.0.0.1:9/items
        execution:
          concurrency: 4
        mirror: {url: "http://127.0.0.1:9/items/{id}", max_deletes: 5}
        """
    )
    with pytest.raises(ConfigInvalid) as refused:
        parse_job(text, file="job.yaml")
    (problem,) = refused.value.problems
    assert (problem.line, problem.path) == (6, "execution"), problem
