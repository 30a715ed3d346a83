"""`.bulkrelay/config.yaml`: operational defaults, apart from any job file.

    retention:
      keep: 14          # finished runs of each job to keep, newest first
      older_than: 30d   # and only remove those older than this

The file is optional and strict like a job file (unknown or duplicate keys are errors naming the line,
a key close to a known one gets "did you mean"). Nothing here is part of a run's fingerprint: changing
retention never blocks a resume.

An age always carries its unit (`30d`, `12h`): `older_than: 30` (or `--older-than 30`) would be 30
seconds where every reader means 30 days, and a dry run would list runs minutes old. The flag and the
file read an age the same way (`parse_age`), so what one refuses the other refuses too.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from bulkrelay.errors import ConfigInvalid, Problem, UsageError
from bulkrelay.job.config import _problems as validation_problems
from bulkrelay.job.durations import parse_duration_ms
from bulkrelay.job.yamlload import LineMap, format_path, load_yaml

SETTINGS_FILE = Path(".bulkrelay") / "config.yaml"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


_BARE_NUMBER = re.compile(r"^\s*\d+(\.\d+)?\s*$")


def parse_age(text: str, *, what: str) -> float:
    """An age (`30d`, `12h`, `90m`, `45s`) in seconds; a bare number is a usage error saying why."""
    if _BARE_NUMBER.match(text):
        raise UsageError(
            f"{what} {text.strip()!r} has no unit; an age needs one: 30d (days), 12h (hours), 90m, 45s",
            context={"value": text},
            suggestion=f"{what} {text.strip()}d",
        )
    return parse_duration_ms(text, what=what) / 1000


class Retention(_Model):
    """What `prune` keeps: at least the newest `keep` finished runs of each job, and any run younger
    than `older_than`. Either may be left out; with neither, nothing is removed."""

    keep: Annotated[int, Field(ge=1)] | None = None
    older_than: str | None = None  # an age with its unit: 30d, 12h, ...

    @field_validator("older_than", mode="before")
    @classmethod
    def _age(cls, value: Any) -> Any:
        """`older_than: 30` is YAML's number 30: refused like `--older-than 30`, with the same words."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = str(value)
        if isinstance(value, str):
            try:
                parse_age(value, what="older_than")
            except UsageError as exc:
                raise ValueError(f"{exc.message}; write {exc.suggestion}") from None
        return value

    @property
    def older_than_seconds(self) -> float | None:
        return None if self.older_than is None else parse_age(self.older_than, what="older_than")

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
    unknown = _unknown_keys(raw, Settings, lines, str(path))
    if unknown:
        raise ConfigInvalid(unknown)
    try:
        return Settings.model_validate(raw)
    except ValidationError as exc:
        raise ConfigInvalid(validation_problems(exc, raw, lines, str(path))) from None


def _unknown_keys(
    raw: dict[Any, Any], model: type[BaseModel], lines: LineMap, file: str, at: tuple[str, ...] = ()
) -> list[Problem]:
    """The keys no settings model knows, each with the known key it is closest to ("did you mean");
    the job file's own check suggests job keys, which a settings typo is never meant to be."""
    problems: list[Problem] = []
    fields = model.model_fields
    for key, value in raw.items():
        path = (*at, str(key))
        if key not in fields:
            close = difflib.get_close_matches(str(key), sorted(fields), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(sorted(fields))})"
            message = f"unknown key {str(key)!r}{hint}"
            problems.append(Problem(message, file=file, line=lines.line(path), path=format_path(path)))
            continue
        inner = fields[key].annotation
        if isinstance(value, dict) and isinstance(inner, type) and issubclass(inner, BaseModel):
            problems.extend(_unknown_keys(value, inner, lines, file, path))
    return problems


def retention_from_flags(keep: int | None, older_than: str | None) -> Retention:
    """The rule `prune --keep N --older-than AGE` states; a bad value is a usage error naming the flag."""
    if keep is not None and keep < 1:
        raise UsageError(f"--keep {keep}: keep at least 1 run of each job", suggestion="--keep 1")
    if older_than is not None:
        parse_age(older_than, what="--older-than")
    return Retention(keep=keep, older_than=older_than)
