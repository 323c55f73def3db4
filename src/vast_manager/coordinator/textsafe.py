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

#: The Unicode general categories host text may not carry to a screen: controls (Cc: C0,
#: DEL, C1, U+009B the one-byte CSI of terminals), format characters (Cf: zero-width
#: characters, bidi marks, embeddings, overrides and isolates, soft hyphen, the byte
#: order mark, the tag characters), private use (Co), surrogates (Cs), and the line and
#: paragraph separators (Zl, Zp). The tags block U+E0000-E007F is unsafe whole (its
#: unassigned code points too): tag characters spell invisible text.
UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs", "Zl", "Zp"})
#: Those categories as inclusive code point ranges (Unicode 15.1, a superset of the
#: running Python's own database: ``tests/coordinator/web/test_adversarial_http.py``
#: checks every code point of every unsafe category against it), plus U+2065, reserved
#: inside the invisible-operator block and unsafe before this definition.
UNSAFE_TEXT_RANGES: tuple[tuple[int, int], ...] = (
    (0x0000, 0x001F), (0x007F, 0x009F), (0x00AD, 0x00AD), (0x0600, 0x0605),
    (0x061C, 0x061C), (0x06DD, 0x06DD), (0x070F, 0x070F), (0x0890, 0x0891),
    (0x08E2, 0x08E2), (0x180E, 0x180E), (0x200B, 0x200F), (0x2028, 0x202E),
    (0x2060, 0x206F), (0xD800, 0xF8FF), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB),
    (0x110BD, 0x110BD), (0x110CD, 0x110CD), (0x13430, 0x1343F), (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A), (0xE0000, 0xE007F), (0xF0000, 0xFFFFD), (0x100000, 0x10FFFD),
)
#: Spacing that only breaks a line apart: shown as a space.
_AS_SPACE = frozenset("\t\n\r")


def escape_of(code: int) -> str:
    """How an unsafe character is shown: ``\\u202e``; beyond U+FFFF ``\\U000e0041``."""
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _range_class(ranges: tuple[tuple[int, int], ...]) -> str:
    return "".join(f"{escape_of(a)}-{escape_of(b)}" for a, b in ranges)


def _js_escape(code: int) -> str:
    return f"\\u{{{code:x}}}"


_CLASS = _range_class(UNSAFE_TEXT_RANGES)
_UNSAFE = re.compile(f"[{_CLASS}]")
# Inside JSON text orjson already escapes the C0 controls; what is left are the others
# (the line breaks and indentation outside strings must stay as they are).
_UNSAFE_IN_JSON = re.compile(
    "[" + _range_class(tuple(r for r in UNSAFE_TEXT_RANGES if r[0] > 0x1F)) + "]")


def _shown(match: re.Match[str]) -> str:
    ch = match.group()
    return " " if ch in _AS_SPACE else escape_of(ord(ch))


def neutralise(text: str) -> str:
    """Host text shown as text: each unsafe character becomes its visible escape
    (U+202E reads ``\\u202e``), tabs and line breaks a space."""
    return _UNSAFE.sub(_shown, text)


def json_safe(text: str) -> str:
    """JSON text (as orjson writes it) with every unsafe character inside its strings
    written as a ``\\uXXXX`` escape: the same data for a program, inert on a terminal."""
    return _UNSAFE_IN_JSON.sub(lambda m: _json_escape(ord(m.group())), text)


def _json_escape(code: int) -> str:
    """A JSON string escape: beyond U+FFFF a surrogate pair (RFC 8259, section 7)."""
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


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
    js_class = "".join(f"{_js_escape(a)}-{_js_escape(b)}" for a, b in UNSAFE_TEXT_RANGES)
    return (
        "// Generated from coordinator/textsafe.py (UNSAFE_TEXT_RANGES): the one definition\n"
        "// of host text that may not reach the screen as it is.\n"
        '"use strict";\n'
        f"const UNSAFE_TEXT = /[{js_class}]/gu;\n"
        "function safeText(value) {\n"
        "  return String(value).replace(UNSAFE_TEXT, (ch) => {\n"
        '    if ("\\t\\n\\r".includes(ch)) return " ";\n'
        "    const code = ch.codePointAt(0);\n"
        '    return code <= 0xffff ? "\\\\u" + code.toString(16).padStart(4, "0")\n'
        '      : "\\\\U" + code.toString(16).padStart(8, "0");\n'
        "  });\n"
        "}\n"
    )
