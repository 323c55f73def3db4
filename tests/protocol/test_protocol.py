"""The wire contract: keys, signatures, codec and nonce memory (docs/protocol.md)."""

from __future__ import annotations

import hashlib
import hmac
import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vast_manager.protocol import (
    Directive,
    Gpu,
    Heartbeat,
    Hello,
    HostInfo,
    LogBatch,
    ProtocolError,
    Result,
    decode,
    encode,
    signing,
)
from vast_manager.protocol.nonces import NonceMemory, NonceVerdict

SECRET = bytes(range(32))
AGENT = "ag_0123456789abcdef0123"


def test_agent_key_known_answer() -> None:
    expected = hmac.new(SECRET, b"vast-manager agent key v1:" + AGENT.encode(), hashlib.sha256)
    assert signing.derive_agent_key(SECRET, AGENT) == expected.digest()
    assert len(signing.derive_agent_key(SECRET, AGENT)) == 32


def test_fleet_id_is_sha256_prefix() -> None:
    assert signing.fleet_id(SECRET) == hashlib.sha256(SECRET).hexdigest()[:8]


def test_request_signature_known_answer() -> None:
    key = hmac.new(SECRET, b"vast-manager agent key v1:" + AGENT.encode(), hashlib.sha256).digest()
    body = b'{"seq":1}'
    canonical = (
        "vm1-req\n1764460000\n"
        + "ab" * 16
        + "\nPOST\n/v1/heartbeat\n"
        + hashlib.sha256(body).hexdigest()
    ).encode()
    expected = "v1=" + hmac.new(key, canonical, hashlib.sha256).hexdigest()
    got = signing.sign_request(key, "1764460000", "ab" * 16, "POST", "/v1/heartbeat", body)
    assert got == expected
    # Every signed part counts: another second is another signature.
    assert signing.sign_request(key, "1764460001", "ab" * 16, "POST", "/v1/heartbeat",
                                body) != expected


def test_request_headers_sign_the_empty_body() -> None:
    key = b"k" * 32
    headers = signing.request_headers(AGENT, key, 1764460000, "cd" * 16, "POST", "/v1/hello", b"")
    canonical = (
        "vm1-req\n1764460000\n"
        + "cd" * 16
        + "\nPOST\n/v1/hello\n"
        + hashlib.sha256(b"").hexdigest()
    ).encode()
    assert headers["X-VM-Signature"] == "v1=" + hmac.new(key, canonical, hashlib.sha256).hexdigest()
    assert headers["X-VM-Agent"] == AGENT
    assert headers["X-VM-Timestamp"] == "1764460000"


def test_response_signature_known_answer() -> None:
    key = b"k" * 32
    body = b'{"action":"continue"}'
    canonical = ("vm1-resp\n" + "ef" * 16 + "\n200\n" + hashlib.sha256(body).hexdigest()).encode()
    expected = "v1=" + hmac.new(key, canonical, hashlib.sha256).hexdigest()
    assert signing.sign_response(key, "ef" * 16, 200, body) == expected
    assert signing.verify_response(key, expected, "ef" * 16, 200, body)
    assert not signing.verify_response(key, expected, "ef" * 16, 409, body)
    assert not signing.verify_response(key, None, "ef" * 16, 200, body)
    assert not signing.verify_response(b"x" * 32, expected, "ef" * 16, 200, body)


def test_parse_secrets_newest_first_and_errors_hide_values() -> None:
    a, b = "11" * 32, "22" * 32
    assert signing.parse_secrets(f"{a}, {b}") == [bytes.fromhex(a), bytes.fromhex(b)]
    with pytest.raises(ValueError) as err:
        signing.parse_secrets(f"{a},zz{b}")
    assert "#2" in str(err.value) and b not in str(err.value)
    with pytest.raises(ValueError, match="shorter"):
        signing.parse_secrets("abcd")


def test_id_and_nonce_shapes() -> None:
    assert signing.is_agent_id(AGENT)
    assert not signing.is_agent_id("ag_0123456789ABCDEF0123")
    assert not signing.is_agent_id(AGENT + "0")
    assert signing.is_nonce("0" * 32)
    assert not signing.is_nonce("0" * 31)


def _hello() -> Hello:
    return Hello(
        protocol=1,
        agent_version="0.1.0",
        boot_id="b" * 32,
        container_id=None,
        host=HostInfo(
            hostname="h",
            cpu_model="cpu",
            cpu_cores_logical=32,
            cpu_cores_physical=16,
            ram_total_bytes=1 << 38,
            driver_version=None,
            cuda_version=None,
            gpus=[Gpu(0, "GPU-x", "RTX 4090", 24 << 30, 4, 16, 4, 16)],
        ),
    )


def test_hello_round_trip() -> None:
    hello = _hello()
    assert decode(Hello, encode(hello)) == hello


def test_unknown_fields_are_ignored() -> None:
    obj = orjson.loads(encode(_hello()))
    obj["future_field"] = {"anything": [1, 2]}
    obj["host"]["gpus"][0]["new"] = 1
    assert decode(Hello, orjson.dumps(obj)) == _hello()


def test_unsupported_protocol_lists_supported() -> None:
    obj = orjson.loads(encode(_hello()))
    obj["protocol"] = 2
    with pytest.raises(ProtocolError) as err:
        decode(Hello, orjson.dumps(obj))
    assert err.value.code == "unsupported_protocol"
    assert "1" in err.value.message


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda o: o.__setitem__("seq", "1"), "seq"),
        (lambda o: o.__setitem__("seq", True), "seq"),
        (lambda o: o.__setitem__("seq", -1), "seq"),
        (lambda o: o.__setitem__("phase", "dancing"), "phase"),
        (lambda o: o.pop("phase_started_at"), "phase_started_at"),
        (
            lambda o: o.__setitem__("progress", {"done": 1, "total": 2, "unit": "kg"}),
            "progress.unit",
        ),
        (lambda o: o.__setitem__("proof_seconds_recent", [1.0, "x"]), "proof_seconds_recent[1]"),
        (lambda o: o.__setitem__("proof_seconds_recent", [-1.0]), "proof_seconds_recent[0]"),
        (lambda o: o.__setitem__("telemetry", []), "telemetry"),
    ],
)
def test_bad_heartbeat_names_the_field(mutate, field) -> None:  # type: ignore[no-untyped-def]
    obj = {
        "seq": 1,
        "phase": "benchmarking",
        "phase_started_at": 1.5,
        "progress": {"done": 1, "total": 12, "unit": "proofs"},
        "proofs_completed_total": 0,
        "proof_seconds_recent": [41.0],
        "telemetry": None,
    }
    decode(Heartbeat, orjson.dumps(obj))  # the unmutated one is valid
    mutate(obj)
    with pytest.raises(ProtocolError) as err:
        decode(Heartbeat, orjson.dumps(obj))
    assert err.value.code == "invalid_field"
    assert err.value.field == field
    assert field in err.value.message


def test_malformed_json() -> None:
    with pytest.raises(ProtocolError) as err:
        decode(Directive, b'{"action": ')
    assert err.value.code == "malformed_json"
    with pytest.raises(ProtocolError) as err:
        decode(Directive, b"NaN")
    assert err.value.code == "malformed_json"


def test_top_level_must_be_object() -> None:
    with pytest.raises(ProtocolError) as err:
        decode(LogBatch, b"[]")
    assert err.value.field == "body"


def test_scaling_result_requires_its_fields() -> None:
    base = {
        "result_id": "r1",
        "kind": "scaling",
        "proof_type": "porep-c2-32g",
        "started_at": 1.0,
        "finished_at": 2.0,
        "gpus_used": [0, 1],
        "proofs_completed": 4,
        "proofs_failed": 0,
        "wall_seconds": 100.0,
        "rate_per_hour": 144.0,
        "proof_seconds": [50.0] * 4,
        "telemetry": None,
    }
    with pytest.raises(ProtocolError) as err:
        decode(Result, orjson.dumps(base))
    assert err.value.field == "runs"
    base["kind"] = "benchmark"
    assert decode(Result, orjson.dumps(base)).runs is None


def test_log_batch_bounded() -> None:
    lines = [{"ts": 1.0, "source": "agent", "text": "x"}] * 1001
    with pytest.raises(ProtocolError) as err:
        decode(LogBatch, orjson.dumps({"lines": lines}))
    assert err.value.field == "lines"


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda children: st.lists(children) | st.dictionaries(st.text(), children),
        max_leaves=20,
    )
)
def test_any_json_decodes_or_raises_protocol_error(value: object) -> None:
    for cls in (Hello, Heartbeat, Result, LogBatch, Directive):
        try:
            decode(cls, json.dumps(value).encode())
        except ProtocolError as err:
            assert err.code in {"invalid_field", "malformed_json", "unsupported_protocol"}


def test_nonce_memory_replay_and_expiry() -> None:
    mem = NonceMemory(window_s=300, max_per_agent=3)
    now = 10_000.0
    assert mem.check_and_remember(AGENT, "a" * 32, 10_000, now) is NonceVerdict.OK
    assert mem.check_and_remember(AGENT, "a" * 32, 10_000, now) is NonceVerdict.REPLAYED
    # another agent may use the same nonce
    assert mem.check_and_remember("ag_" + "f" * 20, "a" * 32, 10_000, now) is NonceVerdict.OK
    assert mem.check_and_remember(AGENT, "b" * 32, 9_000, now) is NonceVerdict.STALE
    assert mem.check_and_remember(AGENT, "b" * 32, 10_001, now) is NonceVerdict.OK
    assert mem.check_and_remember(AGENT, "c" * 32, 10_002, now) is NonceVerdict.OK
    assert mem.check_and_remember(AGENT, "d" * 32, 10_002, now) is NonceVerdict.TOO_MANY
    # once the window has passed, the memory empties itself
    later = now + 700
    assert mem.check_and_remember(AGENT, "e" * 32, int(later), later) is NonceVerdict.OK
    assert len(mem) == 2  # e for AGENT, a for the other agent (not yet purged)


def test_nonce_memory_late_arrivals_never_cause_a_false_refusal() -> None:
    mem = NonceMemory(window_s=300, max_per_agent=3)
    # A late arrival (older timestamp) lands behind a newer one: the cheap purge from the
    # oldest stops at the newer one, so the expired late one is still held...
    assert mem.check_and_remember(AGENT, "a" * 32, 10_200, 10_200.0) is NonceVerdict.OK
    assert mem.check_and_remember(AGENT, "b" * 32, 10_000, 10_250.0) is NonceVerdict.OK
    # ...but it is still remembered while inside the window, and a replay is refused.
    assert mem.check_and_remember(AGENT, "b" * 32, 10_000, 10_260.0) is NonceVerdict.REPLAYED
    now = 10_400.0  # b expired (10,301), a has not (10,501)
    assert mem.check_and_remember(AGENT, "c" * 32, 10_400, now) is NonceVerdict.OK
    assert len(mem) == 3  # b is held behind a
    # At the limit the memory looks at every nonce before refusing: b goes, d is taken.
    assert mem.check_and_remember(AGENT, "d" * 32, 10_400, now) is NonceVerdict.OK
    assert mem.check_and_remember(AGENT, "e" * 32, 10_400, now) is NonceVerdict.TOO_MANY


def test_nonce_memory_refuses_timestamps_before_restart() -> None:
    mem = NonceMemory(not_before=10_000)
    assert mem.check_and_remember(AGENT, "a" * 32, 10_000, 10_000.5) is NonceVerdict.STALE
    assert mem.check_and_remember(AGENT, "a" * 32, 10_001, 10_001.0) is NonceVerdict.OK


def test_frozen_vectors_pin_the_wire_bytes() -> None:
    """Literal answers, written down once from docs/protocol.md and never recomputed: a
    change to the canonical strings breaks every deployed agent, and must break this."""
    key = signing.derive_agent_key(SECRET, AGENT)
    assert key.hex() == "90feb8a428ee80c2e0001c0be76292fded66b4853143b2905716ec4b1896e2f4"
    assert signing.sign_request(
        key, "1764460000", "ab" * 16, "POST", "/v1/heartbeat", b'{"seq":1}'
    ) == "v1=fc1f5c220f2b884a5e14cf866c9241b8312076a7746a46df318ec8bfb243cb31"
    assert signing.sign_response(
        b"k" * 32, "ef" * 16, 200, b'{"action":"continue"}'
    ) == "v1=fc488500dd3cc134c28765284e1e2277bc13e9371228de7ab0d27dbc5af5ec3f"
