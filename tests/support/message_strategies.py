"""Hypothesis strategies for hostile message bodies, shared by the fuzz tests.

``mutated(base)`` is a valid message with a few fields replaced by hostile values,
removed, or mutated within; an unknown field is sometimes added.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

# --- hostile values ---------------------------------------------------------------------

hostile_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64 - 1),
    st.sampled_from([0, -1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324, 1e-300]),
    st.text(max_size=40),
    st.sampled_from([
        "", " ", "\x00", "\x1b[31mred\x1b[0m", "<script>alert(1)</script>",
        "'; drop table results;--",
        "\u202e", "\ufeff", "ag_0123456789abcdef0123", "..\\..\\etc/passwd", "%s%n", "{}", "[]",
        "x" * 70000,
    ]),
)
hostile_values = st.recursive(
    hostile_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any], depth: int = 0) -> Any:
    """``base`` with a few fields replaced by hostile values, removed, or mutated within."""
    out = dict(base)
    names = sorted(base)
    for name in draw(st.lists(st.sampled_from(names), max_size=3, unique=True)):
        value = base[name]
        how = draw(st.sampled_from(["hostile", "hostile", "missing", "nested"]))
        if how == "missing":
            del out[name]
        elif how == "nested" and isinstance(value, dict) and depth < 3:
            out[name] = draw(mutated(value, depth + 1))
        elif how == "nested" and isinstance(value, list) and value and isinstance(value[0], dict):
            out[name] = [draw(mutated(value[0], depth + 1)) for _ in range(draw(st.integers(0, 3)))]
        else:
            out[name] = draw(hostile_values)
    if draw(st.integers(0, 3)) == 0:
        out[draw(st.text(min_size=1, max_size=12))] = draw(hostile_values)  # unknown field
    return out
