"""`.bulkrelay/config.yaml`: operational defaults, apart from any job file.

    retention:
      keep: 14          # finished runs of each job to keep, newest first
      older_than: 30d   # and only remove those older than this

The file is optional and strict like a job file (unknown or duplicate keys are errors naming the line).
Nothing here is part of a run's fingerprint: changing retention never blocks a resume.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from bulkrelay.errors import ConfigInvalid, Problem, UsageError
from bulkrelay.job.config import _problems as validation_problems
from bulkrelay.job.durations import parse_duration_ms
from bulkrelay.job.yamlload import load_yaml

SETTINGS_FILE = Path(".bulkrelay") / "config.yaml"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class Retention(_Model):
    """What `prune` keeps: at least the newest `keep` finished runs of each job, and any run younger
    than `older_than`. Either may be left out; with neither, nothing is removed."""

    keep: Annotated[int, Field(ge=1)] | None = None
    older_than: str | None = None  # a duration: 30d, 12h, ...

    @field_validator("older_than")
    @classmethod
    def _duration(cls, text: str | None) -> str | None:
        if text is not None:
            try:
                parse_duration_ms(text, what="older_than")
            except UsageError as exc:
                raise ValueError(exc.message) from None
        return text

    @property
    def older_than_seconds(self) -> float | None:
        return None if self.older_than is None else parse_duration_ms(self.older_than) / 1000

    @property
    def active(self) -> bool:
        return self.keep is not None or self.older_than is not None


class Settings(_Model):
    retention: Retention = Retention()


def load_settings(path: Path | None = None) -> Settings:
    """The settings in `path` (default `./.bulkrelay/config.yaml`); defaults when it does not exist."""
    path = path or SETTINGS_FILE
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (FileNotFoundError, NotADirectoryError):
        return Settings()
    except (UnicodeDecodeError, OSError) as exc:
        raise ConfigInvalid([Problem(f"cannot read settings: {exc}", file=str(path))]) from None
    raw, lines = load_yaml(text, str(path))
    if raw is None:
        return Settings()  # an empty file: every default
    if not isinstance(raw, dict):
        problem = Problem("the settings file is a mapping (retention: ...)", file=str(path), line=1)
        raise ConfigInvalid([problem])
    try:
        return Settings.model_validate(raw)
    except ValidationError as exc:
        raise ConfigInvalid(validation_problems(exc, raw, lines, str(path))) from None


def retention_from_flags(keep: int | None, older_than: str | None) -> Retention:
    """The rule `prune --keep N --older-than AGE` states; a bad value is a usage error naming the flag."""
    if keep is not None and keep < 1:
        raise UsageError(f"--keep {keep}: keep at least 1 run of each job", suggestion="--keep 1")
    if older_than is not None:
        parse_duration_ms(older_than, what="--older-than")
    return Retention(keep=keep, older_than=older_than)
