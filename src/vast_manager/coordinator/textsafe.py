"""Untrusted host text made safe to show: on a terminal, in ``/metrics`` labels, in log lines
and (through the generated ``dashboard_script``) in the dashboard.

Everything a host sends (hostnames, GPU names, log lines, evidence, and the error
messages that quote them) is untrusted. ``neutralise`` is the one function that makes
it safe to show: the CLI, ``/metrics`` labels, the log lines and the dashboard (through
``dashboard_script``, generated from the same definition) all use it, so a hostile host
can neither move the operator's cursor nor make one name display as another.
"""

from __future__ import annotations

import re
from typing import Any

#: What host text may not carry to a screen, as inclusive code point ranges: C0 and C1
#: controls and DEL (U+009B is the one-byte CSI of terminals), the zero-width characters
#: and bidi marks (U+200B-200F), the line and paragraph separators and the bidi
#: embeddings and overrides (U+2028-202E), the word joiner, invisible operators and bidi
#: isolates (U+2060-2069), the Arabic letter mark (U+061C) and the byte order mark.
UNSAFE_TEXT_RANGES: tuple[tuple[int, int], ...] = (
    (0x0000, 0x001F), (0x007F, 0x009F), (0x061C, 0x061C), (0x200B, 0x200F),
    (0x2028, 0x202E), (0x2060, 0x2069), (0xFEFF, 0xFEFF),
)
#: Spacing that only breaks a line apart: shown as a space.
_AS_SPACE = frozenset("\t\n\r")
_CLASS = "".join(f"\\u{a:04x}-\\u{b:04x}" for a, b in UNSAFE_TEXT_RANGES)
_UNSAFE = re.compile(f"[{_CLASS}]")
# Inside JSON text orjson already escapes the C0 controls; what is left are the others
# (the line breaks and indentation outside strings must stay as they are).
_UNSAFE_IN_JSON = re.compile("[" + "".join(
    f"\\u{a:04x}-\\u{b:04x}" for a, b in UNSAFE_TEXT_RANGES if a > 0x1F) + "]")


def _shown(match: re.Match[str]) -> str:
    ch = match.group()
    return " " if ch in _AS_SPACE else f"\\u{ord(ch):04x}"


def neutralise(text: str) -> str:
    """Host text shown as text: each unsafe character becomes its visible escape
    (U+202E reads ``\\u202e``), tabs and line breaks a space."""
    return _UNSAFE.sub(_shown, text)


def json_safe(text: str) -> str:
    """JSON text (as orjson writes it) with every unsafe character inside its strings
    written as a ``\\uXXXX`` escape: the same data for a program, inert on a terminal."""
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def has_unsafe(text: str) -> bool:
    """Whether ``text`` holds a character ``neutralise`` would change (operator input
    holding one is refused: it would be shown escaped)."""
    return _UNSAFE.search(text) is not None


def clean(value: Any) -> str:
    """Untrusted text made safe for a terminal (``neutralise``; None reads ``-``)."""
    if value is None:
        return "-"
    return neutralise(str(value))


def dashboard_script() -> str:
    """``neutralise`` for the dashboard's JavaScript, built from the same definition
    (served as ``/static/textsafe.js``)."""
    return (
        "// Generated from coordinator/textsafe.py (UNSAFE_TEXT_RANGES): the one definition\n"
        "// of host text that may not reach the screen as it is.\n"
        '"use strict";\n'
        f"const UNSAFE_TEXT = /[{_CLASS}]/g;\n"
        "function safeText(value) {\n"
        '  return String(value).replace(UNSAFE_TEXT, (ch) => ("\\t\\n\\r".includes(ch) ? " "\n'
        '    : "\\\\u" + ch.charCodeAt(0).toString(16).padStart(4, "0")));\n'
        "}\n"
    )
