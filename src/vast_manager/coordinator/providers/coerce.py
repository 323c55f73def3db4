"""Lenient number parsing for provider data (vast.ai fields may be strings, null or absent).

A bool is never a number here: vast.ai booleans must not count as 0 or 1.
"""

from __future__ import annotations

import math
from typing import Any


def as_int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def as_float(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def positive(value: Any) -> float | None:
    """A finite number above zero, else None (prices, rates)."""
    f = as_float(value)
    return f if f is not None and math.isfinite(f) and f > 0 else None
