"""The auth cache starts from every agent at start-up: a known agent's first
request after a restart reads nothing and derives nothing."""

from __future__ import annotations

import secrets

import pytest

from vast_manager.coordinator.web.auth import AgentAuth, AgentRecord, AuthFailure

from support.coord_support import SECRET_HEX, agent_key, sign

NOW = 1_800_000_000


def _headers(agent_id: str, body: bytes) -> dict[str, str]:
    ts, nonce = str(NOW), secrets.token_hex(16)
    return {"X-VM-Agent": agent_id, "X-VM-Timestamp": ts, "X-VM-Nonce": nonce,
            "X-VM-Signature": sign(agent_key(agent_id), ts, nonce, "POST", "/v1/heartbeat",
                                   body)}


def test_preloaded_agents_are_answered_without_a_lookup() -> None:
    known, revoked, later = "ag_" + "1" * 20, "ag_" + "2" * 20, "ag_" + "3" * 20
    looked_up: list[str] = []

    def lookup(agent_id: str) -> AgentRecord | None:
        looked_up.append(agent_id)
        return AgentRecord(agent_id, False) if agent_id == later else None

    auth = AgentAuth([bytes.fromhex(SECRET_HEX)], lookup, not_before=NOW - 60)
    auth.preload([(known, False), (revoked, True)])
    assert auth._keys[known] == (agent_key(known),)  # derived at start, not on first use

    body = b"{}"
    verified = auth.verify(method="POST", path_qs="/v1/heartbeat",
                           headers=_headers(known, body), body=body, now=NOW)
    assert verified.agent_id == known and verified.key == agent_key(known)
    with pytest.raises(AuthFailure) as refused:
        auth.verify(method="POST", path_qs="/v1/heartbeat", headers=_headers(revoked, body),
                    body=body, now=NOW)
    assert refused.value.code == "unknown_agent"
    assert looked_up == []
    # An agent issued after the start is read once, then cached like the others.
    for _ in range(2):
        auth.verify(method="POST", path_qs="/v1/heartbeat", headers=_headers(later, body),
                    body=body, now=NOW)
    assert looked_up == [later]
