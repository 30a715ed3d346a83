"""What `request.auth`'s signing kinds need from the job, checked once when it is read (before any row).

SigV4 signs with botocore, an optional extra: a job that asks for it without botocore installed is
refused (exit 2) naming `bulkrelay[aws]`.

The keys of `request.auth.hmac` are read from its `${NAME}` secrets. A Standard Webhooks secret is
written `whsec_<base64>`: for that scheme its key is the decoded bytes (a value that is not base64 after
the prefix is refused, naming the variable, before any row). Any other secret is used
as its UTF-8 bytes (GitHub's and most in-house schemes). A list of secrets (a rotation) gives a list
of keys, each signing every attempt.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from importlib.util import find_spec

from bulkrelay.errors import ConfigInvalid, Problem, SecretInvalid
from bulkrelay.job.config import HmacConfig
from bulkrelay.job.template import compile_template

_WEBHOOK_PREFIX = "whsec_"


def hmac_keys(config: HmacConfig, secrets: Mapping[str, str]) -> tuple[bytes, ...]:
    """One key per secret, in the order the job lists them."""
    webhooks = config.scheme == "standard_webhooks"
    return tuple(_key(text, secrets, webhooks) for text in config.secrets)


def _key(text: str, secrets: Mapping[str, str], webhooks: bool) -> bytes:
    value = compile_template(text).bind(secrets).constant
    assert value is not None  # a ${NAME} alone: the job file refuses a {field} here
    if not (webhooks and value.startswith(_WEBHOOK_PREFIX)):
        return value.encode()
    try:
        key = base64.b64decode(value.removeprefix(_WEBHOOK_PREFIX), validate=True)
    except binascii.Error:
        raise _not_a_key(text, "the rest is not base64") from None
    if not key:  # an HMAC with an empty key is no secret: anyone could sign
        raise _not_a_key(text, "nothing follows it (an empty key)")
    return key


def _not_a_key(text: str, why: str) -> SecretInvalid:
    names = sorted(compile_template(text).secrets)
    return SecretInvalid(
        f"request.auth.hmac.secret: {', '.join(names)} starts with whsec_ but {why}",
        context={"invalid": names},
        suggestion="set it to the secret exactly as the webhook's sender shows it (whsec_ then base64)",
    )


def require_botocore() -> None:
    """`request.auth.aws_sigv4` needs botocore (the `aws` extra)."""
    if find_spec("botocore") is None:
        message = (
            "aws_sigv4 signs with botocore, which is not installed: "
            "install the extra, `pip install 'bulkrelay[aws]'` (or `uv sync --extra aws` in a clone)"
        )
        raise ConfigInvalid([Problem(message, path="request.auth.aws_sigv4")])
