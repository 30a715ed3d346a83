"""`validate` and `render` through the real command: every bad input names its place and its code."""

from __future__ import annotations

import gzip
import resource
from pathlib import Path

import pytest
import trustme

from bulkrelay.errors import ExitCode
from tests.clirun import cli_env, run_cli

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

JOB = """\
version: 1
input: {file: people.csv, key: id}
request:
  method: POST
  url: "http://127.0.0.1:9/v1/people/{id}"
  headers: {Authorization: "Bearer ${API_TOKEN}"}
  json:
    email: {from: email}
    age: {from: age, type: integer}
"""

GOOD_CSV = "id,email,age\n1,a@x.org,31\n2,b@x.org,42\n3,c@x.org,53\n"


def write(tmp_path: Path, job: str = JOB, csv_text: str | None = GOOD_CSV, name: str = "people.csv") -> Path:
    (tmp_path / "job.yaml").write_text(job)
    if csv_text is not None:
        (tmp_path / name).write_text(csv_text)
    return tmp_path / "job.yaml"


def validate(job: Path, *extra: str, token: bool = True, stdin: bytes | None = None):  # type: ignore[no-untyped-def]
    env = cli_env(API_TOKEN="t0ps3cret") if token else cli_env()
    return run_cli("validate", job, *extra, env=env, stdin=stdin)


def only_problem(result) -> dict:  # type: ignore[no-untyped-def,type-arg]
    problems = result.envelope["error"]["context"]["problems"]
    assert len(problems) >= 1
    return problems[0]  # type: ignore[no-any-return]


def test_valid_job_reports_count_format_and_fingerprints(tmp_path: Path) -> None:
    result = validate(write(tmp_path))
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    data = result.data
    assert data["record_count"] == 3
    assert data["format"] == "csv"
    assert len(data["input"]["sha256"]) == 64
    assert len(data["config_sha256"]) == 64


def test_alpha_example_validates_from_a_clean_checkout() -> None:
    result = run_cli("validate", EXAMPLES / "alpha" / "basic.yaml")
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    assert result.data["record_count"] == 20


def test_backfill_example_validates_with_no_environment_at_all() -> None:
    result = run_cli("validate", EXAMPLES / "backfill" / "job.yaml")
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    assert (result.data["record_count"], result.data["format"]) == (50, "jsonl")


@pytest.mark.parametrize(
    ("job_text", "path_fragment", "line"),
    [
        (JOB.replace("  method: POST\n", "  method: POST\n  methd: PUT\n"), "request.methd", 5),
        (JOB.replace("version: 1\n", "version: 1\nversion: 1\n"), None, 2),
        (JOB + "execution: {concurrency: many}\n", "execution.concurrency", 10),
        (JOB + "name: 2026-01-01\n", "name", 10),
    ],
    ids=["unknown-key", "duplicate-key", "wrong-type", "unquoted-date"],
)
def test_job_file_problems_name_path_and_line(
    tmp_path: Path, job_text: str, path_fragment: str | None, line: int
) -> None:
    result = validate(write(tmp_path, job_text))
    assert result.exit_code == ExitCode.ARG_ERROR
    assert result.error_code == "CONFIG_INVALID"
    problem = only_problem(result)
    assert problem["line"] == line
    if path_fragment:
        assert problem["path"] == path_fragment
    assert f":{line}" in result.envelope["error"]["message"]


def test_a_field_no_csv_column_has_is_one_config_error_naming_the_columns(tmp_path: Path) -> None:
    job = write(tmp_path, JOB.replace("{from: email}", "{from: e_mail}"))
    result = validate(job)
    assert result.exit_code == ExitCode.ARG_ERROR
    assert result.error_code == "CONFIG_INVALID"
    assert result.envelope["error"]["context"]["problem_count"] == 1
    problem = only_problem(result)
    assert (problem["file"], problem["line"], problem["path"]) == (str(job), 8, "request.json.email.from")
    assert problem["field"] == "e_mail" and "row" not in problem
    assert "columns: id, email, age" in problem["message"]
    assert "did you mean 'email'" in problem["message"]


def test_a_field_no_json_line_has_is_one_config_error(tmp_path: Path) -> None:
    job = write(tmp_path, JOB.replace("people.csv", "people.jsonl").replace("{id}", "{ID}"), csv_text=None)
    records = [b'{"id": 1, "email": "a@x.org", "age": 3}', b'{"id": 2, "email": "b@x.org", "age": 4, "x": 1}']
    (tmp_path / "people.jsonl").write_bytes(b"\n".join(records) + b"\n")
    result = validate(job)
    assert result.error_code == "CONFIG_INVALID", result.envelope
    problem = only_problem(result)
    assert (problem["line"], problem["path"], problem["field"]) == (5, "request.url", "ID")
    assert "keys: age, email, id, x" in problem["message"]
    assert "did you mean 'id'" in problem["message"]


def test_a_field_some_json_lines_lack_is_an_error_of_those_rows(tmp_path: Path) -> None:
    job = write(tmp_path, JOB.replace("people.csv", "people.jsonl"), csv_text=None)
    records = [b'{"id": 1, "email": "a@x.org", "age": 3}', b'{"id": 2, "age": 4}']
    (tmp_path / "people.jsonl").write_bytes(b"\n".join(records) + b"\n")
    result = validate(job)
    assert result.error_code == "INPUT_INVALID", result.envelope
    problem = only_problem(result)
    assert (problem["row"], problem["line"], problem["field"]) == (2, 2, "email")
    assert "missing from the record" in problem["message"]


def test_ragged_csv_row_names_its_line(tmp_path: Path) -> None:
    result = validate(write(tmp_path, csv_text="id,email,age\n1,a@x.org,31\n2,b@x.org\n3,c@x.org,53\n"))
    assert result.error_code == "INPUT_INVALID"
    problem = only_problem(result)
    assert problem["line"] == 3
    assert problem["row"] == 2


def test_integer_type_names_row_and_field(tmp_path: Path) -> None:
    result = validate(write(tmp_path, csv_text="id,email,age\n1,a@x.org,31\n2,b@x.org,forty\n"))
    assert result.exit_code == ExitCode.ARG_ERROR
    problem = only_problem(result)
    assert (problem["row"], problem["field"], problem["line"]) == (2, "age", 3)


def test_integer_beyond_signed_64_bit_names_row_and_field(tmp_path: Path) -> None:
    csv_text = "id,email,age\n1,a@x.org,9223372036854775807\n2,b@x.org,18446744073709551615\n"
    result = validate(write(tmp_path, csv_text=csv_text))
    assert result.exit_code == ExitCode.ARG_ERROR, result.envelope
    problem = only_problem(result)
    assert (problem["row"], problem["field"], problem["line"]) == (2, "age", 3)
    assert "signed 64-bit" in problem["message"]


def _address_space_at_most_2_gib() -> None:
    resource.setrlimit(
        resource.RLIMIT_AS, (2 << 30, 2 << 30)
    )  # a value made without end ends here, not the machine


@pytest.mark.parametrize(
    ("template", "words"),
    [
        ("{{ (1..99999999999) | join }}", "range limit reached"),  # grew 230 MB/s until killed
        ("{{ s | split: '' | join: s | size }}", "value limit reached: join"),  # 50,000 squared
        ("{{ s | replace: '', s | size }}", "value limit reached: replace"),
    ],
)
def test_a_liquid_value_made_without_end_is_refused_naming_its_row(
    tmp_path: Path, template: str, words: str
) -> None:
    job = JOB.replace("age: {from: age, type: integer}", f'made: {{liquid: "{template}"}}')
    csv_text = f"id,email,s\n1,a@x.org,ab\n2,b@x.org,{'x' * 50_000}\n"
    result = run_cli(
        "validate",
        write(tmp_path, job, csv_text),
        env=cli_env(API_TOKEN="t0ps3cret"),
        preexec_fn=_address_space_at_most_2_gib,
        timeout=60,
    )
    assert result.exit_code == ExitCode.ARG_ERROR, result.envelope
    problem = only_problem(result)
    assert (problem["row"], problem["line"]) == ((1, 2) if "99999999999" in template else (2, 3))
    assert words in problem["message"]
    assert problem["field"] == "made"  # the leaf's place in the body


@pytest.mark.parametrize("command", ["validate", "render"])
def test_a_date_out_of_range_in_its_time_zone_names_row_and_field(tmp_path: Path, command: str) -> None:
    job = JOB.replace(
        "age: {from: age, type: integer}", "at: {from: at, type: datetime, timezone: Pacific/Kiritimati}"
    )
    csv_text = "id,email,age,at\n1,a@x.org,31,2024-03-01\n2,b@x.org,42,9999-12-31T23:59:59Z\n"
    result = run_cli(command, write(tmp_path, job, csv_text), env=cli_env(API_TOKEN="t0ps3cret"))
    assert result.exit_code == ExitCode.ARG_ERROR, result.envelope
    problem = only_problem(result)
    assert (problem["row"], problem["field"], problem["line"]) == (2, "at", 3)
    assert "'9999-12-31T23:59:59Z'" in problem["message"]


@pytest.mark.parametrize("command", ["validate", "render"])
@pytest.mark.parametrize(
    ("setting", "path"),
    [
        ("  json: {n: {value: 99999999999999999999}}\n", "request.json.n.value"),
        ("halt: {consecutive_failures: 99999999999999999999}\n", "halt.consecutive_failures"),
    ],
    ids=["body-constant", "halt-rule"],
)
def test_a_job_file_integer_beyond_64_bit_is_a_config_error_naming_its_line(
    tmp_path: Path, command: str, setting: str, path: str
) -> None:
    body = "  json:\n    email: {from: email}\n    age: {from: age, type: integer}\n"
    job_text = JOB.replace(body, setting)
    result = run_cli(command, write(tmp_path, job_text), env=cli_env(API_TOKEN="t0ps3cret"))
    assert result.exit_code == ExitCode.ARG_ERROR, result.envelope
    assert result.error_code == "CONFIG_INVALID"
    problem = only_problem(result)
    assert (problem["path"], problem["line"]) == (path, 7)
    assert "64-bit" in problem["message"]


def test_duplicate_record_key(tmp_path: Path) -> None:
    result = validate(write(tmp_path, csv_text="id,email,age\n1,a@x.org,31\n1,b@x.org,42\n"))
    assert result.error_code == "INPUT_INVALID"
    problem = only_problem(result)
    assert (problem["row"], problem["field"]) == (2, "id")
    assert "duplicate" in problem["message"]


def test_empty_input(tmp_path: Path) -> None:
    result = validate(write(tmp_path, csv_text="id,email,age\n"))
    assert result.error_code == "INPUT_INVALID"
    assert "no records" in result.envelope["error"]["message"]


def test_missing_input_file(tmp_path: Path) -> None:
    result = validate(write(tmp_path, csv_text=None))
    assert result.exit_code == ExitCode.NOT_FOUND
    assert "people.csv" in result.envelope["error"]["message"]


def test_missing_job_file(tmp_path: Path) -> None:
    result = validate(tmp_path / "nope.yaml")
    assert result.exit_code == ExitCode.NOT_FOUND
    assert "nope.yaml" in result.envelope["error"]["message"]


def test_missing_secret(tmp_path: Path) -> None:
    result = validate(write(tmp_path), token=False)
    assert result.exit_code == ExitCode.PRECONDITION
    assert result.error_code == "SECRET_MISSING"
    assert "API_TOKEN" in result.envelope["error"]["message"]


def test_an_empty_secret_is_missing_and_the_message_says_empty_not_unset(tmp_path: Path) -> None:
    """`API_TOKEN=` in an env file: an operator told "not set" looks at the wrong thing."""
    result = run_cli("validate", write(tmp_path), env=cli_env(API_TOKEN=""))
    assert result.exit_code == ExitCode.PRECONDITION
    assert result.error_code == "SECRET_MISSING"
    assert result.envelope["error"]["message"] == "environment variable not set or empty: API_TOKEN"


JSONL_JOB = JOB.replace("people.csv", "people.jsonl")


@pytest.mark.parametrize(
    ("body", "line", "words"),
    [
        (b'{"id": 1, "email": "a@x.org", "age": 3}\n{"id": 2, "email": \n', 2, "invalid JSON"),
        (b'{"id": 1, "email": "a@x.org", "age": 3}\n[1, 2]\n', 2, "JSON object"),
    ],
    ids=["bad-json", "non-object"],
)
def test_json_lines_problems_name_their_line(tmp_path: Path, body: bytes, line: int, words: str) -> None:
    job = write(tmp_path, JSONL_JOB, csv_text=None)
    (tmp_path / "people.jsonl").write_bytes(body)
    result = validate(job)
    assert result.error_code == "INPUT_INVALID"
    problem = only_problem(result)
    assert problem["line"] == line
    assert words in problem["message"]


def test_at_most_twenty_problems_are_listed_and_all_are_counted(tmp_path: Path) -> None:
    rows = "".join(f"{n},x{n}@x.org,not-a-number\n" for n in range(1, 31))
    result = validate(write(tmp_path, csv_text="id,email,age\n" + rows))
    context = result.envelope["error"]["context"]
    assert len(context["problems"]) == 20
    assert context["problem_count"] == 30


def test_stdin_and_gzip_inputs(tmp_path: Path) -> None:
    job = write(tmp_path)
    from_stdin = validate(job, "--input", "-", stdin=GOOD_CSV.encode())
    assert from_stdin.exit_code == ExitCode.SUCCESS, from_stdin.envelope
    assert from_stdin.data["record_count"] == 3
    packed = tmp_path / "people.csv.gz"
    packed.write_bytes(gzip.compress(GOOD_CSV.encode()))
    zipped = validate(job, "--input", str(packed))
    assert zipped.exit_code == ExitCode.SUCCESS, zipped.envelope
    assert zipped.data["gzip"] is True


def test_render_shows_exact_requests_with_secrets_redacted(tmp_path: Path) -> None:
    job = write(tmp_path)
    result = run_cli("render", job, "--rows", "2-3", env=cli_env(API_TOKEN="t0ps3cret"))
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    requests = result.data["requests"]
    assert [r["row_number"] for r in requests] == [2, 3]
    first = requests[0]
    assert first["method"] == "POST"
    assert first["url"] == "http://127.0.0.1:9/v1/people/2"
    assert ["Authorization", "Bearer ***"] in first["headers"]
    assert '"age":42' in first["body"]
    assert b"t0ps3cret" not in result.stdout


def test_render_shows_the_idempotency_key_a_run_would_send() -> None:
    job = EXAMPLES / "backfill" / "job.yaml"
    first = run_cli("render", job, "--rows", "1-2")
    again = run_cli("render", job, "--rows", "1")
    keys = [dict(r["headers"])["Idempotency-Key"] for r in first.data["requests"]]
    assert len(set(keys)) == 2
    assert dict(again.data["requests"][0]["headers"])["Idempotency-Key"] == keys[0]


def test_render_streams_a_huge_range_and_says_which_rows_are_beyond_the_input(tmp_path: Path) -> None:
    job = write(tmp_path)
    env = cli_env(API_TOKEN="t0ps3cret")
    huge = run_cli("render", job, "--rows", "2-1000000000000", env=env, timeout=60)
    assert huge.exit_code == ExitCode.SUCCESS, huge.envelope
    assert [r["row_number"] for r in huge.data["requests"]] == [2, 3]
    (warning,) = huge.envelope["warnings"]
    assert warning["code"] == "ROWS_BEYOND_INPUT"
    assert warning["context"] == {"record_count": 3, "rows": "2-1000000000000"}
    assert "4-1000000000000" in warning["message"]

    default = run_cli("render", job, env=env)  # the first five rows of a three-row input: no warning
    assert [r["row_number"] for r in default.data["requests"]] == [1, 2, 3]
    assert default.envelope["warnings"] == []


def test_render_of_rows_that_do_not_exist_is_a_usage_error(tmp_path: Path) -> None:
    job = write(tmp_path)
    result = run_cli("render", job, "--rows", "9999", env=cli_env(API_TOKEN="t0ps3cret"))
    assert result.exit_code == ExitCode.ARG_ERROR, result.envelope
    assert result.error_code == "USAGE_ERROR"
    message = result.envelope["error"]["message"]
    assert "9999" in message and "3 rows" in message and "people.csv" in message


@pytest.mark.parametrize("fault", ["missing", "not PEM", "key of another certificate"])
@pytest.mark.parametrize("client", ["reqwest", "httpx"])
def test_validate_loads_the_client_certificate_as_run_does(tmp_path: Path, fault: str, client: str) -> None:
    """`validate` passed a job whose `execution.tls.client_cert` `run` then refused before its first
    request: it now sets up the HTTP client as `run` does, and refuses it the same way."""
    authority = trustme.CA()
    authority.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    identity = authority.issue_cert("relay-client@example.test")
    identity.cert_chain_pems[0].write_to_path(str(tmp_path / "client.pem"))
    identity.private_key_pem.write_to_path(str(tmp_path / "client.key"))
    tls = "tls: {client_cert: client.pem, client_key: client.key}"
    job = write(tmp_path, f"{JOB}execution: {{client: {client}, {tls}}}\n")
    env = cli_env(API_TOKEN="t0ps3cret", SSL_CERT_FILE=str(tmp_path / "ca.pem"))
    assert run_cli("validate", job, env=env).exit_code == ExitCode.SUCCESS  # the pair loads
    if fault == "missing":
        (tmp_path / "client.pem").unlink()
    elif fault == "not PEM":
        (tmp_path / "client.pem").write_text("not a certificate\n")
    else:
        authority.issue_cert("other@example.test").private_key_pem.write_to_path(str(tmp_path / "client.key"))

    refused = run_cli("validate", job, env=env)
    ran = run_cli("run", job, "--budget", "0", "--runs-dir", tmp_path / "runs", env=env)

    assert (refused.exit_code, refused.error_code) == (ExitCode.ARG_ERROR, "USAGE_ERROR"), refused.envelope
    assert str(tmp_path / "client.pem") in refused.envelope["error"]["message"]
    assert (ran.exit_code, ran.envelope["error"]["message"]) == (
        ExitCode.ARG_ERROR,
        refused.envelope["error"]["message"],
    )
