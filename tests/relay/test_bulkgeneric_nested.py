"""`kind: generic` with JSON rows nested by their columns' names: a column named by a JSON pointer
(`/attributes/email`) puts its value there in the row's object, as Klaviyo's bulk profile imports take
them (`{"type": "profile", "attributes": {...}}`), run against the embedded target's profile-import API
(demo/profileimporttarget.py). A job file of flat names keeps its fingerprint, its rows' bytes and their
delta digests; nested columns that cannot make one object are refused when the job file is loaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from bulkrelay.demo.target import start_target
from bulkrelay.errors import ConfigInvalid
from bulkrelay.job.bulkcsv import BulkCsv
from bulkrelay.job.config import load_job
from bulkrelay.job.fingerprint import config_fingerprint
from bulkrelay.job.preflight import run_preflight
from bulkrelay.job.records import Record
from bulkrelay.ops.lifecycle import plan_for
from bulkrelay.store.journal.jobrecords import encode_job_record, job_ledgers, read_job_records
from bulkrelay.store.rundir import RunDir
from tests.clirun import cli_env, run_cli
from tests.relay.bulkrun import generic_json_steps, run_bulk_job, write_generic_job

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).parents[2] / "examples" / "bulk-jobs" / "klaviyo.yaml"


def _example_copy(tmp_path: Path, change: Any = None) -> Path:
    """The Klaviyo example and its CSV in tmp_path, its job file changed by `change` (its bulk_job)."""
    (tmp_path / "profiles.csv").write_bytes((EXAMPLE.parent / "profiles.csv").read_bytes())
    spec = yaml.safe_load(EXAMPLE.read_text())
    if change is not None:
        change(spec["request"]["bulk_job"])
    job = tmp_path / "klaviyo.yaml"
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    return job


async def test_the_klaviyo_example_runs_against_the_demo_target(tmp_path: Path) -> None:
    target = await start_target({"profile_imports": {"errors_page_size": 1}})
    try:
        env = {"KLAVIYO_BASE": target.url, "KLAVIYO_PRIVATE_KEY": "demo"}
        result = await run_bulk_job(EXAMPLE, target, runs=tmp_path / "runs", env=env)
        stats = target.state.stats()
    finally:
        await target.stop()
    assert result.outcome.stop_reason is None
    failed = {entry.key: entry.error for entry in result.entries if not entry.success}
    assert len(result.entries) == 6 and failed == {
        "bogus-dan@example.com": "bogus-dan@example.com is not a valid email address"
    }
    assert all(entry.captured == {} for entry in result.entries if entry.success)  # unlisted: success
    ledgers = job_ledgers(result.run.journal_path)
    assert [ledger.rows for ledger in ledgers.values()] == [[1, 2, 3], [4, 5, 6]]
    submits = [r for r in result.requests if r["method"] == "POST"]
    assert len(submits) == 2 and submits[0]["headers"]["Content-Type"] == "application/json"
    body = orjson.loads(submits[0]["body"])
    assert body["data"]["type"] == "profile-bulk-import-job"
    assert body["data"]["attributes"]["profiles"]["data"][0] == {
        "type": "profile",
        "attributes": {
            "email": "ann@example.com",
            "first_name": "Ann",
            "last_name": "Archer",
            "location": {"city": "Lyon"},
            "properties": {"plan": "gold"},
        },
    }
    assert stats["profile_imports"] == {"created": 2, "complete": 2}
    assert stats["profiles_imported"] == 5 and stats["profiles_in_two_jobs"] == 0


async def test_klaviyos_import_errors_are_read_over_their_pages(tmp_path: Path) -> None:
    """Two failed profiles of one job, a page each: both pages are read (links.next, then null)."""
    target = await start_target({"profile_imports": {"errors_page_size": 1, "fail_contains": "bo"}})
    try:
        env = {"KLAVIYO_BASE": target.url, "KLAVIYO_PRIVATE_KEY": "demo"}
        job = _example_copy(tmp_path, lambda bulk: bulk.update(max_rows=6))
        result = await run_bulk_job(job, target, env=env)
    finally:
        await target.stop()
    failed = sorted(entry.key for entry in result.entries if not entry.success)
    assert len(result.entries) == 6 and failed == ["bob@example.com", "bogus-dan@example.com"]
    pages = [r for r in result.requests if "/import-errors" in r["path"]]
    assert [r["query"] for r in pages] == ["", "page[cursor]=1"]


async def test_a_profile_import_lost_before_its_id_is_submitted_again_matched_by_the_journals_keys(
    tmp_path: Path,
) -> None:
    """The journal's `submitting` holds the rows' input.key values, not their place in the row: after a
    crash in the window, resume submits the rows again and matches the import errors to them by the key
    column's text, wherever the column nests it."""
    target = await start_target({})
    try:
        env = {"KLAVIYO_BASE": target.url, "KLAVIYO_PRIVATE_KEY": "demo"}
        job = _example_copy(tmp_path)
        preflight = run_preflight(load_job(job), None, env=env)
        run = RunDir.create(tmp_path / "runs", plan_for(preflight))
        keys = ["bogus-dan@example.com", "eve@example.com", "fay@example.com"]
        run.journal_path.write_bytes(encode_job_record(1, "submitting", rows=[[4, 6]], keys=keys))
        result = await run_bulk_job(job, target, run=run, env=env)
    finally:
        await target.stop()
    assert result.outcome.stop_reason is None
    assert sorted(entry.row_number for entry in result.entries) == [1, 2, 3, 4, 5, 6]
    failed = {entry.key for entry in result.entries if not entry.success}
    assert failed == {"bogus-dan@example.com"}
    ledgers = job_ledgers(result.run.journal_path)
    assert ledgers[1].events == ["submitting", "aborted"]
    assert [ledgers[2].rows, ledgers[3].rows] == [[1, 2, 3], [4, 5, 6]]  # in input order, again
    created = [r for r in read_job_records(result.run.journal_path) if r["event"] == "created"]
    assert created[1]["keys"] == keys  # the input's key field, as for a flat row


async def test_a_nested_key_column_is_the_default_key_of_json_results(tmp_path: Path) -> None:
    """Without `key`, a result item names its row where the row holds its key: the key column's pointer."""
    listed = {"data": [{"attributes": {"email": "cy@example.com"}, "detail": "no"}], "links": {"next": None}}
    rule = {"match": {"path_contains": "/import-errors"}, "body": listed}

    def keyless(bulk: dict[str, Any]) -> None:
        step = bulk["steps"]["results"][0]
        del step["key"]
        step["error"] = "/detail"
        bulk["max_rows"] = 6  # one job: the rule's answer is its errors

    target = await start_target({"rules": [rule]})
    try:
        env = {"KLAVIYO_BASE": target.url, "KLAVIYO_PRIVATE_KEY": "demo"}
        job = _example_copy(tmp_path, keyless)
        result = await run_bulk_job(job, target, env=env)
    finally:
        await target.stop()
    failed = {entry.key: entry.error for entry in result.entries if not entry.success}
    assert len(result.entries) == 6 and failed == {"cy@example.com": "no"}


async def test_a_flat_profile_is_refused_by_the_demo_target_and_the_job_rows_go_again(tmp_path: Path) -> None:
    """The demo target checks the nesting: the same job with flat columns is refused (400) at each submit,
    so its rows are tried in retry.max_attempts jobs and fail, nothing imported."""

    def flat(bulk: dict[str, Any]) -> None:
        bulk["columns"] = {"email": {"from": "email"}, "first_name": {"from": "first_name"}}
        bulk["max_rows"] = 6

    target = await start_target({})
    try:
        env = {"KLAVIYO_BASE": target.url, "KLAVIYO_PRIVATE_KEY": "demo"}
        result = await run_bulk_job(_example_copy(tmp_path, flat), target, env=env)
        stats = target.state.stats()
    finally:
        await target.stop()
    assert len(result.entries) == 6 and not any(entry.success for entry in result.entries)
    assert "profile 0 is not {type: profile, attributes: {...}}" in (result.entries[0].error or "")
    assert stats["profiles_imported"] == 0 and stats["profile_imports"]["created"] == 0


def _nested(bulk: dict[str, Any], **columns: Any) -> None:
    bulk["columns"] = {"/attributes/email": {"from": "email"}, **columns}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda b: b["columns"].update({"/attributes/email/domain": {"value": "x"}}),
            "/attributes/email and /attributes/email/domain collide in a JSON row: "
            "/attributes/email/domain would sit inside /attributes/email's value",
        ),
        (
            lambda b: b["columns"].update({"type": {"value": "p"}}),
            "/type and type collide in a JSON row: name the same key",
        ),
        (
            lambda b: b["columns"].update({"/attributes": {"value": {}}}),
            "/attributes and /attributes/email collide",
        ),
        (
            lambda b: b["columns"].update({"/attributes//x": {"value": 1}}),
            "'/attributes//x' is no JSON pointer to an object key",
        ),
        (lambda b: b["columns"].update({"/a~2b": {"value": 1}}), "'/a~2b' is no JSON pointer"),
        (lambda b: b["columns"].update({"/": {"value": 1}}), "'/' is no JSON pointer"),
        (
            lambda b: b["steps"]["upload"].update(format="csv", json=None, rows_at=None),
            "/type is a JSON pointer, which nests a JSON row: it goes with kind: generic and "
            "steps.upload.format: json",
        ),
    ],
)
def test_nested_columns_that_make_no_one_object_are_refused_when_loaded(
    tmp_path: Path, change: Any, message: str
) -> None:
    def changed(bulk: dict[str, Any]) -> None:
        change(bulk)
        bulk["steps"]["upload"] = {k: v for k, v in bulk["steps"]["upload"].items() if v is not None}

    with pytest.raises(ConfigInvalid) as refused:
        load_job(_example_copy(tmp_path, changed))
    assert message in str(refused.value.problems)


def test_a_salesforce_job_with_a_pointer_column_is_refused(tmp_path: Path) -> None:
    job = write_generic_job(tmp_path, "http://127.0.0.1:9")
    spec = yaml.safe_load(job.read_text())
    spec["request"]["bulk_job"]["columns"]["/Email"] = spec["request"]["bulk_job"]["columns"].pop("Email")
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(ConfigInvalid, match="/Email is a JSON pointer, which nests a JSON row"):
        load_job(job)


def test_a_nested_key_column_with_csv_results_is_refused_in_preflight(tmp_path: Path) -> None:
    def csv_results(bulk: dict[str, Any]) -> None:
        bulk["steps"]["results"] = [{"path": "/api/x/{job}/errors", "outcome": "failed", "error_column": "e"}]

    job = load_job(_example_copy(tmp_path, csv_results))
    with pytest.raises(ConfigInvalid, match="the key column /attributes/email is a JSON pointer"):
        run_preflight(job, None, env={"KLAVIYO_BASE": "http://127.0.0.1:9", "KLAVIYO_PRIVATE_KEY": "k"})


@pytest.mark.slow  # the real CLI, in a process
def test_validate_refuses_colliding_columns_exit_2_naming_them(tmp_path: Path) -> None:
    job = _example_copy(tmp_path, lambda b: b["columns"].update({"/attributes/location": {"value": "x"}}))
    result = run_cli("validate", job, env=cli_env(KLAVIYO_BASE="http://127.0.0.1:9", KLAVIYO_PRIVATE_KEY="k"))
    assert result.exit_code == 2 and result.error_code == "CONFIG_INVALID"
    assert "/attributes/location and /attributes/location/city collide" in str(result.envelope["error"])


def test_a_nested_row_leaves_out_an_omitted_value_and_keeps_the_column_order(tmp_path: Path) -> None:
    def omitting(bulk: dict[str, Any]) -> None:
        bulk["columns"]["/attributes/phone_number"] = {"from": "phone", "when_missing": "omit"}

    bulk = BulkCsv.of_job(load_job(_example_copy(tmp_path, omitting)).config)
    assert bulk is not None and bulk.key_column == "/attributes/email"
    fields = {"email": "a~/b@x", "first_name": "A", "last_name": "B", "city": "C", "plan": "p"}
    key, line = bulk.line(Record(1, 2, fields))
    assert key == "a~/b@x" and bulk.key_text("a~/b@x") == key
    assert line == (
        b'{"type":"profile","attributes":{"email":"a~/b@x","first_name":"A","last_name":"B",'
        b'"location":{"city":"C"},"properties":{"plan":"p"}}},'
    )


def test_a_pointer_column_unescapes_its_tokens(tmp_path: Path) -> None:
    def escaped(bulk: dict[str, Any]) -> None:
        bulk["columns"] = {"/type": {"value": "profile"}, "/attributes/a~1b~0c": {"from": "email"}}
        bulk["steps"]["results"][0]["key"] = "/attributes/original_payload/a~1b~0c"

    bulk = BulkCsv.of_job(load_job(_example_copy(tmp_path, escaped)).config)
    assert bulk is not None
    assert bulk.line(Record(1, 2, {"email": "e@x"}))[1] == b'{"type":"profile","attributes":{"a/b~c":"e@x"}},'


# The fingerprints, first row's digest and bytes of two generic job files (tests/relay/bulkrun.py's),
# as main computed them before nested columns (8bf9096): a run begun then resumes, a delta night
# resends nothing.
BEFORE = {
    "csv": (
        "01db55a0c5fe327d37e6942e93991089c4eedf326658367479942a385d6a87b9",
        "89dcb0302e3ec8ce878f87df8215f91c",
        b"k1-ann,ann@example.com\n",
    ),
    "json": (
        "7458ea95454c403f4111f756480c04be5f1b572f76c893186f5e4aac2cb29645",
        "baccd93543f98b14549cd6411caffc1f",
        b'{"External_Id__c":"k1-ann","Email":"ann@example.com","Active":true},',
    ),
}


@pytest.mark.parametrize("upload", ["csv", "json"])
def test_a_generic_job_of_flat_columns_keeps_its_fingerprint_bytes_and_digests(
    tmp_path: Path, upload: str
) -> None:
    job = write_generic_job(tmp_path, "http://127.0.0.1:9")
    spec = yaml.safe_load(job.read_text())
    if upload == "json":
        spec["request"]["bulk_job"]["steps"] = generic_json_steps()
        spec["request"]["bulk_job"]["columns"]["Active"] = {"value": True}
    spec["execution"] = {"sync": "delta"}
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    loaded = load_job(job)
    preflight = run_preflight(loaded, None, env={"SF_TOKEN": "t", "SF_INSTANCE": "http://127.0.0.1:9"})
    assert preflight.bulk is not None and preflight.digester is not None
    record = Record(1, 2, {"id": "k1-ann", "email": "ann@example.com"})
    item = preflight.bulk.item_request(record)
    fingerprint, digest, line = BEFORE[upload]
    assert config_fingerprint(loaded.config) == fingerprint
    assert (preflight.digester.digest(item, record.fields).hex(), item.body) == (digest, line)


def _nested_digest(tmp_path: Path, change: Any) -> bytes:
    """The delta digest of the Klaviyo example's first row, its bulk_job changed by `change`."""
    job = _example_copy(tmp_path, change)
    spec = yaml.safe_load(job.read_text())
    spec["execution"] = {"sync": "delta"}
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {"KLAVIYO_BASE": "http://127.0.0.1:9", "KLAVIYO_PRIVATE_KEY": "k"}
    preflight = run_preflight(load_job(job), None, env=env)
    assert preflight.bulk is not None and preflight.digester is not None
    fields = {"email": "a@x", "first_name": "A", "last_name": "B", "city": "C", "plan": "p"}
    record = Record(1, 2, fields)
    return preflight.digester.digest(preflight.bulk.item_request(record), record.fields)


def test_a_nested_rows_delta_digest_follows_where_its_values_go(tmp_path: Path) -> None:
    usual = _nested_digest(tmp_path, lambda bulk: None)
    assert _nested_digest(tmp_path, lambda bulk: bulk.update(max_rows=2)) == usual

    def moved(bulk: dict[str, Any]) -> None:
        bulk["columns"]["/attributes/city"] = bulk["columns"].pop("/attributes/location/city")

    assert _nested_digest(tmp_path, moved) != usual  # the same value, elsewhere in the profile
