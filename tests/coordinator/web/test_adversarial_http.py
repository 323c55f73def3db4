"""The open internet against a real coordinator: strangers' bodies, slow senders, log
floods, token guessing and display spoofing.

The server-level defences are played against ``start_server`` (the one-process
coordinator the CLI runs, on a loopback port, from a thread) or a ``vast-manager serve``
process; the throttling, whose window must pass, against ``create_app`` with an injected
clock. The attacks that held before (no script from hostile markup in the dashboard,
CSRF, sessions and authorisation, no 5xx under schemathesis, no secret anywhere) stay in
``test_dashboard.py``, ``test_fuzz_openapi.py``, ``test_fuzz_raw.py`` and
``test_secrets.py``; ``docs/reliability.md`` lists them all.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from vast_manager.coordinator import textsafe
from vast_manager.coordinator.cli.commands import cli
from vast_manager.coordinator.settings import Settings
from vast_manager.coordinator.web import server as server_module
from vast_manager.coordinator.web.core import CORE
from vast_manager.coordinator.web.logs import RedactingFormatter
from vast_manager.coordinator.web.metrics import label_text

from support.coord_support import (
    ADMIN,
    ADMIN_TOKEN,
    SECRET_HEX,
    Harness,
    ServerThread,
    agent_key,
    heartbeat_msg,
    hello_msg,
    start,
)
from support.fakes_provider import FakeProvider, offer
from support.fault_support import (
    TEST_MARKER_ENV,
    CoordinatorProcess,
    admin_call,
    http,
    kill_marked,
    process_env,
    signed_headers,
)
from support.paths import REPO_ROOT
from support.tools import require_tool

ROOT = REPO_ROOT
MIB = 1024 * 1024
NEVER_ISSUED = "ag_" + "0" * 20
#: Every kind of character that must not reach a screen as it is.
SPOOFS = "\u202e\u2066\u200e\u200f\u061c\u2028\u2029\u009b\x1b\x07\ufeff"


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def raw_exchange(port: int, data: bytes, *, timeout_s: float = 30.0,
                 source: str = "127.0.0.1") -> tuple[int | None, bytes, float]:
    """Send ``data`` (a request head, maybe part of a body) and read the answer: (status or
    None when none came within ``timeout_s``, the bytes read, seconds until the first
    byte). The default wait is half the coordinator's 60 s body deadline, so an answer to
    a request whose body never comes was given before that deadline, not by it.
    ``source``: the address it comes from (any of 127/8 on Linux's loopback)."""
    sock = socket.create_connection(("127.0.0.1", port), source_address=(source, 0))
    try:
        sock.sendall(data)
        sock.settimeout(timeout_s)
        started = time.monotonic()
        chunks: list[bytes] = []
        first: float | None = None
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                first = first if first is not None else time.monotonic() - started
                chunks.append(chunk)
                raw = b"".join(chunks)
                head, sep, body = raw.partition(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), None)
                if sep and length is not None and len(body) >= length:
                    break
        except TimeoutError:
            pass
        raw = b"".join(chunks)
        status = int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/1.1 ") else None
        return status, raw, first if first is not None else timeout_s
    finally:
        sock.close()


def head(path: str, headers: dict[str, str], content_length: int) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
             f"Content-Length: {content_length}",
             *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def body_of(raw: bytes) -> dict[str, Any]:
    return dict(orjson.loads(raw.partition(b"\r\n\r\n")[2]))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ServerThread]:
    with ServerThread(tmp_path) as thread:
        # Timestamps at or before the start second are refused: let it pass.
        start_second = int(time.time())
        while int(time.time()) <= start_second:
            time.sleep(0.05)
        yield thread


def issue(thread: ServerThread, label: str = "rig") -> tuple[str, bytes]:
    issued = admin_call(thread.server.url, "POST", "/api/agents", {"label": label})
    return issued["agent_id"], bytes.fromhex(issued["agent_key"])


# --- nothing buffered for a stranger --------------------------------------------------------


@pytest.mark.parametrize("who", ["never_issued", "revoked", "malformed_id", "malformed_headers"])
def test_a_stranger_is_answered_before_its_body_arrives(served: ServerThread, who: str) -> None:
    """A 1 MiB body declared, none of it sent: the refusal comes without the body, so
    before the 60 s deadline (``raw_exchange`` waits half of it)."""
    agent_id, key = issue(served)
    if who == "revoked":
        admin_call(served.server.url, "POST", f"/api/agents/{agent_id}/revoke")
    headers = signed_headers(agent_id, key, "POST", "/v1/result", b"x" * MIB)
    if who == "never_issued":
        headers["X-VM-Agent"] = NEVER_ISSUED
    elif who == "malformed_id":
        headers["X-VM-Agent"] = "ag_" + "Z" * 500
    elif who == "malformed_headers":
        headers["X-VM-Signature"] = "v2=" + "0" * 64
    status, raw, _ = raw_exchange(port_of(served.server.url), head("/v1/result", headers, MIB))
    assert status == 401, raw[:300]
    expected = "bad_signature" if who == "malformed_headers" else "unknown_agent"
    assert body_of(raw)["error"] == expected
    assert b"Connection: close" in raw.partition(b"\r\n\r\n")[0]
    assert b"X-VM-Signature" not in raw  # never signed: nothing was verified
    core = served.server.app[CORE]
    assert core.guard.budget.in_flight_bytes == 0
    assert core.guard.counters.refused[expected] >= 1


def test_a_connection_is_read_a_little_at_a_time(served: ServerThread) -> None:
    """What arrives before the agent is known is read 16 KiB at a time, not asyncio's
    256 KiB: the head of a stranger's request brings little of its body with it. (This
    sets a transport attribute asyncio does not document: if it ever stops taking effect,
    this fails, and ``test_adversarial_memory.py``'s bound is at risk under load.)"""
    sock = socket.create_connection(("127.0.0.1", port_of(served.server.url)))
    try:
        server = served.server.runner.server
        deadline = time.monotonic() + 30
        while not server.connections and time.monotonic() < deadline:
            time.sleep(0.02)
        (handler,) = server.connections  # a copy each time it is read
        assert handler.transport.max_size == server_module.SOCKET_READ_BYTES == 16 * 1024
    finally:
        sock.close()


def test_a_body_declared_over_1_mib_is_413_first(served: ServerThread) -> None:
    # docs/protocol.md's order: the size before the agent, even for a stranger.
    headers = signed_headers(NEVER_ISSUED, b"k" * 32, "POST", "/v1/logs", b"")
    status, raw, _ = raw_exchange(port_of(served.server.url),
                                  head("/v1/logs", headers, 2 * MIB))
    assert status == 413 and body_of(raw)["error"] == "body_too_large"


def test_bodies_in_flight_are_bounded_per_address_and_in_total(served: ServerThread) -> None:
    """A key holder (a hostile host has its own key) sending slowly: until a body's
    signature verifies it is held against the sender's address, so its third 1 MiB body
    is refused at once, and with the total spent, others' large bodies too; a good
    agent's heartbeat (already whole when its head is read) is still answered."""
    url = served.server.url
    port = port_of(url)
    core = served.server.app[CORE]
    from vast_manager.coordinator.web.guard import AGENT_IN_FLIGHT_MAX_BYTES, BodyBudget

    # Small, so three senders fill it; an address's share as one agent's.
    core.guard.budget = BodyBudget(total_bytes=3 * MIB,
                                   per_address_bytes=AGENT_IN_FLIGHT_MAX_BYTES)
    hostile = [issue(served, f"hostile-{i}") for i in range(2)]
    good_id, good_key = issue(served, "good")
    body = orjson.dumps(hello_msg("boot-good"))
    assert http(url + "/v1/hello", "POST", body,
                signed_headers(good_id, good_key, "POST", "/v1/hello", body))[0] == 200

    held: list[socket.socket] = []

    def hold(agent_id: str, key: bytes, source: str) -> None:
        sock = socket.create_connection(("127.0.0.1", port), source_address=(source, 0))
        headers = signed_headers(agent_id, key, "POST", "/v1/logs", b"")
        sock.sendall(head("/v1/logs", headers, MIB) + b'{"lines": [')  # and then nothing
        held.append(sock)

    try:
        hold(*hostile[0], "127.0.0.2")
        hold(*hostile[0], "127.0.0.2")
        deadline = time.monotonic() + 30
        while core.guard.budget.in_flight_bytes < 2 * MIB and time.monotonic() < deadline:
            time.sleep(0.02)
        assert core.guard.budget.in_flight_bytes == 2 * MIB
        # The same address's third: over its own share.
        headers = signed_headers(*hostile[0], "POST", "/v1/logs", b"")
        status, raw, _ = raw_exchange(port, head("/v1/logs", headers, MIB), source="127.0.0.2")
        assert status == 503 and body_of(raw)["error"] == "busy", raw[:300]
        assert b"Retry-After: 1" in raw
        assert body_of(raw)["message"].startswith("This address already has")
        # Another address's: within its share, the total now spent by the first two.
        hold(*hostile[1], "127.0.0.3")
        while core.guard.budget.in_flight_bytes < 3 * MIB and time.monotonic() < deadline:
            time.sleep(0.02)
        headers = signed_headers(*hostile[1], "POST", "/v1/logs", b"")
        status, raw, _ = raw_exchange(port, head("/v1/logs", headers, 512 * 1024),
                                      source="127.0.0.4")
        assert status == 503 and "too many request bodies" in body_of(raw)["message"]
        # A good heartbeat is answered throughout.
        hb = orjson.dumps(heartbeat_msg(1, "proving"))
        status, raw_hb, _ = http(url + "/v1/heartbeat", "POST", hb,
                                 signed_headers(good_id, good_key, "POST", "/v1/heartbeat", hb))
        assert status == 200, raw_hb
    finally:
        for sock in held:
            sock.close()
    # The senders went away: everything they claimed is released.
    deadline = time.monotonic() + 30
    while core.guard.budget.in_flight_bytes and time.monotonic() < deadline:
        time.sleep(0.02)
    assert core.guard.budget.in_flight_bytes == 0


def test_an_agent_id_alone_cannot_hold_that_agents_upload_allowance(
    served: ServerThread,
) -> None:
    """Replays the probe: a stranger who read an agent's id in a vast.ai label opens
    slow bodies under it (unsigned: it has no key). They are held against the stranger's
    address, so the agent's own 160 KB log batch from its address is answered 200, and
    the agent's allowance is charged only once its signature verified."""
    url = served.server.url
    port = port_of(url)
    core = served.server.app[CORE]
    agent_id, key = issue(served, "victim")
    body = orjson.dumps(hello_msg("boot-victim"))
    assert http(url + "/v1/hello", "POST", body,
                signed_headers(agent_id, key, "POST", "/v1/hello", body))[0] == 200
    held: list[socket.socket] = []
    try:
        forged = signed_headers(agent_id, b"x" * 32, "POST", "/v1/logs", b"")
        for _ in range(2):
            sock = socket.create_connection(("127.0.0.1", port),
                                            source_address=("127.0.0.9", 0))
            sock.sendall(head("/v1/logs", forged, MIB) + b'{"lines": [')
            held.append(sock)
        deadline = time.monotonic() + 30
        while core.guard.budget.in_flight_bytes < 2 * MIB and time.monotonic() < deadline:
            time.sleep(0.02)
        assert core.guard.budget.in_flight_bytes == 2 * MIB  # the stranger's, held
        lines = [{"ts": 1.0, "source": "agent", "text": "x" * 1000} for _ in range(160)]
        batch = orjson.dumps({"lines": lines})
        assert len(batch) > 160_000
        status, raw, _ = http(url + "/v1/logs", "POST", batch,
                              signed_headers(agent_id, key, "POST", "/v1/logs", batch))
        assert status == 200, raw
    finally:
        for sock in held:
            sock.close()


def test_a_slow_body_is_cut_off_and_releases_its_claim(
    served: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vast_manager.coordinator.web import http as http_module

    monkeypatch.setattr(http_module, "BODY_READ_TIMEOUT_S", 1.0)
    agent_id, key = issue(served)
    headers = signed_headers(agent_id, key, "POST", "/v1/logs", b"")
    # 100 KB declared (over the 64 KiB that claim nothing), one byte sent.
    status, raw, first = raw_exchange(port_of(served.server.url),
                                      head("/v1/logs", headers, 100_000) + b"{")
    # Cut off by the coordinator (no answer would be None), after the 1 s it allows.
    assert status == 408 and body_of(raw)["error"] == "request_timeout"
    assert first > 0.9
    guard = served.server.app[CORE].guard
    assert guard.budget.in_flight_bytes == 0
    assert guard.counters.refused["request_timeout"] == 1


def test_a_login_body_is_read_whole_within_the_body_deadline(
    served: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The login is the one body a stranger may send (the token is in it): it too must
    arrive whole within the body deadline, and one sent in two parts is read whole."""
    from vast_manager.coordinator.web import http as http_module

    monkeypatch.setattr(http_module, "BODY_READ_TIMEOUT_S", 1.0)
    port = port_of(served.server.url)
    login = ("POST /auth/login HTTP/1.1\r\nHost: 127.0.0.1\r\n"
             "Content-Type: application/json\r\nContent-Length: {n}\r\n\r\n")
    status, raw, first = raw_exchange(port, login.format(n=100).encode() + b'{"tok')
    # Cut off by the coordinator (no answer would be None), after the 1 s it allows.
    assert status == 408 and body_of(raw)["error"] == "request_timeout", raw[:300]
    assert first > 0.9
    assert served.server.app[CORE].guard.counters.refused["request_timeout"] == 1
    # A body that comes in two packets is one body, not what the first one brought.
    body = orjson.dumps({"token": ADMIN_TOKEN})
    sock = socket.create_connection(("127.0.0.1", port))
    try:
        sock.sendall(login.format(n=len(body)).encode() + body[:5])
        time.sleep(0.3)
        sock.sendall(body[5:])
        sock.settimeout(30)
        answer = sock.recv(65536)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]


def test_parallel_logins_cannot_pass_the_limit_together(served: ServerThread) -> None:
    """Replays the probe: many logins from one address, each head sent before any body,
    so every one is past the limit check before the first token is compared. Each is
    counted when its head arrives: only the limit's 10 are compared at all (401), the
    rest refused (429) without their bodies read, and the right token, sent last, is
    refused too."""
    port = port_of(served.server.url)
    login = ("POST /auth/login HTTP/1.1\r\nHost: 127.0.0.1\r\n"
             "Content-Type: application/json\r\nContent-Length: {n}\r\n\r\n")
    wrong = orjson.dumps({"token": "w" * len(ADMIN_TOKEN)})
    right = orjson.dumps({"token": ADMIN_TOKEN})
    socks = []
    try:
        for body in [wrong] * 40 + [right]:
            sock = socket.create_connection(("127.0.0.1", port),
                                            source_address=("127.0.0.5", 0))
            sock.sendall(login.format(n=len(body)).encode())
            socks.append((sock, body))
        time.sleep(0.5)  # every head is in: a check-then-count would admit all of them
        statuses = []
        for sock, body in socks:
            with contextlib.suppress(OSError):  # a refused one may be closed already
                sock.sendall(body)
        for sock, _ in socks:
            sock.settimeout(30)
            answer = sock.recv(65536)
            statuses.append(int(answer.split(b" ", 2)[1]))
    finally:
        for sock, _ in socks:
            sock.close()
    assert statuses.count(401) == 10, statuses
    assert statuses.count(429) == 31, statuses
    assert statuses[-1] == 429  # the right token, after the limit, is never compared


def test_a_request_head_that_never_ends_is_cut_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "HEAD_TIMEOUT_S", 1.0, raising=False)
    with ServerThread(tmp_path) as thread:
        port = port_of(thread.server.url)
        silent = socket.create_connection(("127.0.0.1", port))
        trickle = socket.create_connection(("127.0.0.1", port))
        trickle.sendall(b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nX-VM-Agent: ag_")
        try:
            for sock in (silent, trickle):
                # Under the 20 s default: a close within it is the 1 s deadline's.
                sock.settimeout(15)
                assert sock.recv(100) == b""  # closed by the coordinator
        finally:
            silent.close()
            trickle.close()
        # A connection that did send its head in time is answered as ever.
        assert http(thread.server.url + "/openapi.json")[0] == 200
        assert thread.server.app[CORE].guard.counters.refused["head_timeout"] == 2


# --- logs stay readable ----------------------------------------------------------------------

MALFORMED = [
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"
    b"hello",
    b"POST /v1/heartbeat HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"zz\r\nhi\r\n0\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,
    b"G\x00T / HTTP/1.1\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"b" * 9000 + b"\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX: \x1b[2J\xe2\x80\xae\r\n\r\n" + b"\x00garbage\r\n\r\n",
]


def test_two_hundred_malformed_requests_add_fewer_than_two_hundred_log_lines(
    tmp_path: Path
) -> None:
    """Acceptance 4, against ``vast-manager serve`` in its own process: before, 200 of
    these wrote 1,462 lines (a traceback each); now one line per kind and minute."""
    env = process_env(tmp_path)
    coord = CoordinatorProcess(tmp_path, env, provider="local")
    log_path = tmp_path / "coordinator.log"
    try:
        coord.start()
        lines_before = log_path.read_text(errors="replace").count("\n")
        for i in range(200):
            raw_exchange(coord.port, MALFORMED[i % len(MALFORMED)], timeout_s=2)
        # The good path still answers, and /metrics counts what the log left out.
        status, raw, _ = http(coord.url + "/metrics", headers={"Authorization":
                                                               f"Bearer {ADMIN_TOKEN}"})
        assert status == 200
        text = raw.decode()
        malformed = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                        if line.startswith("vm_malformed_requests_total{"))
        suppressed = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                         if line.startswith("vm_log_lines_suppressed_total "))
        added = log_path.read_text(errors="replace").count("\n") - lines_before
        print(f"200 malformed requests: {added} log lines added, {malformed:.0f} counted in "
              f"vm_malformed_requests_total, {suppressed:.0f} in vm_log_lines_suppressed_total")
        assert added < 200
        assert added <= 2 * len(MALFORMED)  # one a kind (and a summary now and then)
        assert malformed >= 180  # every one the HTTP parser refused (a few answer 4xx)
        log_text = log_path.read_text(errors="replace")
        assert "Traceback" not in log_text
        assert "\x1b" not in log_text and "\u202e" not in log_text
    finally:
        coord.kill()
        kill_marked(env[TEST_MARKER_ENV])


def test_log_lines_show_host_text_as_text() -> None:
    record = logging.LogRecord("coordinator", logging.WARNING, __file__, 1,
                               "agent says %s", (f"hi{SPOOFS}\nFAKE 12:00 ERROR forged",), None)
    line = RedactingFormatter([], "%(levelname)s %(message)s").format(record)
    assert "\n" not in line and not any(c in line for c in SPOOFS)
    assert "\\u202e" in line


# --- operator credentials resist guessing ---------------------------------------------------


async def test_wrong_bearer_tokens_are_throttled_per_address(aiohttp_client: Any,
                                                             tmp_path: Path) -> None:
    h = await start(aiohttp_client, tmp_path)
    wrong = {"Authorization": "Bearer " + "guess-" + secrets.token_hex(8)}
    for _ in range(10):
        status, data = await h.admin("GET", "/api/instances", headers=wrong)
        assert (status, data["error"]) == (401, "unauthorized")
    resp = await h.client.get("/api/instances", headers=wrong)
    data = await resp.json()
    assert resp.status == 429 and data["error"] == "too_many_attempts"
    wait = int(resp.headers["Retry-After"])
    assert 1 <= wait <= 60
    assert data["message"] == ("Too many failed admin-token attempts from this address; "
                               f"try again in {wait} s.")
    # While locked, even the right token is not compared: a guesser learns nothing.
    status, data = await h.admin("GET", "/api/instances")
    assert (status, data["error"]) == (429, "too_many_attempts")
    status, _ = await h.admin("GET", "/metrics")
    assert status == 429
    h.clock.advance(wait)
    status, data = await h.admin("GET", "/api/instances")
    assert (status, data) == (200, [])
    resp = await h.client.get("/metrics", headers=ADMIN)
    text = await resp.text()
    # The 11th guess, the right token while locked, /metrics while locked.
    assert 'vm_refused_requests_total{code="too_many_attempts"} 3' in text
    assert 'vm_refused_requests_total{code="unauthorized"} 10' in text


async def test_failed_dashboard_logins_are_throttled(aiohttp_client: Any, tmp_path: Path) -> None:
    h = await start(aiohttp_client, tmp_path)

    async def login(token: str) -> Any:
        return await h.client.post("/auth/login", data=orjson.dumps({"token": token}),
                                   headers={"Content-Type": "application/json"})

    for _ in range(10):
        assert (await login("not-the-token-" + secrets.token_hex(4))).status == 401
    resp = await login(ADMIN_TOKEN)
    data = await resp.json()
    assert resp.status == 429 and data["error"] == "too_many_attempts"
    assert data["message"].startswith("Too many failed logins from this address; try again in")
    assert int(resp.headers["Retry-After"]) >= 1
    h.clock.advance(61)
    assert (await login(ADMIN_TOKEN)).status == 200


def test_the_throttle_groups_ipv6_by_64_and_forgets_the_oldest() -> None:
    from vast_manager.coordinator.web.guard import CredentialThrottle, address_key

    assert address_key("2001:db8:1:2::1") == address_key("2001:db8:1:2:ffff::9")
    assert address_key("2001:db8:1:2::1") != address_key("2001:db8:1:3::1")
    assert address_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert address_key(None) == "local"
    now = [0.0]
    throttle = CredentialThrottle(lambda: now[0], max_failures=2, window_s=60,
                                  max_addresses=3)
    for addr in ("192.0.2.1", "192.0.2.1"):
        throttle.failed(addr)
    assert throttle.retry_after_s("192.0.2.1") == 60
    assert throttle.retry_after_s("192.0.2.2") is None
    for i in range(2, 6):
        throttle.failed(f"192.0.2.{i}")
    assert len(throttle) == 3  # bounded: the oldest address is forgotten
    now[0] = 61.0
    assert throttle.retry_after_s("192.0.2.1") is None


@pytest.mark.parametrize(
    ("token", "words"),
    [
        ("short-token", "at least 16 characters"),
        ("x" * 20, "at least 6 different characters"),
        ("abcabcabcabcabcabc", "at least 6 different characters"),
        ("twelve words with spaces", "printable ASCII without spaces"),
        ("t\u00f6ken-0123456789abc", "printable ASCII without spaces"),
    ],
)
def test_tokens_too_weak_to_resist_guessing_are_refused_at_start(
    tmp_path: Path, token: str, words: str
) -> None:
    with pytest.raises(ValueError, match=words) as err:
        Settings.from_env({"VM_ADMIN_TOKEN": token, "VM_FLEET_SECRET": SECRET_HEX},
                          config_dir=str(tmp_path))
    assert token not in str(err.value)


def test_serve_refuses_a_weak_token(tmp_path: Path) -> None:
    env = {**os.environ, "VM_ADMIN_TOKEN": "a" * 32, "VM_FLEET_SECRET": SECRET_HEX,
           "VM_CONFIG_DIR": str(tmp_path / "config"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "vast_manager.coordinator.cli", "serve", "--db",
                           str(tmp_path / "c.db"), "--port", "0"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2  # a setting that cannot work
    assert "VM_ADMIN_TOKEN must hold at least 6 different characters" in proc.stderr
    assert "a" * 32 not in proc.stderr


# --- host text is shown as text --------------------------------------------------------------


def test_one_neutralising_function_covers_every_character() -> None:
    for first, last in textsafe.UNSAFE_TEXT_RANGES:
        for code in (first, last):
            shown = textsafe.neutralise(f"a{chr(code)}b")
            assert chr(code) not in shown
            assert shown in ("a b", f"a\\u{code:04x}b", f"a\\U{code:08x}b")
    assert textsafe.neutralise("plain ASCII and ünïcödé") == "plain ASCII and ünïcödé"
    hostile = f"rig{SPOOFS}name"
    # The CLI and /metrics show the same text (the exposition then escapes it per the format).
    assert textsafe.clean(hostile) == textsafe.neutralise(hostile)
    assert label_text(hostile) == textsafe.neutralise(hostile)


def test_every_invisible_and_format_character_is_unsafe() -> None:
    """One definition: every code point of the unsafe categories (this Python's Unicode
    database) and the whole tags block; a tag-spelled text, a private-use glyph and a
    soft hyphen are shown as escapes, JSON output as JSON escapes (surrogate pairs)."""
    missed = [c for c in range(0x110000)
              if (unicodedata.category(chr(c)) in textsafe.UNSAFE_CATEGORIES
                  or 0xE0000 <= c <= 0xE007F) and not textsafe.has_unsafe(chr(c))]
    assert missed == []
    tagged = "gpu" + "".join(chr(0xE0000 + ord(ch)) for ch in "evil") + "\ue000\u00ad"
    assert textsafe.neutralise(tagged) == (
        "gpu\\U000e0065\\U000e0076\\U000e0069\\U000e006c\\ue000\\u00ad")
    as_json = textsafe.json_safe(json.dumps(tagged, ensure_ascii=False))
    assert as_json.isascii() and json.loads(as_json) == tagged


def test_the_dashboard_neutralises_with_the_same_definition(tmp_path: Path) -> None:
    node = require_tool("node", "the dashboard's script runs in it: apt-get install nodejs; "
                                ".ci/run does it")
    every = "".join(chr(c) for c in [*range(0x3000), *range(0xE000, 0xE100), 0xFEFF, 0xFFFD,
                                     *range(0x1D170, 0x1D180), *range(0xDFFF0, 0xE0090),
                                     0x10FFFD, 0x10FFFF])
    script = tmp_path / "check.js"
    script.write_text(textsafe.dashboard_script() + "\nconst fs = require('fs');\n"
                      "process.stdout.write(JSON.stringify(safeText("
                      "JSON.parse(fs.readFileSync(0, 'utf8')))));\n")
    out = subprocess.run([node, str(script)], input=json.dumps(every), capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert json.loads(out) == textsafe.neutralise(every)


async def test_the_dashboard_loads_its_neutraliser(h: Harness) -> None:
    resp = await h.client.get("/static/textsafe.js")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/javascript")
    assert await resp.text() == textsafe.dashboard_script()
    index = await (await h.client.get("/")).text()
    assert index.index("/static/textsafe.js") < index.index("/static/app.js")
    app_js = await (await h.client.get("/static/app.js")).text()
    # Every text and attribute the page builds goes through safeText.
    assert "document.createTextNode(safeText(child))" in app_js
    assert "setAttribute(name, value === true ? \"\" : safeText(value))" in app_js


def test_cli_shows_hostile_host_text_as_text(served: ServerThread) -> None:
    url = served.server.url
    agent_id, key = issue(served, "rig-spoof")
    hello = hello_msg("boot-spoof")
    hello["host"]["hostname"] = f"evil{SPOOFS}gnp.exe"
    hello["host"]["gpus"][0]["name"] = f"RTX{SPOOFS}4090"
    for path, payload in (
        ("/v1/hello", hello),
        ("/v1/logs", {"lines": [{"ts": time.time(), "source": f"cuzk{SPOOFS}",
                                 "text": f"line{SPOOFS}\nFAKE forged line"}]}),
    ):
        body = orjson.dumps(payload)
        assert http(url + path, "POST", body,
                    signed_headers(agent_id, key, "POST", path, body))[0] == 200
    inst = served.server.store.instance_by_agent(agent_id)
    assert inst is not None
    runner = CliRunner()
    env = {"VM_URL": url, "VM_ADMIN_TOKEN": ADMIN_TOKEN}
    for args in (["instance", str(inst["id"])], ["logs", str(inst["id"])], ["status"],
                 ["instance", str(inst["id"]), "--json"], ["status", "--json"]):
        result = runner.invoke(cli, args, env=env, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert not any(c in result.output for c in SPOOFS), (args, result.output)
        if "--json" in args:
            data = json.loads(result.output)  # the data itself is intact
            text = json.dumps(data, ensure_ascii=False)
            assert "\u202e" in text or args[0] == "status"
        else:
            assert "\\u202e" in result.output, (args, result.output)


def test_cli_shows_hostile_offer_text_as_text(tmp_path: Path) -> None:
    """Offer fields come from vast.ai's listing, which a host writes in part: the offers
    table shows them as text, ``--json`` keeps the data with the characters escaped."""
    hostile = offer(9100, 4300, gpu_name=f"RTX{SPOOFS}4090")
    hostile["geolocation"] = f"Quebec{SPOOFS}, CA\n[OK] verified"
    with ServerThread(tmp_path, FakeProvider([hostile, offer(9101, 4301)])) as thread:
        env = {"VM_URL": thread.server.url, "VM_ADMIN_TOKEN": ADMIN_TOKEN}
        for args in (["offers"], ["offers", "--json"]):
            result = CliRunner().invoke(cli, args, env=env, catch_exceptions=False)
            assert result.exit_code == 0, result.output
            assert not any(c in result.output for c in SPOOFS), (args, result.output)
            assert "\\u202e" in result.output, (args, result.output)
            if "--json" in args:
                rows = json.loads(result.output)
                assert any(r["gpu_name"] == f"RTX{SPOOFS}4090" for r in rows)
            else:
                assert "[OK] verified" in result.output
                assert not any(line.startswith("[OK]") for line in result.output.splitlines())


def test_cli_error_messages_show_hostile_text_as_text() -> None:
    """An error message quoting what a host sent reaches the terminal neutralised."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Hostile(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"error": "not_found",
                               "message": f"No machine {SPOOFS} here\n[OK] all fine"}).encode()
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    stub = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    thread = threading.Thread(target=stub.serve_forever, daemon=True)
    thread.start()
    try:
        result = CliRunner().invoke(
            cli, ["instance", "1"],
            env={"VM_URL": f"http://127.0.0.1:{stub.server_address[1]}",
                 "VM_ADMIN_TOKEN": ADMIN_TOKEN})
    finally:
        stub.shutdown()
        stub.server_close()
    assert result.exit_code == 1
    assert not any(c in result.output for c in SPOOFS)
    assert result.output.count("\n") == 1  # one line: no forged second one
    assert "\\u202e" in result.output and "\\u009b" in result.output


async def test_metrics_labels_show_hostile_text_as_text(h: Harness) -> None:
    status, data = await h.admin("POST", "/api/agents", {"label": f"rig{SPOOFS}"})
    assert (status, data["field"]) == (400, "label")  # the operator's own input: refused
    agent = await h.issue("rig-metrics")
    hello = hello_msg()
    hello["host"]["gpus"][0]["name"] = f"RTX{SPOOFS}4090"
    assert (await agent.post("/v1/hello", hello))[0] == 200
    assert (await agent.heartbeat("proving", telemetry=True))[0] == 200
    resp = await h.client.get("/metrics", headers=ADMIN)
    text = await resp.text()
    assert not any(c in text for c in SPOOFS)
    from prometheus_client.parser import text_string_to_metric_families

    # A GPU name is the spec table's or "other": the host's text makes no label at all.
    labels = [s.labels for f in text_string_to_metric_families(text) for s in f.samples
              if "gpu_name" in s.labels]
    assert labels and all(lab["gpu_name"] in ("RTX 4090", "other") for lab in labels)
    assert any(lab["gpu_name"] == "other" and "gpu" in lab for lab in labels)
    assert label_text(f"rig{SPOOFS}") == textsafe.neutralise(f"rig{SPOOFS}")


def test_a_good_key_is_all_that_gets_a_body_read(served: ServerThread) -> None:
    """The control: an issued agent's signed heartbeat is read, verified and answered."""
    agent_id, key = issue(served)
    body = orjson.dumps(hello_msg("boot-ok"))
    status, raw, headers = http(served.server.url + "/v1/hello", "POST", body,
                                signed_headers(agent_id, key, "POST", "/v1/hello", body))
    assert status == 200, raw
    assert "X-VM-Signature" in headers
    assert agent_key(agent_id) == key


def test_a_verified_body_moves_from_its_address_to_its_agent() -> None:
    """The budget's bookkeeping: unverified bytes are the address's, verified ones the
    agent's; a move the agent's share cannot take leaves everything where it was."""
    from vast_manager.coordinator.web.guard import BodyBudget

    budget = BodyBudget(total_bytes=10 * MIB, per_key_bytes=2 * MIB,
                        per_address_bytes=4 * MIB)
    assert budget.claim("addr:10.0.0.1", 3 * MIB) is None
    assert budget.claim("addr:10.0.0.1", 2 * MIB) is not None  # over the address's 4 MiB
    assert budget.transfer("addr:10.0.0.1", "ag_1", MIB) is None
    assert budget.transfer("addr:10.0.0.1", "ag_1", 2 * MIB) is not None  # over 2 MiB
    assert budget.in_flight_bytes == 3 * MIB
    budget.release("ag_1", MIB)
    budget.release("addr:10.0.0.1", 2 * MIB)
    assert budget.in_flight_bytes == 0
