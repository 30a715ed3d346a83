"""Reading a small JSON state file field by field: a missing or mistyped field is refused naming the
file and the field (dotted when nested), so no later step meets a `KeyError` or a `TypeError`.

The typed records of the state files read through it (`store/manifest.py`: `run.json`;
`background/state.py`: a background job's spec, status and result); each names the error a bad
file is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bulkrelay.errors import BulkRelayError


class JsonFields:
    """One JSON object of a state file, read field by field."""

    def __init__(
        self,
        path: Path,
        data: object,
        invalid: type[BulkRelayError],
        prefix: str = "",
        suggestion: str | None = None,
    ) -> None:
        self._path, self._invalid, self._prefix, self._suggestion = path, invalid, prefix, suggestion
        if not isinstance(data, dict):
            raise self.refuse(prefix.rstrip(".") or "(top level)", "an object", data)
        self._data: dict[str, Any] = data

    def refuse(self, field: str, want: str, value: object) -> BulkRelayError:
        """The error for `field`, which is not `want`."""
        shown = "missing" if value is None else repr(value)
        return self._invalid(
            f"{self._path}: its field {field!r} must be {want}, got {shown}",
            context={"path": str(self._path), "field": field},
            suggestion=self._suggestion,
        )

    def has(self, name: str) -> bool:
        return name in self._data

    def _get(self, name: str, kinds: tuple[type, ...], want: str, *, optional: bool) -> Any:
        value = self._data.get(name)
        if value is None and optional:
            return None
        # bool is an int subclass: refuse it where a number is expected.
        if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
            raise self.refuse(self._prefix + name, want, value)
        return value

    def text(self, name: str) -> str:
        return str(self._get(name, (str,), "a string", optional=False))

    def optional_text(self, name: str) -> str | None:
        value = self._get(name, (str,), "a string or null", optional=True)
        return None if value is None else str(value)

    def integer(self, name: str) -> int:
        return int(self._get(name, (int,), "an integer", optional=False))

    def optional_integer(self, name: str) -> int | None:
        value = self._get(name, (int,), "an integer or null", optional=True)
        return None if value is None else int(value)

    def number(self, name: str) -> float:
        return float(self._get(name, (int, float), "a number", optional=False))

    def optional_number(self, name: str) -> float | None:
        value = self._get(name, (int, float), "a number or null", optional=True)
        return None if value is None else float(value)

    def flag(self, name: str) -> bool:
        return bool(self._get(name, (bool,), "true or false", optional=False))

    def texts(self, name: str) -> list[str]:
        value = self._get(name, (list,), "a list of strings", optional=False)
        if not all(isinstance(item, str) for item in value):
            raise self.refuse(self._prefix + name, "a list of strings", value)
        return list(value)

    def objects(self, name: str) -> list[dict[str, Any]]:
        value = self._get(name, (list,), "a list of objects", optional=False)
        if not all(isinstance(item, dict) for item in value):
            raise self.refuse(self._prefix + name, "a list of objects", value)
        return list(value)

    def text_map(self, name: str) -> dict[str, str] | None:
        value = self._get(name, (dict,), "an object of strings or null", optional=True)
        if value is not None and not all(isinstance(item, str) for item in value.values()):
            raise self.refuse(self._prefix + name, "an object of strings", value)
        return None if value is None else dict(value)

    def raw_object(self, name: str, *, optional: bool = False) -> dict[str, Any] | None:
        """An object passed through as it is (an envelope, a progress snapshot): checked to be one."""
        value = self._get(name, (dict,), "an object" + (" or null" if optional else ""), optional=optional)
        return None if value is None else dict(value)

    def block(self, name: str) -> JsonFields:
        return JsonFields(
            self._path, self._data.get(name), self._invalid, f"{self._prefix}{name}.", self._suggestion
        )

    def optional_block(self, name: str) -> JsonFields | None:
        return None if self._data.get(name) is None else self.block(name)
