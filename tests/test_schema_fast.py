"""The generated fast decode path against the reference converter (protocol/schema.py).

For every message dataclass: hypothesis draws valid values (from the dataclass's own
hints and metadata), hostile mutations of them, and single deep pokes; the public
decoder must give exactly the reference's outcome (equal objects with equal types, or
the same error: code, message, field), and the raw fast builder must accept exactly
what the reference accepts. Then hand-written edge cases. Fixed seed, bounded budget.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import types
import typing
from collections import OrderedDict
from typing import Any, Literal, get_args, get_origin

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from message_strategies import hostile_values, mutated

from vast_manager.protocol import messages
from vast_manager.protocol.codec import decode, from_obj
from vast_manager.protocol.errors import ProtocolError
from vast_manager.protocol.schema import (
    DEFAULT_MAX_STR_LEN,
    INT64_MAX,
    INT64_MIN,
    converter,
    decoder,
    fast_builder,
)

MESSAGE_TYPES = sorted(
    (obj for obj in vars(messages).values()
     if isinstance(obj, type) and dataclasses.is_dataclass(obj)
     and obj.__module__ == messages.__name__),
    key=lambda cls: cls.__name__,
)
BUDGET = 40  # examples per message type and test

SETTINGS = settings(
    max_examples=BUDGET, derandomize=True, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much],
)

# --- outcomes ---------------------------------------------------------------------------


def strict(value: Any) -> Any:
    """``value`` as nested tuples that also compare types and float signs (-0.0, 1 vs 1.0)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value), tuple(strict(getattr(value, f.name))
                                   for f in dataclasses.fields(value)))
    if isinstance(value, list):
        return (list, tuple(map(strict, value)))
    return (type(value), repr(value))


def outcome(fn: Any, value: Any) -> tuple[Any, ...]:
    try:
        return ("ok", strict(fn(value)))
    except ProtocolError as err:
        return ("error", err.code, err.message, err.field)
    except Exception as err:  # the reference may raise others (OverflowError): same ones
        return ("raised", type(err), str(err))


def lists_in(value: Any) -> list[Any]:
    """Every list inside ``value`` (a parsed body or a decoded message)."""
    if isinstance(value, list):
        return [value, *(x for item in value for x in lists_in(item))]
    if isinstance(value, dict):
        return [x for item in value.values() for x in lists_in(item)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [x for f in dataclasses.fields(value) for x in lists_in(getattr(value, f.name))]
    return []


def assert_same(cls: type, value: Any) -> tuple[Any, ...]:
    """The decoder and the reference agree on ``value``; the fast path accepts the same."""
    expected = outcome(lambda v: converter(cls)(v, ""), value)
    assert outcome(decoder(cls), value) == expected
    assert outcome(lambda v: from_obj(cls, v), value) == expected
    try:
        built: Any = fast_builder(cls)(value)
    except Exception:
        assert expected[0] != "ok", "the fast path refused a value the reference accepts"
    else:
        assert ("ok", strict(built)) == expected
        # Lists are fresh: the decoded message shares none with the body.
        inputs = {id(x) for x in lists_in(value)}
        assert not any(id(x) in inputs for x in lists_in(built))
    return expected


# --- valid values, from the dataclasses themselves --------------------------------------


def valid_for(tp: Any, meta: dict[str, Any]) -> st.SearchStrategy[Any]:
    """JSON values the schema accepts for ``tp`` with field metadata ``meta``."""
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        (inner,) = (a for a in get_args(tp) if a is not type(None))
        return st.none() | valid_for(inner, meta)
    if origin is list:
        (item_tp,) = get_args(tp)
        item_meta = {k[5:]: v for k, v in meta.items() if k.startswith("item_")}
        return st.lists(valid_for(item_tp, item_meta), max_size=min(meta.get("max_len", 6), 6))
    if origin is Literal:
        return st.sampled_from(get_args(tp))
    if tp is bool:
        return st.booleans()
    low = meta.get("min")
    if tp is int:
        small = 0 if low is None else low  # small counts, like Hello's protocol 1
        low = INT64_MIN if low is None else low
        return st.integers(small, small + 3) | st.integers(low, INT64_MAX) | st.sampled_from(
            [low, INT64_MAX])
    if tp is float:
        return (st.floats(min_value=low, allow_nan=False, allow_infinity=False)
                | st.integers(0 if low is None else math.ceil(low), 2**53))  # int for a float
    if tp is str:
        max_len = meta.get("max_len", DEFAULT_MAX_STR_LEN)
        return st.text(max_size=min(max_len, 12)) | st.just("x" * max_len)
    assert dataclasses.is_dataclass(tp), tp
    return valid_message(tp)


# Fields a ``_check`` hook narrows further: mostly valid, sometimes not.
CHECKED: dict[tuple[type, str], st.SearchStrategy[Any]] = {
    (messages.Hello, "protocol"): st.sampled_from(messages.SUPPORTED_PROTOCOLS) | st.integers(),
}


def valid_message(cls: Any) -> st.SearchStrategy[dict[str, Any]]:
    hints = typing.get_type_hints(cls)
    required: dict[str, st.SearchStrategy[Any]] = {}
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for f in dataclasses.fields(cls):
        key = (cls, f.name)
        strategy = CHECKED[key] if key in CHECKED else valid_for(hints[f.name], dict(f.metadata))
        has_default = f.default is not dataclasses.MISSING
        (optional if has_default else required)[f.name] = strategy
    return st.fixed_dictionaries(required, optional=optional)


# --- invalid values ---------------------------------------------------------------------


class Ratio(float):
    pass


class Count(enum.IntEnum):
    ONE = 1


# Python values no JSON parser makes, which from_obj may still be handed.
odd_values = st.sampled_from([
    math.nan, math.inf, -math.inf, 10**400, -(10**400), Ratio(1.5), Count.ONE, (1, 2),
    OrderedDict(a=1), b"bytes", 2**63, -(2**63) - 1, INT64_MIN, INT64_MAX, True, False, "",
])
bad_values = hostile_values | odd_values


def paths_in(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths_in(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += paths_in(item, (*prefix, i))
    return found


@st.composite
def poked(draw: st.DrawFn, base: dict[str, Any]) -> Any:
    """``base`` with one value anywhere inside (a list item, a nested field) replaced."""
    paths = paths_in(base)
    if not paths:
        return base
    path = draw(st.sampled_from(paths))
    out = json_copy(base)
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = draw(bad_values)
    return out


def json_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: json_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_copy(v) for v in value]
    return value


def names(cls: type) -> str:
    return cls.__name__


# --- hypothesis ---------------------------------------------------------------------------


@pytest.mark.parametrize("cls", MESSAGE_TYPES, ids=names)
def test_valid_messages_match_reference(cls: type) -> None:
    accepted = 0

    @SETTINGS
    @given(value=valid_message(cls))
    def run(value: dict[str, Any]) -> None:
        nonlocal accepted
        accepted += assert_same(cls, value)[0] == "ok"

    run()
    assert accepted > 0


@pytest.mark.parametrize("cls", MESSAGE_TYPES, ids=names)
def test_mutated_messages_match_reference(cls: type) -> None:
    @SETTINGS
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        base = data.draw(valid_message(cls))
        how = data.draw(st.sampled_from(["mutated", "poked", "whole"]))
        if how == "mutated":
            value = data.draw(mutated(base))
        elif how == "poked":
            value = data.draw(poked(base))
        else:
            value = data.draw(bad_values)
        assert_same(cls, value)
        try:
            body = json.dumps(value).encode()
        except (TypeError, ValueError):
            return
        # Through the bytes too (orjson reads integers beyond 64 bits as floats).
        expected = outcome(lambda b: converter(cls)(orjson.loads(b), ""), body)
        if expected[0] != "raised":
            assert outcome(lambda b: decode(cls, b), body) == expected

    run()


# --- edge cases, by hand ----------------------------------------------------------------


def heartbeat() -> dict[str, Any]:
    gpu = {"index": 0, "util_pct_mean": 95.0, "util_pct_max": 100.0,
           "mem_used_bytes": 20_000_000_000, "pcie_tx_kbps_mean": 1e6,
           "pcie_rx_kbps_mean": 5e6, "power_w_mean": 400.0, "temp_c_max": 70.0,
           "sm_clock_mhz_mean": 2500.0, "throttle_reasons": 4,
           "pcie_gen_current": 4, "pcie_width_current": 16}
    return {
        "seq": 7, "phase": "proving", "phase_started_at": 1.7e9,
        "progress": {"done": 3, "total": 10, "unit": "proofs"},
        "proofs_completed_total": 3, "proof_seconds_recent": [100.0, 120.5],
        "telemetry": {
            "window_s": 15.0, "samples": 15,
            "gpus": [{**gpu, "index": i} for i in range(4)],
            "cpu": {"util_pct_mean": 40.0, "per_core_util_pct_mean": [50.5] * 64,
                    "load1": 12.0, "iowait_pct_mean": 0.4},
            "ram": {"used_bytes": 4 * 10**10, "total_bytes": 6 * 10**10},
            "net": {"rx_bytes_per_s": 1.2e6, "tx_bytes_per_s": 3e5},
        },
    }


def hello() -> dict[str, Any]:
    return {
        "protocol": 1, "agent_version": "0.1.0", "boot_id": "b" * 32, "container_id": None,
        "host": {"hostname": "h", "cpu_model": "cpu", "cpu_cores_logical": 32,
                 "cpu_cores_physical": 16, "ram_total_bytes": 1 << 38,
                 "driver_version": None, "cuda_version": None, "gpus": []},
    }


def with_(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``body`` with the dotted ``path`` (``a.b[2].c``) set, or removed if
    ``value`` is ``REMOVE``."""
    out = json_copy(body)
    keys: list[Any] = []
    for part in path.split("."):
        name, *indexes = part.split("[")
        keys += [name, *(int(i.rstrip("]")) for i in indexes)]
    target = out
    for key in keys[:-1]:
        target = target[key]
    if value is REMOVE:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return out


REMOVE = object()
GPU3 = "telemetry.gpus[3]"

# (message type, body, expected error field or None for accepted, a piece of the message)
EDGES: list[tuple[type, Any, str | None, str]] = [
    (messages.Heartbeat, heartbeat(), None, ""),
    (messages.Heartbeat, with_(heartbeat(), "seq", True), "seq", "got boolean"),
    (messages.Heartbeat, with_(heartbeat(), "progress.done", False), "progress.done",
     "got boolean"),
    (messages.Heartbeat, with_(heartbeat(), "phase_started_at", 5), None, ""),
    (messages.Heartbeat, with_(heartbeat(), "phase_started_at", math.inf),
     "phase_started_at", "must be finite"),
    (messages.Heartbeat, with_(heartbeat(), "phase_started_at", math.nan),
     "phase_started_at", "must be finite"),
    (messages.Heartbeat, with_(heartbeat(), "seq", 2**63), "seq", "signed 64-bit"),
    (messages.Heartbeat, with_(heartbeat(), "seq", INT64_MAX), None, ""),
    (messages.Hello, with_(hello(), "host.ram_total_bytes", -(2**63) - 1),
     "host.ram_total_bytes", "signed 64-bit"),
    (messages.Heartbeat, with_(heartbeat(), "seq", -1), "seq", "at least 0"),
    (messages.Heartbeat, with_(heartbeat(), "telemetry.window_s", -0.5),
     "telemetry.window_s", "at least 0"),
    (messages.Heartbeat, with_(heartbeat(), "telemetry.window_s", -1),
     "telemetry.window_s", "at least 0"),
    (messages.Heartbeat, with_(heartbeat(), "progress.concurrency", 0),
     "progress.concurrency", "at least 1"),
    (messages.Heartbeat, with_(heartbeat(), "proof_seconds_recent", [1.0, -1.0]),
     "proof_seconds_recent[1]", "at least 0"),
    (messages.Heartbeat, with_(heartbeat(), "proof_seconds_recent", [1, 2.5]), None, ""),
    (messages.Heartbeat, with_(heartbeat(), "proof_seconds_recent", [1.0, True]),
     "proof_seconds_recent[1]", "got boolean"),
    (messages.Heartbeat, with_(heartbeat(), "proof_seconds_recent", [1e308, 1e308]), None, ""),
    (messages.Heartbeat, with_(heartbeat(), "proof_seconds_recent", [1e308, math.inf]),
     "proof_seconds_recent[1]", "must be finite"),
    (messages.Heartbeat, with_(heartbeat(), "proof_seconds_recent", [0.0] * 10_001),
     "proof_seconds_recent", "more than 10000 items"),
    (messages.Heartbeat, with_(heartbeat(), "telemetry.cpu.per_core_util_pct_mean[9]", "x"),
     "telemetry.cpu.per_core_util_pct_mean[9]", "a number"),
    (messages.Heartbeat, with_(heartbeat(), "telemetry.cpu.per_core_util_pct_mean[3]",
                               Ratio(1.0)),
     "telemetry.cpu.per_core_util_pct_mean[3]", "got Ratio"),
    (messages.Hello, with_(hello(), "agent_version", "v" * 64), None, ""),
    (messages.Hello, with_(hello(), "agent_version", "v" * 65), "agent_version",
     "longer than 64"),
    (messages.Hello, with_(hello(), "host.hostname", "h" * 256), "host.hostname",
     "longer than 255"),
    (messages.Hello, with_(hello(), "host.gpus", [None] * 65), "host.gpus",
     "more than 64 items"),
    (messages.Hello, with_(hello(), "protocol", 2), "protocol", "not supported"),
    (messages.Hello, with_(hello(), "protocol", Count.ONE), "protocol", "got Count"),
    (messages.Hello, with_(hello(), "container_id", REMOVE), "container_id", "missing"),
    (messages.Heartbeat, with_(heartbeat(), "telemetry.gpus[3].pcie_gen_current", REMOVE),
     None, ""),
    (messages.Heartbeat, with_(heartbeat(), "seq", None), "seq", "got null"),
    (messages.Heartbeat, with_(heartbeat(), "telemetry.cpu", None), "telemetry.cpu",
     "got null"),
    (messages.Heartbeat, with_(heartbeat(), GPU3 + ".util_pct_mean", "95"),
     GPU3 + ".util_pct_mean", "got str"),
    (messages.Heartbeat, with_(heartbeat(), GPU3 + ".util_pct_mean", [95.0]),
     GPU3 + ".util_pct_mean", "got list"),
    (messages.Heartbeat, with_(heartbeat(), GPU3, OrderedDict(index=3)), GPU3, "an object"),
    (messages.Heartbeat, with_(heartbeat(), "phase", "dancing"), "phase", "must be one of"),
    # Two bad fields: the first in field order is named.
    (messages.Heartbeat, with_(with_(heartbeat(), "telemetry.samples", -1), "seq", "7"),
     "seq", "an integer"),
    (messages.Heartbeat, [], "body", "an object"),
    (messages.Heartbeat, None, "body", "got null"),
    (messages.Heartbeat, "x", "body", "got str"),
    (messages.LogBatch, {"lines": [{"ts": 1.0, "source": "a", "text": "t"}] * 1001},
     "lines", "more than 1000 items"),
    (messages.LogBatch, {"lines": [{"ts": 1.0, "source": "a", "text": "t" * 8193}]},
     "lines[0].text", "longer than 8192"),
    (messages.Directive, {"action": "continue", "reason": "", "next_heartbeat_s": 0,
                          "min_rate_per_hour": None}, "next_heartbeat_s", "at least 1"),
    (messages.ResultAck, {"ok": 1, "duplicate": False, "directive": {}}, "ok", "a boolean"),
    (messages.Result, {"result_id": "r", "kind": "scaling", "proof_type": "p",
                       "started_at": 1, "finished_at": 2, "gpus_used": [0, 1],
                       "proofs_completed": 4, "proofs_failed": 0, "wall_seconds": 1,
                       "rate_per_hour": 1, "proof_seconds": [], "telemetry": None},
     "runs", "required for a scaling result"),
    (messages.Result, {"result_id": "r", "kind": "benchmark", "proof_type": "p",
                       "started_at": 1, "finished_at": 2, "gpus_used": [0, True],
                       "proofs_completed": 4, "proofs_failed": 0, "wall_seconds": 1,
                       "rate_per_hour": 1, "proof_seconds": [], "telemetry": None},
     "gpus_used[1]", "got boolean"),
]


@pytest.mark.parametrize(("cls", "body", "field", "says"), EDGES)
def test_edge_cases_match_reference(cls: type, body: Any, field: str | None, says: str) -> None:
    got = assert_same(cls, body)
    if field is None:
        assert got[0] == "ok", got
    else:
        assert got[0] == "error" and got[3] == field and says in got[2], got


def test_accepted_values_keep_their_types() -> None:
    body = with_(heartbeat(), "phase_started_at", 5)
    body["telemetry"]["cpu"]["per_core_util_pct_mean"] = [1, 2.5]
    hb = from_obj(messages.Heartbeat, body)
    assert type(hb.phase_started_at) is float and type(hb.seq) is int
    assert hb.telemetry is not None
    assert [type(v) for v in hb.telemetry.cpu.per_core_util_pct_mean] == [float, float]
    assert hb.telemetry.gpus[0].pcie_gen_current == 4
    hello_ = from_obj(messages.Hello, with_(hello(), "future_field", {"x": [1]}))
    assert hello_.host.gpus == []


def test_an_int_too_large_for_a_float_raises_as_before() -> None:
    # Only from_obj can be handed one (orjson reads it as a float): the reference lets
    # OverflowError out, and the fast path keeps that.
    got = assert_same(messages.Heartbeat, with_(heartbeat(), "phase_started_at", 10**400))
    assert got[:2] == ("raised", OverflowError)


def test_non_json_numbers_in_the_body_are_malformed() -> None:
    for text in (b'{"seq": 1e999}', b'{"seq": NaN}'):
        with pytest.raises(ProtocolError) as err:
            decode(messages.Heartbeat, text)
        assert err.value.code == "malformed_json"
    # A float for an int field, as orjson reads an integer beyond 64 bits.
    body = orjson.dumps(heartbeat()).replace(b'"seq":7', b'"seq":18446744073709551616')
    with pytest.raises(ProtocolError) as err:
        decode(messages.Heartbeat, body)
    assert (err.value.field, err.value.message) == ("seq", "Field 'seq' must be an integer, "
                                                            "got float.")
