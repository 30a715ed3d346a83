"""The strict YAML loader for job files.

PyYAML's safe loader still accepts things that surprise an operator in a job file: a repeated key
silently wins, `2026-01-01` becomes a date, `yes`/`on` become booleans, `010` is octal, `1:30` is
ninety, `.inf` is a float, an integer may have more digits than 64 bits hold. This loader composes
the node tree itself and builds plain Python values (dict, list, str, int, float, bool, None) from
it, refusing each of those cases with the line it sits on. It also records the line of every node,
so a later validation error can point at `request.json.age` on line 14.

A mapping key is the one place a YAML 1.1 boolean word is read as written: `on:` in `notify:` is the
key `on`, as YAML 1.2 reads it, never `True` (a value `on` is still refused: write true or false).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from bulkrelay.errors import ConfigInvalid, Problem

PathPart = str | int  # a mapping key, or an index into a sequence
Path = tuple[PathPart, ...]

_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
_YAML_ONLY_TAGS = {
    "tag:yaml.org,2002:timestamp": "a YAML date or time",
    "tag:yaml.org,2002:binary": "binary data",
    "tag:yaml.org,2002:set": "a set",
    "tag:yaml.org,2002:omap": "an ordered map",
    "tag:yaml.org,2002:pairs": "a list of pairs",
    "tag:yaml.org,2002:merge": "a merge key (<<)",
    "tag:yaml.org,2002:value": "a default-value key (=)",
}
# The YAML 1.1 boolean words a plain (unquoted) mapping key stands for as text; `true`/`false` are
# booleans in YAML 1.2 too and stay refused as keys.
_WORD_KEYS = frozenset({"on", "off", "yes", "no", "y", "n"})
_PLAIN_BOOLS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_LEGACY_OCTAL = re.compile(r"[-+]?0[0-9_]+")
# The integers a job file may hold: JSON bodies, fingerprints and envelopes are written by orjson,
# which holds integers to 64 bits (signed, as documented).
INT64_RANGE = range(-(2**63), 2**63)


@dataclass(frozen=True)
class LineMap:
    """The 1-based line of every node in a document, by path (mapping keys and sequence indices)."""

    lines: dict[Path, int] = field(default_factory=dict)

    def line(self, path: Path) -> int | None:
        """The line of `path`, or of its nearest ancestor present in the document."""
        for end in range(len(path), -1, -1):
            found = self.lines.get(path[:end])
            if found is not None:
                return found
        return None


def format_path(path: Path) -> str:
    """`("request", "json", "age")` → `request.json.age`; sequence indices as `retry.statuses[2]`."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out = f"{out}.{part}" if out else part
    return out


class _StrictLoader(yaml.SafeLoader):
    """Composes nodes only; refuses anchors and aliases, which have no place in a job file."""

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.MarkedYAMLError(
                problem="anchors and aliases are not supported", problem_mark=event.start_mark
            )
        return super().compose_node(parent, index)


class _Builder:
    """Turns a composed node tree into plain values, recording lines and collecting problems."""

    def __init__(self, loader: _StrictLoader, file: str) -> None:
        self._loader = loader
        self._file = file
        self.lines: dict[Path, int] = {}
        self.problems: list[Problem] = []

    def build(self, node: Node, path: Path) -> Any:
        self.lines.setdefault(path, _line(node))
        if isinstance(node, MappingNode):
            return self._mapping(node, path)
        if isinstance(node, SequenceNode):
            if node.tag != _SEQ:
                return self._reject(node, path, _describe_tag(node.tag))
            return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
        assert isinstance(node, ScalarNode)
        return self._scalar(node, path)

    def _mapping(self, node: MappingNode, path: Path) -> Any:
        if node.tag != _MAP:
            return self._reject(node, path, _describe_tag(node.tag))
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = self._key(key_node, path)
            if key is None:
                continue
            child = (*path, key)
            if key in out:
                first = self.lines[child]
                self._problem(f"duplicate key {key!r} (first defined on line {first})", key_node, child)
                continue
            self.lines[child] = _line(key_node)
            out[key] = self.build(value_node, child)
        return out

    def _key(self, node: Node, path: Path) -> str | None:
        if isinstance(node, ScalarNode) and _is_word_key(node):
            return str(node.value)
        if not isinstance(node, ScalarNode) or node.tag != _STR:
            if isinstance(node, ScalarNode) and node.tag == "tag:yaml.org,2002:merge":
                self._problem("merge keys (<<) are not supported", node, path)
            else:
                self._problem("mapping keys must be strings; quote the key", node, path)
            return None
        return str(node.value)

    def _scalar(self, node: ScalarNode, path: Path) -> Any:
        tag, text = node.tag, node.value
        if tag == _STR:
            return text
        if tag == _NULL:
            return None
        if tag == _BOOL:
            if text not in _PLAIN_BOOLS:
                return self._reject(node, path, f"{text!r} is a YAML 1.1 boolean (write true or false)")
            return _PLAIN_BOOLS[text]
        if tag == _INT:
            if ":" in text or _LEGACY_OCTAL.fullmatch(text):
                return self._reject(node, path, f"{text!r} is a YAML 1.1 octal or base-60 number")
            number = self._loader.construct_yaml_int(node)
            if number not in INT64_RANGE:
                return self._reject(node, path, f"{text!r} is out of the signed 64-bit integer range")
            return number
        if tag == _FLOAT:
            value = self._loader.construct_yaml_float(node)
            if ":" in text or not math.isfinite(value):
                return self._reject(node, path, f"{text!r} is not a finite decimal number")
            return value
        return self._reject(node, path, _describe_tag(tag, text))

    def _reject(self, node: Node, path: Path, why: str) -> Any:
        """Record the problem; the value stands in as None so building can go on and find more."""
        hint = "; quote it if you mean a string" if isinstance(node, ScalarNode) else ""
        self._problem(why + hint, node, path)
        return None

    def _problem(self, message: str, node: Node, path: Path) -> None:
        where = format_path(path) or None
        self.problems.append(Problem(message, file=self._file, line=_line(node), path=where))


def load_yaml(text: str, file: str) -> tuple[Any, LineMap]:
    """Parse one YAML document strictly. Raises `ConfigInvalid` naming every problem and its line."""
    try:
        loader = _StrictLoader(text)  # its reader refuses a NUL or control character at once
    except yaml.reader.ReaderError as exc:
        raise ConfigInvalid([_character_problem(exc, text, file)]) from None
    try:
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        raise ConfigInvalid([_syntax_problem(exc, file)]) from None
    except yaml.YAMLError as exc:
        raise ConfigInvalid([Problem(f"invalid YAML: {exc}", file=file)]) from None
    finally:
        loader.dispose()
    if root is None:
        return None, LineMap({(): 1})
    builder = _Builder(loader, file)
    value = builder.build(root, ())
    if builder.problems:
        raise ConfigInvalid(builder.problems)
    return value, LineMap(builder.lines)


def _syntax_problem(exc: yaml.MarkedYAMLError, file: str) -> Problem:
    mark = exc.problem_mark or exc.context_mark
    line = mark.line + 1 if mark is not None else None
    reason = exc.problem or exc.context or "syntax error"
    if exc.context and exc.problem:
        reason = f"{exc.context}: {exc.problem}"
    return Problem(f"invalid YAML: {reason}", file=file, line=line)


def _character_problem(exc: yaml.reader.ReaderError, text: str, file: str) -> Problem:
    line = text.count("\n", 0, exc.position) + 1
    why = f"the character U+{exc.character:04X} is not allowed in YAML (a NUL, control or unprintable one)"
    return Problem(f"invalid YAML: {why}", file=file, line=line)


def _is_word_key(node: ScalarNode) -> bool:
    """A plain `on`, `off`, `yes`, `no`, `y` or `n` (any case): text as a key, whatever YAML 1.1 says."""
    return node.style is None and node.tag == _BOOL and node.value.lower() in _WORD_KEYS


def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


def _describe_tag(tag: str, text: str | None = None) -> str:
    what = _YAML_ONLY_TAGS.get(tag, f"the tag {tag!r}")
    if text is None:
        return f"{what} is not allowed in a job file"
    return f"{text!r} reads as {what}, which a job file does not allow"
