"""What the message decoder accepts, against the contract written out as a test oracle.

``spec_faults`` reads each message Struct's annotations (the same ``msgspec.Meta``
facts the decoder reads) and applies the contract's rules itself (docs/protocol.md):
exact types, an int for a float, never a bool for a number, signed 64-bit integers,
finite floats, bounded strings and lists, literal enums, missing fields, unknown fields
ignored, the messages' own rules. For every message type, hypothesis draws valid
values, hostile mutations and single deep pokes; ``decode`` (bytes) and ``from_obj``
(parsed JSON) must accept exactly what the oracle accepts, and refuse the rest with a
``ProtocolError`` naming one of the fields the oracle found at fault, in one sentence.
Then hand-written edge cases, and where the behaviour changed from the decoder before
msgspec (docs/protocol.md, "Validation"). Fixed seed, bounded budget.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Annotated, Any, Literal, get_args, get_origin

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vast_manager.protocol import messages
from vast_manager.protocol.codec import decode, encode, from_obj
from vast_manager.protocol.errors import ProtocolError
from vast_manager.protocol.messages import INT64_MAX, INT64_MIN

from support.message_strategies import hostile_values, mutated

MESSAGE_TYPES = sorted(
    (obj for obj in vars(messages).values()
     if isinstance(obj, type) and issubclass(obj, messages.Message)
     and obj is not messages.Message),
    key=lambda cls: cls.__name__,
)
BUDGET = 40  # examples per message type and test

SETTINGS = settings(
    max_examples=BUDGET, derandomize=True, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much],
)

# --- the oracle ---------------------------------------------------------------------------


BAD = "invalid_field"


class Shape(typing.NamedTuple):
    """A field type as the oracle reads it: the bare type and its constraints."""

    tp: Any
    nullable: bool = False
    ge: float | None = None
    le: float | None = None
    max_length: int | None = None


def shape(tp: Any) -> Shape:
    nullable = False
    metas: list[Any] = []
    while True:
        if get_origin(tp) is Annotated:
            tp, *extra = get_args(tp)
            metas += extra
            continue
        if get_origin(tp) in (typing.Union, types.UnionType):
            (inner,) = [a for a in get_args(tp) if a is not type(None)]
            tp, nullable = inner, True
            continue
        break
    found = {k: getattr(m, k) for m in metas for k in ("ge", "le", "max_length")
             if getattr(m, k, None) is not None}
    return Shape(tp, nullable, **found)


def is_message(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, messages.Message)


def hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


Fault = tuple[str, str]  # (the field's path, the error code)


def spec_faults(tp: Any, value: Any, path: str) -> list[Fault]:
    """Every field in ``value`` the contract refuses as a ``tp`` (empty: accepted)."""
    s = shape(tp)
    where = path or "body"
    if value is None:
        return [] if s.nullable else [(where, BAD)]
    if is_message(s.tp):
        if type(value) is not dict:
            return [(where, BAD)]
        prefix = f"{path}." if path else ""
        faults: list[Fault] = []
        for f in msgspec.structs.fields(s.tp):
            if f.name in value:
                faults += spec_faults(hints(s.tp)[f.name], value[f.name], prefix + f.name)
            elif f.required:
                faults.append((prefix + f.name, BAD))
        if not faults:
            faults += rule_faults(s.tp, value, prefix)
        return faults
    if get_origin(s.tp) is list:
        if type(value) is not list:
            return [(where, BAD)]
        too_long = s.max_length is not None and len(value) > s.max_length
        (item,) = get_args(s.tp)
        # Both at fault: the decoder may name either the list or a bad item in it.
        return [(where, BAD)] * too_long + [
            p for i, v in enumerate(value) for p in spec_faults(item, v, f"{path}[{i}]")]
    if get_origin(s.tp) is Literal:
        return [] if type(value) is str and value in get_args(s.tp) else [(where, BAD)]
    if s.tp is bool:
        return [] if type(value) is bool else [(where, BAD)]
    if s.tp is int:
        ok = type(value) is int
    elif s.tp is float:
        ok = type(value) in (int, float) and math.isfinite(value)
    elif s.tp is str:
        ok = type(value) is str
        if ok and s.max_length is not None:
            ok = len(value) <= s.max_length
        return [] if ok else [(where, BAD)]
    else:
        raise AssertionError(f"the oracle does not know {s.tp!r}")
    ok = ok and (s.ge is None or value >= s.ge) and (s.le is None or value <= s.le)
    return [] if ok else [(where, BAD)]


def rule_faults(cls: type, value: dict[str, Any], prefix: str) -> list[Fault]:
    """The messages' own rules, as docs/protocol.md states them."""
    if cls is messages.Hello and value["protocol"] not in messages.SUPPORTED_PROTOCOLS:
        return [(prefix + "protocol", "unsupported_protocol")]
    if cls is messages.Result:
        if not value["result_id"]:
            return [(prefix + "result_id", BAD)]
        if value["kind"] == "scaling":
            return [(prefix + n, BAD) for n in ("runs", "efficiency", "bottleneck", "evidence")
                    if value.get(n) is None][:1]
    return []


def short(value: Any) -> str:
    """A failure's value, cut to a readable length (bodies hold 70,000-character strings)."""
    text = repr(value)
    return text if len(text) < 400 else text[:400] + "..."


def outcome(fn: Any, value: Any) -> tuple[Any, ...]:
    try:
        return ("ok", fn(value))
    except ProtocolError as err:
        return ("error", err.code, err.field, err.message)


def assert_follows_spec(cls: type, value: Any) -> tuple[Any, ...]:
    """``from_obj`` and ``decode`` of ``value`` do as the oracle says, and agree."""
    faults = spec_faults(cls, value, "")
    got = outcome(lambda v: from_obj(cls, v), value)
    if not faults:
        assert got[0] == "ok", short(got)
    else:
        assert got[0] == "error", (faults, short(value))
        _, code, field, message = got
        assert (field, code) in faults, (field, code, faults, message, short(value))
        assert message.startswith(f"Field '{field}' ") or code == "unsupported_protocol"
        assert message.endswith(".") and message.count(". ") == 0, message
    try:
        body = orjson.dumps(value)
    except TypeError:
        return got  # an int beyond 64 bits: not JSON orjson writes
    through = outcome(lambda b: decode(cls, b), body)
    assert through[:3] == got[:3]
    if got[0] == "ok":
        assert encode(through[1]) == encode(got[1])
    return got


# --- valid values, from the annotations --------------------------------------------------


def valid_for(tp: Any) -> st.SearchStrategy[Any]:
    s = shape(tp)
    inner = valid_bare(s)
    return st.none() | inner if s.nullable else inner


def valid_bare(s: Shape) -> st.SearchStrategy[Any]:
    if get_origin(s.tp) is list:
        (item,) = get_args(s.tp)
        return st.lists(valid_for(item), max_size=min(s.max_length or 6, 6))
    if get_origin(s.tp) is Literal:
        return st.sampled_from(get_args(s.tp))
    if s.tp is bool:
        return st.booleans()
    if s.tp is int:
        low = INT64_MIN if s.ge is None else int(s.ge)
        small = max(low, 0)
        return (st.integers(small, small + 3) | st.integers(low, INT64_MAX)
                | st.sampled_from([low, INT64_MAX]))
    if s.tp is float:
        low = None if s.ge is None or s.ge < -1e300 else s.ge
        return (st.floats(min_value=low, allow_nan=False, allow_infinity=False)
                | st.integers(0 if low is None else math.ceil(low), 2**53))  # int for a float
    if s.tp is str:
        n = s.max_length or 65536
        return st.text(max_size=min(n, 12)) | st.just("x" * n)
    assert is_message(s.tp), s.tp
    return valid_message(s.tp)


CHECKED: dict[tuple[type, str], st.SearchStrategy[Any]] = {
    (messages.Hello, "protocol"): st.sampled_from(messages.SUPPORTED_PROTOCOLS) | st.integers(),
}


def valid_message(cls: Any) -> st.SearchStrategy[dict[str, Any]]:
    required: dict[str, st.SearchStrategy[Any]] = {}
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for f in msgspec.structs.fields(cls):
        key = (cls, f.name)
        strategy = CHECKED[key] if key in CHECKED else valid_for(hints(cls)[f.name])
        (required if f.required else optional)[f.name] = strategy
    return st.fixed_dictionaries(required, optional=optional)


# --- invalid values ---------------------------------------------------------------------

bad_values = hostile_values | st.sampled_from(
    [2**63, -(2**63) - 1, INT64_MIN, INT64_MAX, 1e308, -1e308, True, False, "", [], {}])


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
    out = orjson.loads(orjson.dumps(base))
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = draw(bad_values)
    return out


def names(cls: type) -> str:
    return cls.__name__


@pytest.mark.parametrize("cls", MESSAGE_TYPES, ids=names)
def test_valid_messages_are_accepted(cls: type) -> None:
    accepted = 0

    @SETTINGS
    @given(value=valid_message(cls))
    def run(value: dict[str, Any]) -> None:
        nonlocal accepted
        accepted += assert_follows_spec(cls, value)[0] == "ok"

    run()
    assert accepted > 0


@pytest.mark.parametrize("cls", MESSAGE_TYPES, ids=names)
def test_hostile_messages_are_refused_naming_a_bad_field(cls: type) -> None:
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
        assert_follows_spec(cls, value)

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


REMOVE = object()
GPU = {"index": 0, "uuid": None, "name": None, "memory_total_bytes": None,
       "pcie_gen_max": None, "pcie_width_max": None, "pcie_gen_current": None,
       "pcie_width_current": None}


def with_(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``body`` with the dotted ``path`` (``a.b[2].c``) set, or removed if
    ``value`` is ``REMOVE``."""
    out = orjson.loads(orjson.dumps(body))
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


GPU3 = "telemetry.gpus[3]"

# (message type, body, expected error field or None for accepted, the whole message)
EDGES: list[tuple[type, Any, str | None, str]] = [
    (messages.Heartbeat, heartbeat(), None, ""),
    (messages.Heartbeat, with_(heartbeat(), "seq", True), "seq",
     "Field 'seq' must be an integer, got boolean."),
    (messages.Heartbeat, with_(heartbeat(), "progress.done", False), "progress.done",
     "Field 'progress.done' must be an integer, got boolean."),
    (messages.Heartbeat, with_(heartbeat(), "phase_started_at", 5), None, ""),
    (messages.Heartbeat, with_(heartbeat(), "seq", 2**63), "seq",
     "Field 'seq' is outside the signed 64-bit range."),
    (messages.Heartbeat, with_(heartbeat(), "seq", INT64_MAX), None, ""),
    (messages.Hello, with_(hello(), "host.ram_total_bytes", 2**64 - 1),
     "host.ram_total_bytes", "Field 'host.ram_total_bytes' is outside the signed 64-bit range."),
    (messages.Hello, with_(hello(), "host.cpu_cores_physical", -(2**63) - 1),
     "host.cpu_cores_physical",
     "Field 'host.cpu_cores_physical' is outside the signed 64-bit range."),
    (messages.Heartbeat, with_(heartbeat(), "seq", -1), "seq", "Field 'seq' must be at least 0."),
    (messages.Heartbeat, with_(heartbeat(), "telemetry.window_s", -0.5),
     "telemetry.window_s", "Field 'telemetry.window_s' must be at least 0."),
    (messages.Heartbeat, with_(heartbeat(), "progress.concurrency", 0),
     "progress.concurrency", "Field 'progress.concurrency' must be at least 1."),
    (messages.Heartbeat, with_(heartbeat(), "proof_seconds_recent", [1.0, -1.0]),
     "proof_seconds_recent[1]", "Field 'proof_seconds_recent[1]' must be at least 0."),
    (messages.Heartbeat, with_(heartbeat(), "proof_seconds_recent", [1, 2.5]), None, ""),
    (messages.Heartbeat, with_(heartbeat(), "proof_seconds_recent", [1.0, True]),
     "proof_seconds_recent[1]", "Field 'proof_seconds_recent[1]' must be a number, got boolean."),
    (messages.Heartbeat, with_(heartbeat(), "proof_seconds_recent", [1e308, 1e308]), None, ""),
    (messages.Heartbeat, with_(heartbeat(), "proof_seconds_recent", [0.0] * 10_001),
     "proof_seconds_recent", "Field 'proof_seconds_recent' holds more than 10000 items."),
    (messages.Heartbeat, with_(heartbeat(), "telemetry.cpu.per_core_util_pct_mean[9]", "x"),
     "telemetry.cpu.per_core_util_pct_mean[9]",
     "Field 'telemetry.cpu.per_core_util_pct_mean[9]' must be a number, got str."),
    (messages.Hello, with_(hello(), "agent_version", "v" * 64), None, ""),
    (messages.Hello, with_(hello(), "agent_version", "é" * 64), None, ""),  # characters
    (messages.Hello, with_(hello(), "agent_version", "v" * 65), "agent_version",
     "Field 'agent_version' is longer than 64 characters."),
    (messages.Hello, with_(hello(), "host.hostname", "h" * 256), "host.hostname",
     "Field 'host.hostname' is longer than 255 characters."),
    (messages.Hello, with_(hello(), "host.gpus", [GPU] * 65), "host.gpus",
     "Field 'host.gpus' holds more than 64 items."),
    (messages.Hello, with_(hello(), "protocol", 2), "protocol",
     "Protocol 2 is not supported; this coordinator speaks 1."),
    (messages.Hello, with_(hello(), "container_id", REMOVE), "container_id",
     "Field 'container_id' is missing."),
    (messages.Heartbeat, with_(heartbeat(), "telemetry.gpus[3].index", REMOVE),
     "telemetry.gpus[3].index", "Field 'telemetry.gpus[3].index' is missing."),
    (messages.Heartbeat, with_(heartbeat(), "telemetry.gpus[3].pcie_gen_current", REMOVE),
     None, ""),
    (messages.Heartbeat, with_(heartbeat(), "seq", None), "seq",
     "Field 'seq' must be an integer, got null."),
    (messages.Heartbeat, with_(heartbeat(), "telemetry.cpu", None), "telemetry.cpu",
     "Field 'telemetry.cpu' must be an object, got null."),
    (messages.Heartbeat, with_(heartbeat(), GPU3 + ".util_pct_mean", "95"),
     GPU3 + ".util_pct_mean", f"Field '{GPU3}.util_pct_mean' must be a number, got str."),
    (messages.Heartbeat, with_(heartbeat(), GPU3 + ".util_pct_mean", [95.0]),
     GPU3 + ".util_pct_mean", f"Field '{GPU3}.util_pct_mean' must be a number, got list."),
    (messages.Heartbeat, with_(heartbeat(), GPU3, [3]), GPU3,
     f"Field '{GPU3}' must be an object, got list."),
    (messages.Heartbeat, with_(heartbeat(), "phase", "dancing"), "phase",
     "Field 'phase' must be one of: booting, fetching_params, warming, benchmarking, "
     "proving, terminating, failed."),
    (messages.Heartbeat, with_(heartbeat(), "progress.unit", "hours"), "progress.unit",
     "Field 'progress.unit' must be one of: bytes, proofs."),
    (messages.Heartbeat, with_(heartbeat(), "phase", 3), "phase",
     "Field 'phase' must be a string, got int."),
    (messages.Heartbeat, [], "body", "Field 'body' must be an object, got list."),
    (messages.Heartbeat, None, "body", "Field 'body' must be an object, got null."),
    (messages.Heartbeat, "x", "body", "Field 'body' must be an object, got str."),
    (messages.LogBatch, {"lines": [{"ts": 1.0, "source": "a", "text": "t"}] * 1001},
     "lines", "Field 'lines' holds more than 1000 items."),
    (messages.LogBatch, {"lines": [{"ts": 1.0, "source": "a", "text": "t" * 8193}]},
     "lines[0].text", "Field 'lines[0].text' is longer than 8192 characters."),
    (messages.Directive, {"action": "continue", "reason": "", "next_heartbeat_s": 0,
                          "min_rate_per_hour": None}, "next_heartbeat_s",
     "Field 'next_heartbeat_s' must be at least 1."),
    (messages.ResultAck, {"ok": 1, "duplicate": False, "directive": {}}, "ok",
     "Field 'ok' must be a boolean, got int."),
    (messages.Result, {"result_id": "r", "kind": "scaling", "proof_type": "p",
                       "started_at": 1, "finished_at": 2, "gpus_used": [0, 1],
                       "proofs_completed": 4, "proofs_failed": 0, "wall_seconds": 1,
                       "rate_per_hour": 1, "proof_seconds": [], "telemetry": None},
     "runs", "Field 'runs' is required for a scaling result."),
    (messages.Result, {"result_id": "r", "kind": "benchmark", "proof_type": "p",
                       "started_at": 1, "finished_at": 2, "gpus_used": [0, True],
                       "proofs_completed": 4, "proofs_failed": 0, "wall_seconds": 1,
                       "rate_per_hour": 1, "proof_seconds": [], "telemetry": None},
     "gpus_used[1]", "Field 'gpus_used[1]' must be an integer, got boolean."),
]


@pytest.mark.parametrize(("cls", "body", "field", "message"), EDGES)
def test_edge_cases(cls: type, body: Any, field: str | None, message: str) -> None:
    got = assert_follows_spec(cls, body)
    if field is None:
        assert got[0] == "ok", got
    else:
        assert got[0] == "error" and got[2:] == (field, message), got


def test_accepted_values_keep_their_types_and_every_field() -> None:
    body = with_(heartbeat(), "phase_started_at", 5)
    body["telemetry"]["cpu"]["per_core_util_pct_mean"] = [1, 2.5]
    hb = decode(messages.Heartbeat, orjson.dumps({**body, "future_field": {"x": [1]}}))
    assert type(hb.phase_started_at) is float and type(hb.seq) is int
    assert hb.telemetry is not None
    assert [type(v) for v in hb.telemetry.cpu.per_core_util_pct_mean] == [float, float]
    # A field with a default that the body left out is on the message, encoded as null
    # (the telemetry column keeps every field).
    assert hb.telemetry.cpu.quota_cores is None and hb.failure is None
    assert orjson.loads(encode(hb))["telemetry"]["cpu"]["quota_cores"] is None
    assert orjson.loads(encode(hb))["failure"] is None


def test_what_json_cannot_carry_is_malformed() -> None:
    for text in (b'{"seq": NaN}', b'{"seq": 1', orjson.dumps(heartbeat()) + b" x",
                 b'\xef\xbb\xbf{}',
                 b'{"failure": "\xff"}', b'{"failure": "\\ud800"}',
                 b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"):
        with pytest.raises(ProtocolError) as err:
            decode(messages.Heartbeat, text)
        assert err.value.code == "malformed_json" and err.value.field is None, text
    with pytest.raises(ProtocolError) as err:
        decode(messages.Heartbeat, '{"failure": "\ud800"}')  # a str no UTF-8 can hold
    assert err.value.code == "malformed_json"


def test_where_the_decoder_before_msgspec_said_otherwise() -> None:
    # A number JSON writes but no float holds names its field (orjson called the whole
    # body malformed).
    body = orjson.dumps(heartbeat()).replace(b'"phase_started_at":1700000000.0',
                                             b'"phase_started_at":1e999')
    with pytest.raises(ProtocolError) as err:
        decode(messages.Heartbeat, body)
    assert (err.value.code, err.value.field) == ("invalid_field", "phase_started_at")
    assert err.value.message == "Field 'phase_started_at' is a number out of range."
    # An integer beyond 64 bits is named as such (orjson read it as a float).
    body = orjson.dumps(heartbeat()).replace(b'"seq":7', b'"seq":18446744073709551616')
    with pytest.raises(ProtocolError) as err:
        decode(messages.Heartbeat, body)
    assert err.value.message == "Field 'seq' is outside the signed 64-bit range."
    # Of two bad fields the first in the body is named (before: the first in the class).
    both = with_(with_(heartbeat(), "telemetry.samples", -1), "seq", "7")
    assert outcome(lambda v: from_obj(messages.Heartbeat, v), both)[2] == "seq"
    reordered = {"telemetry": both["telemetry"], **both}
    assert outcome(lambda v: from_obj(messages.Heartbeat, v), reordered)[2] == (
        "telemetry.samples")
    # An unknown field is skipped unread, so what it holds cannot refuse the body.
    ignored = orjson.dumps(heartbeat())[:-1] + b',"later":[1e999,"\xff"]}'
    assert decode(messages.Heartbeat, ignored).seq == 7
    # A key given twice: the last one counts, as orjson had it.
    twice = orjson.dumps(heartbeat()).replace(b'"seq":7', b'"seq":7,"seq":8')
    assert decode(messages.Heartbeat, twice).seq == 8


def test_python_values_from_obj_is_handed_are_checked_like_json() -> None:
    # from_obj takes parsed JSON (the store's columns); a float it gets is checked too.
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ProtocolError) as err:
            from_obj(messages.Heartbeat, with_(heartbeat(), "phase_started_at", 0) | {
                "phase_started_at": bad})
        assert err.value.message == "Field 'phase_started_at' must be finite."
    cpu = {"util_pct_mean": 1.0, "load1": None, "iowait_pct_mean": None}
    for bad, where in (([1.0, "x"], "[1]"), ([1.0, True], "[1]"), ([None], "[0]")):
        with pytest.raises(ProtocolError) as err:
            from_obj(messages.CpuTelemetry, {**cpu, "per_core_util_pct_mean": bad})
        assert err.value.field == "per_core_util_pct_mean" + where
