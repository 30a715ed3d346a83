"""The job file models: defaults, strictness, and errors that name the YAML path and line."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from textwrap import dedent

import pydantic
import pytest

from bulkrelay.errors import ConfigInvalid, NotFound, Problem
from bulkrelay.job import config as job_config
from bulkrelay.job.config import (
    ExecutionConfig,
    HaltConfig,
    JobConfig,
    JsonField,
    JsonValue,
    ResponseConfig,
    RetryConfig,
    config_semantic_dict,
    load_job,
    parse_job,
)
from bulkrelay.relay.retry import RetryPolicy
from bulkrelay.relay.transport.base import TransportSettings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "alpha" / "basic.yaml"

MINIMAL = """\
version: 1
request:
  method: POST
  url: https://api.example.com/v1/customers
  json:
    email: { from: email }
"""


def _parse(text: str) -> JobConfig:
    return parse_job(dedent(text), file="job.yaml")


def _problems(text: str) -> list[Problem]:
    with pytest.raises(ConfigInvalid) as caught:
        _parse(text)
    assert caught.value.code == "CONFIG_INVALID"
    return caught.value.problems


def _only_problem(text: str) -> Problem:
    problems = _problems(text)
    assert len(problems) == 1, problems
    return problems[0]


def test_defaults() -> None:
    config = _parse(MINIMAL)
    assert config.version == 1
    assert config.input.file is None and config.input.delimiter == ","
    assert config.response.success_statuses is None
    assert config.response.failure_body_bytes == 2048
    execution = config.execution
    assert execution.concurrency == 8 and execution.rate_limit is None and execution.http2 is False
    assert execution.timeout.connect_seconds == 10 and execution.timeout.pool_seconds == 5
    assert execution.idle_timeout_seconds == 300 and execution.max_lifetime_seconds == 604800
    assert config.retry.max_attempts == 1
    assert config.retry.statuses == (408, 425, 429, 500, 502, 503, 504)
    assert config.retry.respect_retry_after is True and config.retry.jitter_ratio == 0.2
    assert config.halt.on_statuses == (401, 403) and config.halt.consecutive_failures == 100


def test_the_design_example_loads() -> None:
    config = _parse(
        """\
        version: 1
        name: nightly-customers
        input:
          file: customers.csv
          format: csv
          key: customer_id
        request:
          method: POST
          url: "https://api.example.com/v1/customers/{customer_id}"
          query: { source: migration }
          headers:
            Authorization: "Bearer ${API_TOKEN}"
          json:
            email: { from: email }
            source: { value: migration }
            address: { city: { from: city } }
            age: { from: age, type: integer }
          idempotency_key: { header: Idempotency-Key }
        response:
          success_statuses: [200, 201, 202, 204]
          capture: { remote_id: /id }
        execution:
          concurrency: 8
          timeout: { connect_seconds: 10, read_seconds: 30, write_seconds: 30, pool_seconds: 5 }
          rate_limit: { requests_per_second: 10 }
          idle_timeout_seconds: 300
          max_lifetime_seconds: 604800
        retry:
          max_attempts: 1
          statuses: [408, 425, 429, 500, 502, 503, 504]
          initial_backoff_seconds: 1
          max_backoff_seconds: 30
          jitter_ratio: 0.2
          respect_retry_after: true
        halt:
          on_statuses: [401, 403]
          consecutive_failures: 100
        """
    )
    body = config.request.json_
    assert isinstance(body, dict)
    assert body["email"] == JsonField.model_validate({"from": "email"})
    assert body["source"] == JsonValue(value="migration")
    assert body["address"] == {"city": JsonField.model_validate({"from": "city"})}
    age = body["age"]
    assert isinstance(age, JsonField) and age.type == "integer" and not age.has_default
    assert config.request.idempotency_key is not None
    assert config.request.idempotency_key.header == "Idempotency-Key"
    assert config.response.capture == {"remote_id": "/id"}
    assert config.execution.rate_limit is not None
    assert config.execution.rate_limit.requests_per_second == 10


def test_the_alpha_example_loads_unchanged() -> None:
    job = load_job(EXAMPLE)
    assert job.path == EXAMPLE
    assert job.base_dir == EXAMPLE.parent
    assert job.input_path == EXAMPLE.parent / "customers.csv"
    assert job.input_path.exists()
    assert job.config.request.method == "POST"
    assert job.config.execution.concurrency == 8  # ours, not the alpha's 1 (docs/migrating.md)
    assert job.config.retry.max_attempts == 1
    assert job.deprecations == ()


def test_missing_job_file_is_not_found(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(NotFound) as caught:
        load_job(missing)
    assert str(missing) in caught.value.message
    assert caught.value.exit_code == 5


def test_a_job_file_that_is_a_directory_says_so(tmp_path: Path) -> None:
    # Still no job file there (exit 5), but "not found" would send the user looking for a missing path.
    (tmp_path / "job.yaml").mkdir()
    with pytest.raises(NotFound) as caught:
        load_job(tmp_path / "job.yaml")
    assert caught.value.message == f"job file is a directory: {tmp_path / 'job.yaml'}"
    assert caught.value.exit_code == 5


def test_input_path_is_relative_to_the_job_file(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    job_file = tmp_path / "jobs" / "job.yaml"
    job_file.write_text(MINIMAL + "input: { file: data/rows.jsonl }\n")
    assert load_job(job_file).input_path == tmp_path / "jobs" / "data" / "rows.jsonl"


def test_unknown_key_names_path_and_line_and_suggests() -> None:
    problem = _only_problem(MINIMAL + "execution:\n  concurency: 4\n")
    assert problem.path == "execution.concurency"
    assert problem.line == 8
    assert "unknown key 'concurency'" in problem.message
    assert "did you mean 'concurrency'" in problem.message
    assert problem.file == "job.yaml"


@pytest.mark.parametrize(
    ("section", "where"),
    [
        ("retry:\n  timeout: { read_seconds: 3 }\n", "execution"),
        ("request:\n  timeout: 3\n", "execution"),
        ("execution:\n  timeout: { connect_seconds: 1, statuses: [500] }\n", "retry"),
        ("halt:\n  max_attempts: 3\n", "retry"),
    ],
)
def test_a_key_valid_elsewhere_is_never_its_own_suggestion(section: str, where: str) -> None:
    text = MINIMAL.replace("request:\n", "request:\n  query: { a: b }\n") + section
    if section.startswith("request:"):
        text = MINIMAL + section.removeprefix("request:\n")
    problem = _only_problem(text)
    key = problem.path.rsplit(".", 1)[-1] if problem.path else "?"
    assert f"unknown key {key!r}" in problem.message
    assert f"did you mean {key!r}" not in problem.message
    assert f"belongs in {where}" in problem.message, problem.message


def test_a_suggestion_comes_from_the_keys_of_its_own_level() -> None:
    problem = _only_problem(MINIMAL + "retry:\n  max_atempts: 3\n")
    assert "did you mean 'max_attempts'" in problem.message
    leaf = _only_problem(MINIMAL + "    age: { from: age, tpye: integer }\n")
    assert "did you mean 'type'" in leaf.message


def test_unknown_key_inside_a_json_leaf() -> None:
    problem = _only_problem(MINIMAL + "    age: { from: age, tyep: integer }\n")
    assert problem.path == "request.json.age.tyep"
    assert problem.line == 7


def test_duplicate_key_is_an_error_with_its_line() -> None:
    problem = _only_problem(MINIMAL.replace("  method: POST\n", "  method: POST\n  method: PUT\n"))
    assert problem.line == 4
    assert "duplicate key 'method'" in problem.message


def test_wrong_type_names_path_line_and_value() -> None:
    problem = _only_problem(MINIMAL + "execution:\n  concurrency: '8'\n")
    assert problem.path == "execution.concurrency"
    assert problem.line == 8
    assert "valid integer" in problem.message and "'8'" in problem.message


@pytest.mark.parametrize("name", ["Content-Length", "transfer-encoding", "Connection", "Expect"])
def test_a_framing_header_is_the_transports_to_set(name: str) -> None:
    """A job's Content-Length or Transfer-Encoding contradicted the bytes sent (a request cut short, or a
    target reading the next request's bytes as this one's body)."""
    text = MINIMAL.replace("  json:", f"  headers:\n    {name}: '9'\n  json:")
    problem = _only_problem(text)
    assert (problem.path, problem.line) == (f"request.headers.{name}", 6), problem
    assert "the transport's to set" in problem.message
    assert _problems_or_none(text.replace(name, "Host")) == []  # a virtual host's: the job's to set


def _problems_or_none(text: str) -> list[Problem]:
    try:
        _parse(text)
    except ConfigInvalid as refused:
        return refused.problems
    return []


@pytest.mark.parametrize(
    ("results", "words"),
    [
        ("{to: 'sqlite:///'}", "names no database file"),
        ("{to: 'sqlite://'}", "names no database file"),
        ("{to: 'sqlite:///r.db', table: sqlite_master}", "its own catalog tables"),
        ("{to: 'postgresql://db/x', table: pg_catalog.pg_class}", "its own catalog tables"),
    ],
)
def test_a_results_sink_that_could_never_be_written_is_refused_when_the_job_is_loaded(
    results: str, words: str
) -> None:
    """Known from the job file alone: it was a SINK_UNAVAILABLE warning of every run instead, telling
    the user a later run would catch the sink up."""
    problem = _only_problem(MINIMAL + f"results: {results}\n")
    assert problem.path == "results" and words in problem.message, problem


def test_booleans_are_not_integers() -> None:
    problem = _only_problem(MINIMAL + "retry:\n  max_attempts: true\n")
    assert problem.path == "retry.max_attempts" and "integer" in problem.message


def test_unquoted_date_is_refused() -> None:
    problem = _only_problem(MINIMAL + "name: 2026-01-01\n")
    assert problem.line == 7 and problem.path == "name" and "date" in problem.message


def test_infinite_rate_is_refused() -> None:
    problem = _only_problem(MINIMAL + "execution:\n  rate_limit: { requests_per_second: .inf }\n")
    assert problem.line == 8 and "finite" in problem.message


@pytest.mark.parametrize(
    ("section", "path"),
    [
        ("execution:\n  timeout: { read_seconds: %s }\n", "execution.timeout.read_seconds"),
        ("execution:\n  max_lifetime_seconds: %s\n", "execution.max_lifetime_seconds"),
        ("execution:\n  idle_timeout_seconds: %s\n", "execution.idle_timeout_seconds"),
        ("retry:\n  max_backoff_seconds: %s\n", "retry.max_backoff_seconds"),
        ("retry:\n  max_retry_after_seconds: %s\n", "retry.max_retry_after_seconds"),
    ],
)
def test_seconds_longer_than_36500_days_are_refused(section: str, path: str) -> None:
    longest = 36500 * 86_400
    _parse(MINIMAL + section % longest)  # the longest duration itself is fine
    problem = _only_problem(MINIMAL + section % (longest + 1))
    assert problem.path == path and problem.line == 8
    assert f"less than or equal to {longest}" in problem.message


def test_a_rate_beyond_a_million_per_second_is_refused() -> None:
    problem = _only_problem(MINIMAL + "execution:\n  rate_limit: { requests_per_second: 1000001 }\n")
    assert problem.path == "execution.rate_limit.requests_per_second"
    assert "less than or equal to 1000000" in problem.message


def _shared_limit(url: str) -> str:
    return f'execution:\n  rate_limit: {{ requests_per_second: 5, shared: "{url}" }}\n'


@pytest.mark.parametrize(
    "url",
    [
        "redis://:s3cr#hunter2@127.0.0.1:6379/0",
        "redis://:s3cr?hunter2@127.0.0.1:6379/0",
        "redis://user:s3cr/hunter2@127.0.0.1:6379/0",
        "rediss://:s3cr@x#hunter2@127.0.0.1:6379",
    ],
    ids=["hash", "question-mark", "slash", "at-then-hash"],
)
def test_a_redis_password_not_percent_encoded_is_refused_unshown(url: str) -> None:
    # redis-py would read 's3cr' as the host's port and name it in its error, and the URL shown with its
    # credentials hidden kept what followed the '#', '?' or '/': the password in the envelope and run.log
    problem = _only_problem(MINIMAL + _shared_limit(url))
    assert problem.path == "execution.rate_limit.shared" and problem.line == 8
    assert "percent-encoded" in problem.message
    assert "s3cr" not in problem.message and "hunter2" not in problem.message


def test_a_percent_encoded_redis_password_is_a_redis_url() -> None:
    url = "redis://user:pa%23ss%2F%3F%40@127.0.0.1:6379/0?db=0"
    config = _parse(MINIMAL + _shared_limit(url))
    assert config.execution.rate_limit is not None and config.execution.rate_limit.shared == url


def test_missing_required_key_points_at_parent() -> None:
    problem = _only_problem("version: 1\nrequest:\n  method: GET\n")
    assert problem.path == "request.url"
    assert problem.line == 2
    assert "missing required key 'url'" in problem.message


def test_missing_request_and_version() -> None:
    problems = _problems("name: x\n")
    assert {p.path for p in problems} == {"version", "request"}


def test_wrong_version() -> None:
    problem = _only_problem(MINIMAL.replace("version: 1", "version: 2"))
    assert problem.path == "version" and problem.line == 1


def test_list_index_in_path() -> None:
    problem = _only_problem(MINIMAL + "retry:\n  statuses: [500, 99]\n")
    assert problem.path == "retry.statuses[1]" and problem.line == 8


def test_json_form_body_are_exclusive() -> None:
    problem = _only_problem(MINIMAL + "  form: { a: b }\n")
    assert "exactly one of json, form, body" in problem.message
    assert problem.path == "request"


def test_no_body_is_allowed_for_get_and_delete() -> None:
    config = _parse("version: 1\nrequest: { method: delete, url: 'https://x.test/c/{id}' }\n")
    assert config.request.method == "DELETE"
    assert config.request.json_ is None and config.request.form is None and config.request.body is None


def test_body_needs_content_type() -> None:
    text = "version: 1\nrequest:\n  method: PUT\n  url: https://x.test/\n  body: '{id}'\n"
    assert "content_type" in _only_problem(text).message
    config = _parse(text + "  content_type: text/csv\n")
    assert config.request.body == "{id}" and config.request.content_type == "text/csv"


def test_form_values() -> None:
    text = "version: 1\nrequest:\n  method: POST\n  url: https://x.test/\n"
    config = _parse(text + "  form: { name: '{first} {last}', id: { from: id }, n: 5 }\n")
    assert config.request.form is not None
    assert config.request.form["name"] == "{first} {last}"
    assert config.request.form["n"] == "5"
    problem = _only_problem(text + "  form: { bad: [1] }\n")
    assert problem.path == "request.form.bad"


def test_json_leaf_shapes() -> None:
    problem = _only_problem(MINIMAL + "    plain: text\n")
    assert problem.path == "request.json.plain"
    assert "{from: FIELD}" in problem.message
    # The json mapping has a key named "from" (not a string), so it is still an object.
    config = _parse(MINIMAL + "    from: { from: sender }\n    amount: { value: { from: x } }\n")
    body = config.request.json_
    assert isinstance(body, dict)
    assert body["from"] == JsonField.model_validate({"from": "sender"})
    assert body["amount"] == JsonValue(value={"from": "x"})


def test_json_root_may_be_a_single_field() -> None:
    text = (
        "version: 1\nrequest:\n  method: POST\n  url: https://x.test/\n"
        "  json: { from: payload, type: json }\n"
    )
    config = _parse(text)
    assert isinstance(config.request.json_, JsonField)


def test_json_value_with_secret_is_refused() -> None:
    problem = _only_problem(MINIMAL + "    token: { value: '${API_TOKEN}' }\n")
    assert problem.path == "request.json.token" and "literal" in problem.message


def test_default_must_fit_type() -> None:
    problem = _only_problem(MINIMAL + "    age: { from: age, type: integer, default: 'x' }\n")
    assert problem.path == "request.json.age" and "not a valid integer" in problem.message
    config = _parse(MINIMAL + "    age: { from: age, type: integer, default: null }\n")
    assert isinstance(config.request.json_, dict)
    age = config.request.json_["age"]
    assert isinstance(age, JsonField) and age.has_default and age.default is None


def test_an_integer_default_must_fit_signed_64_bit() -> None:
    problem = _only_problem(MINIMAL + "    age: { from: age, type: integer, default: 9223372036854775808 }\n")
    assert problem.path == "request.json.age.default" and "signed 64-bit" in problem.message
    assert _parse(MINIMAL + "    age: { from: age, type: integer, default: -9223372036854775808 }\n")


def test_bad_template_names_path_and_column() -> None:
    problem = _only_problem(MINIMAL.replace("customers", "customers/{id"))
    assert problem.path == "request.url" and problem.line == 4
    assert "unclosed '{'" in problem.message and "column" in problem.message


def test_url_must_be_absolute() -> None:
    problem = _only_problem(MINIMAL.replace("https://api.example.com", "api.example.com"))
    assert "http:// or https://" in problem.message
    assert _parse(MINIMAL.replace("https://api.example.com", "${API_BASE}")).request.url.startswith("${")


def test_header_rules() -> None:
    twice = _only_problem(MINIMAL + "  headers: { X-A: a, x-a: b }\n")
    assert "twice" in twice.message
    bad_name = _only_problem(MINIMAL + "  headers: { 'Bad Header': a }\n")
    assert "header name" in bad_name.message
    config = _parse(MINIMAL + "  headers: { X-Page-Size: 100 }\n")
    assert config.request.headers == {"X-Page-Size": "100"}
    clash = _only_problem(MINIMAL + "  headers: { Idem: a }\n  idempotency_key: { header: idem }\n")
    assert "idempotency_key" in clash.message


def test_header_text_the_transport_refuses_is_a_config_error() -> None:
    control = _only_problem(MINIMAL + '  headers: { X-A: "a\\x01b" }\n')
    assert control.path == "request.headers.X-A" and "control character U+0001" in control.message
    line_break = _only_problem(MINIMAL + '  headers: { X-A: "a\\nb" }\n')
    assert "line break U+000A" in line_break.message


def test_a_url_the_transport_cannot_send_is_a_config_error() -> None:
    for url in ("http://exa mple.com/{id}", "http://[::1/{id}", "http://h:99999/{id}"):
        problem = _only_problem(MINIMAL.replace("https://api.example.com/v1/customers", f'"{url}"'))
        assert problem.path == "request.url" and "cannot send this URL" in problem.message, url


def test_capture_pointer_syntax() -> None:
    problem = _only_problem(MINIMAL + "response:\n  capture: { id: 'data.id' }\n")
    assert problem.path == "response.capture.id" and "JSON pointer" in problem.message
    assert (
        _parse(MINIMAL + "response:\n  capture: { a: '', b: /a~1b/0 }\n").response.capture["b"] == "/a~1b/0"
    )


def test_input_format_and_delimiter() -> None:
    assert _parse(MINIMAL + "input: { format: ndjson }\n").input.format == "jsonl"
    assert _parse(MINIMAL + "input: { delimiter: ';' }\n").input.delimiter == ";"
    problem = _only_problem(MINIMAL + "input: { format: jsonl, delimiter: ';' }\n")
    assert "CSV input only" in problem.message and problem.path == "input"
    assert _only_problem(MINIMAL + "input: { encoding: latin-1 }\n").path == "input.encoding"


def test_retry_backoff_order_and_ranges() -> None:
    assert (
        "max_backoff"
        in _only_problem(MINIMAL + "retry: { initial_backoff_seconds: 5, max_backoff_seconds: 1 }\n").message
    )
    assert _only_problem(MINIMAL + "execution: { concurrency: 0 }\n").path == "execution.concurrency"
    assert _only_problem(MINIMAL + "retry: { jitter_ratio: 1.5 }\n").path == "retry.jitter_ratio"
    assert "twice" in _only_problem(MINIMAL + "halt: { on_statuses: [401, 401] }\n").message


def test_python_field_names_are_not_keys() -> None:
    assert _only_problem(MINIMAL.replace("json:", "json_:")).path == "request.json_"
    assert _only_problem(MINIMAL.replace("from: email", "from_: email")).path == "request.json.email.from_"


def test_models_are_frozen() -> None:
    config = _parse(MINIMAL)
    with pytest.raises(ValueError, match="frozen"):
        config.execution.concurrency = 2  # type: ignore[misc]


def test_problems_are_listed_in_line_order() -> None:
    problems = _problems(MINIMAL + "execution:\n  concurency: 4\nretry:\n  max_attemps: 2\nname: 5\n")
    assert [p.line for p in problems] == sorted(p.line or 0 for p in problems)
    assert len(problems) == 3


def test_not_a_mapping() -> None:
    assert "mapping" in _only_problem("- 1\n- 2\n").message
    assert "mapping" in _only_problem("").message


def test_semantic_dict_ignores_name_and_input_file_only() -> None:
    base = config_semantic_dict(_parse(MINIMAL + "name: a\ninput: { file: a.csv, key: id }\n"))
    renamed = config_semantic_dict(_parse(MINIMAL + "name: b\ninput: { file: moved/a.csv, key: id }\n"))
    assert base == renamed
    assert "name" not in base and "file" not in base["input"]
    assert base["input"]["key"] == "id"
    assert base["request"]["json"] == {"email": {"from": "email", "type": None}}
    other_key = config_semantic_dict(_parse(MINIMAL + "input: { file: a.csv, key: email }\n"))
    assert other_key != base
    faster = config_semantic_dict(
        _parse(MINIMAL + "name: a\ninput: { file: a.csv, key: id }\nexecution: { concurrency: 9 }\n")
    )
    assert faster != base


def test_semantic_dict_is_the_same_for_explicit_defaults() -> None:
    explicit = (
        MINIMAL
        + "execution: { concurrency: 8, timeout: { connect_seconds: 10.0 } }\nretry: { max_attempts: 1 }\n"
    )
    assert config_semantic_dict(_parse(MINIMAL)) == config_semantic_dict(_parse(explicit))


def test_semantic_dict_distinguishes_a_null_default_from_none() -> None:
    with_default = _parse(MINIMAL + "    age: { from: age, default: null }\n")
    without = _parse(MINIMAL + "    age: { from: age }\n")
    assert config_semantic_dict(with_default) != config_semantic_dict(without)


def test_secrets_in_headers_stay_placeholders_in_the_semantic_dict() -> None:
    data = config_semantic_dict(_parse(MINIMAL + "  headers: { Authorization: 'Bearer ${API_TOKEN}' }\n"))
    assert data["request"]["headers"] == {"Authorization": "Bearer ${API_TOKEN}"}


def test_the_defaults_live_in_config_and_the_relay_uses_them() -> None:
    """One home per default: the retry policy and the transport take config's constants, not copies."""
    policy_defaults = {f.name: f.default for f in dataclasses.fields(RetryPolicy)}
    assert policy_defaults["max_attempts"] is job_config.DEFAULT_MAX_ATTEMPTS == RetryConfig().max_attempts
    assert policy_defaults["statuses"] is job_config.DEFAULT_RETRY_STATUSES == RetryConfig().statuses
    assert policy_defaults["halt_statuses"] is job_config.DEFAULT_HALT_STATUSES == HaltConfig().on_statuses
    assert policy_defaults["initial_backoff_seconds"] == RetryConfig().initial_backoff_seconds
    assert policy_defaults["max_backoff_seconds"] == RetryConfig().max_backoff_seconds
    assert policy_defaults["jitter_ratio"] == RetryConfig().jitter_ratio
    assert policy_defaults["respect_retry_after"] is RetryConfig().respect_retry_after
    transport_defaults = {f.name: f.default for f in dataclasses.fields(TransportSettings)}
    assert transport_defaults["max_body_bytes"] is job_config.MAX_BODY_BYTES
    assert transport_defaults["client"] is job_config.DEFAULT_CLIENT == ExecutionConfig().client
    assert transport_defaults["proxy"] is job_config.DEFAULT_PROXY == ExecutionConfig().proxy
    # a failure body is cut from what the transport read: it can never ask for more
    with pytest.raises(pydantic.ValidationError):
        ResponseConfig(failure_body_bytes=job_config.MAX_BODY_BYTES + 1)
    largest = ResponseConfig(failure_body_bytes=job_config.MAX_BODY_BYTES)
    assert largest.failure_body_bytes == job_config.MAX_BODY_BYTES


def test_an_empty_json_body_is_refused_at_its_line() -> None:
    problem = _only_problem(MINIMAL.replace("  json:\n    email: { from: email }\n", "  json: {}\n"))
    assert problem.path == "request.json"
    assert problem.line == 5
    assert "is empty" in problem.message


@pytest.mark.parametrize("statuses", ["[200, 503]", "[503, 204]"])
def test_retrying_a_success_is_refused_naming_the_status(statuses: str) -> None:
    problem = _only_problem(MINIMAL + f"retry:\n  statuses: {statuses}\n")
    assert problem.path == "retry.statuses"
    success = next(s for s in ("200", "204") if s in statuses)
    assert f"names {success}: a 2xx is a success" in problem.message


@pytest.mark.parametrize(
    "proxy",
    [
        "http://proxy:99999",
        "http://proxy:abc",
        "http://u:s3cret@:3128",
        "http://[::1",
        "https://x:0",
        "http://%zz",
    ],
)
def test_a_proxy_url_neither_client_can_use_is_refused_at_its_line(proxy: str) -> None:
    """The URL's shape is not enough: a client built with it raised ValueError (a traceback, exit 1)."""
    problem = _only_problem(MINIMAL + f"execution:\n  proxy: '{proxy}'\n")
    assert (problem.path, problem.line) == ("execution.proxy", 8)
    assert "s3cret" not in problem.message


@pytest.mark.parametrize(
    "proxy",
    ["http://proxy.internal:3128", "https://u:p%40ss@proxy:8443/", "socks5h://[::1]:1080", "http://10.0.0.1"],
)
def test_proxy_urls_both_clients_use_are_accepted(proxy: str) -> None:
    assert _parse(MINIMAL + f"execution:\n  proxy: '{proxy}'\n").execution.proxy == proxy


def test_notify_on_must_name_at_least_one_ending() -> None:
    problem = _only_problem(MINIMAL + 'notify:\n  - on: []\n    webhook: "${HOOK}"\n')
    assert (problem.line, problem.path) == (8, "notify[0].on")
    assert "success, failure or halt" in problem.message


def test_notify_written_as_documented_is_read() -> None:
    config = _parse(MINIMAL + 'notify:\n  - on: [failure, halt]\n    webhook: "${HOOK}"\n    format: slack\n')
    assert config.notify[0].on == ("failure", "halt") and config.notify[0].format == "slack"
