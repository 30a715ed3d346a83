"""The key and JWT assertions of OAuth2 `jwt_bearer` / `private_key_jwt` (job/assertion.py, job/oauth2.py):
keys refused before any row naming where they were looked for; each assertion checked by the demo token
endpoint's own verifier (demo/oauth.py, `cryptography` alone)."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from bulkrelay.demo.oauth import assertion_problem
from bulkrelay.errors import ConfigInvalid, ExitCode
from bulkrelay.job.assertion import ASSERTION_SECONDS, load_key
from bulkrelay.job.config import parse_job
from bulkrelay.job.oauth2 import JWT_BEARER, bind_token_request
from tests.clirun import run_cli

_PKCS8 = serialization.PrivateFormat.PKCS8


def _pem(
    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey,
    password: bytes | None = None,
) -> str:
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, _PKCS8, encryption).decode()


def _public(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


RSA = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC = ec.generate_private_key(ec.SECP256R1())
RSA_OTHER = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _oauth2(**keys: str) -> str:
    lines = "".join(f"\n      {name}: {value!r}" for name, value in keys.items())
    return f"""
version: 1
request:
  method: POST
  url: "https://api.example.com/items"
  auth:
    oauth2:
      token_url: "https://login.example.com/services/oauth2/token"
      client_id: "${{CID}}"{lines}
"""


@pytest.mark.parametrize(("key", "algorithm"), [(RSA, "RS256"), (EC, "ES256")])
def test_jwt_bearer_with_private_key_jwt_posts_two_fresh_assertions_the_endpoint_accepts(
    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey, algorithm: str
) -> None:
    text = _oauth2(
        grant="jwt_bearer",
        client_auth="private_key_jwt",
        private_key="${KEY}",
        subject="integration@example.com",
        audience="https://login.example.com",
    )
    config = parse_job(text, file="job.yaml").request.auth
    assert config is not None and config.oauth2 is not None
    request = bind_token_request(config.oauth2, {"CID": "client-7", "KEY": _pem(key)})
    assert request.key is not None and request.key.algorithm == algorithm
    learnt: list[str] = []
    first, second = (
        dict(parse_qsl((request.prepared(learnt.append).body or b"").decode())) for _ in range(2)
    )
    assert first["grant_type"] == JWT_BEARER and first["client_id"] == "client-7"
    public = _public(key)
    audience = "https://login.example.com"
    assert (
        assertion_problem(first["assertion"], public, "client-7", "integration@example.com", audience) is None
    )
    assert assertion_problem(first["client_assertion"], public, "client-7", "client-7", audience) is None
    assert len(set(learnt)) == 4 and set(learnt) >= {first["assertion"], second["client_assertion"]}
    stranger = _public(ec.generate_private_key(ec.SECP256R1()) if algorithm == "ES256" else RSA_OTHER)
    said = assertion_problem(first["assertion"], stranger, "client-7", "integration@example.com", audience)
    assert said == "bad signature"
    assert ASSERTION_SECONDS == 180


@pytest.mark.parametrize(
    ("pem", "said"),
    [
        (_pem(RSA, b"passphrase"), "the private key is encrypted"),
        (
            _pem(ed25519.Ed25519PrivateKey.generate()),
            "the private key is Ed25519: RS256 needs RSA, ES256 EC P-256",
        ),
        (_pem(ec.generate_private_key(ec.SECP384R1())), "the private key is EC on secp384r1"),
        ("not a key at all", "not a PEM private key"),
        (_public(RSA), "not a PEM private key"),
    ],
)
def test_a_key_that_cannot_sign_is_refused_naming_where_it_was_looked_for(pem: str, said: str) -> None:
    with pytest.raises(ConfigInvalid) as refused:
        load_key(pem, "$SF_PRIVATE_KEY", "private_key")
    described = refused.value.problems[0].describe()
    assert said in described and "looked for in $SF_PRIVATE_KEY" in described
    assert "request.auth.oauth2.private_key" in described
    assert "BEGIN" not in described


def test_an_unreadable_key_file_is_refused_naming_its_path(tmp_path: Path) -> None:
    text = _oauth2(grant="jwt_bearer", private_key_file="keys/sf.pem", subject="me@example.com")
    config = parse_job(text, file="job.yaml").request.auth
    assert config is not None and config.oauth2 is not None
    with pytest.raises(ConfigInvalid) as refused:
        bind_token_request(config.oauth2, {"CID": "c"}, tmp_path)
    described = refused.value.problems[0].describe()
    assert "cannot read the private key file" in described and str(tmp_path / "keys/sf.pem") in described


@pytest.mark.parametrize(
    ("keys", "said"),
    [
        ({"grant": "jwt_bearer", "subject": "me"}, "give private_key (a ${NAME}) or private_key_file"),
        ({"grant": "jwt_bearer", "private_key": "${K}"}, "grant: jwt_bearer needs subject"),
        ({"client_auth": "private_key_jwt", "private_key": "-----BEGIN"}, "must come from the environment"),
        ({"client_auth": "basic"}, "client_auth: basic needs client_secret"),
    ],
)
def test_the_job_file_refuses_an_incomplete_jwt_section(keys: dict[str, str], said: str) -> None:
    with pytest.raises(ConfigInvalid, match=None) as refused:
        parse_job(_oauth2(**keys), file="job.yaml")
    assert said in " ".join(problem.describe() for problem in refused.value.problems)


def test_aws_sigv4_without_a_region_is_refused_at_its_line() -> None:
    text = """
version: 1
request:
  method: POST
  url: "https://search.example.com/_bulk"
  auth:
    aws_sigv4: {service: es}
"""
    with pytest.raises(ConfigInvalid) as refused:
        parse_job(text, file="job.yaml")
    [problem] = refused.value.problems
    assert (
        problem.describe().startswith("job.yaml:7, request.auth.aws_sigv4") and "'region'" in problem.message
    )


def _bounded_memory() -> None:
    """In the child: at most 4 GB of address space (`ulimit -v 4000000`), so that a key file read
    without a bound fails the test instead of taking the machine's memory."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (4_000_000 * 1024, 4_000_000 * 1024))


def _key_file(tmp_path: Path, kind: str) -> str:
    if kind == "fifo":
        os.mkfifo(tmp_path / "fifo.pem")
        return "fifo.pem"
    if kind == "symlink to /dev/zero":
        (tmp_path / "zero.pem").symlink_to("/dev/zero")
        return "zero.pem"
    if kind == "directory":
        (tmp_path / "keys").mkdir()
        return "keys"
    if kind == "larger than 1 MiB":
        (tmp_path / "big.pem").write_text(_pem(RSA) + "x" * (1 << 20))
        return "big.pem"
    return kind  # a device


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("/dev/zero", "not a regular file"),
        ("/dev/urandom", "not a regular file"),
        ("symlink to /dev/zero", "not a regular file"),
        ("fifo", "not a regular file"),
        ("directory", "not a regular file"),
        ("larger than 1 MiB", "larger than 1 MiB"),
    ],
)
def test_a_key_file_that_is_no_regular_file_or_too_large_is_refused_at_its_line(
    tmp_path: Path, kind: str, said: str
) -> None:
    """`validate` neither reads a device without end (it grew to 24 GB) nor waits on a pipe forever:
    exit 2 naming the file, the job file's line and the key."""
    name = _key_file(tmp_path, kind)
    text = _oauth2(grant="jwt_bearer", private_key_file=name, subject="me@example.com")
    (tmp_path / "job.yaml").write_text(text.replace("  auth:", "  json: {id: {from: id}}\n  auth:") +
                                       "input: {file: data.csv}\n")  # fmt: skip
    (tmp_path / "data.csv").write_text("id\n1\n")
    result = run_cli(
        "--json",
        "validate",
        "job.yaml",
        cwd=tmp_path,
        env={"CID": "c"},
        timeout=60,
        preexec_fn=_bounded_memory,
    )
    assert (result.exit_code, result.error_code) == (ExitCode.ARG_ERROR, "CONFIG_INVALID"), result.envelope
    message = result.envelope["error"]["message"]
    assert said in message and "job.yaml:12, request.auth.oauth2.private_key_file" in message
    assert str(name if name.startswith("/") else tmp_path / name) in message
