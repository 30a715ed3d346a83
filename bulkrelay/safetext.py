"""Text from a run (a row's value, a target's answer) made safe for a person to read.

A control character shown raw does something instead of being seen: ESC starts a terminal sequence (an
OSC 52 one writes the clipboard), NUL and CR hide what follows. A bidirectional formatting character
(U+202E RIGHT-TO-LEFT OVERRIDE) left unterminated reverses everything after it. Both are shown as the
escape a person would type (`\\x1b`, `\\u202e`); newlines and tabs stay, they only break lines. Isolating
right-to-left text from what surrounds it is the renderer's part: `<bdi>` on a page, `isolated` here.
"""

from __future__ import annotations

import re

# C0 but tab and newline, DEL, C1; then the bidi embeddings, overrides, isolates and marks.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_FSI, _PDI = "\u2068", "\u2069"  # first-strong isolate and its end: the text keeps its own direction
_RTL = re.compile("[\u0590-\u08ff\ufb1d-\ufdff\ufe70-\ufeff]|[\U00010800-\U00010fff]|[\U0001e800-\U0001efff]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """`text` with every control and bidi formatting character shown as its escape."""
    return _UNSAFE.sub(_escaped, text)


def has_rtl(text: str) -> bool:
    """Whether `text` holds right-to-left letters (Hebrew, Arabic, ...), which reorder their neighbours."""
    return _RTL.search(text) is not None


def isolated(text: str) -> str:
    """`visible(text)`, wrapped in a first-strong isolate when it holds right-to-left letters, so that
    it cannot reorder the words around it on a terminal that applies the bidi algorithm."""
    shown = visible(text)
    return f"{_FSI}{shown}{_PDI}" if has_rtl(shown) else shown
