"""Who may speak: agent request verification, response signing (docs/protocol.md), admin token.

Checks run in the contract's order and write nothing: body size (413), agent
and signature (401), timestamp (401), nonce (409), nonce budget (429). The agent
id and the shape of the signing headers are checked on the headers alone
(``screen``), before any of the body is read.

Nonce memory is not persisted. Instead every timestamp at or before the
second this process started is refused (``vast_manager.protocol.nonces`` explains why
that is enough): a request captured before a restart cannot be replayed
after it, and agents sign every retry afresh, so they never notice.

Agent keys are derived from each listed fleet secret (rotation: requests
verify against every secret, newest first) and cached per issued agent;
unknown ids are never cached, so a flood of made-up ids costs no memory.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from vast_manager.protocol import signing
from vast_manager.protocol.nonces import NonceMemory, NonceVerdict

MAX_BODY_BYTES = 1024 * 1024


class AuthFailure(Exception):
    """A refused agent request: HTTP status, error code, and whether to sign the answer."""

    def __init__(self, status: int, code: str, message: str, *, verified_key: bytes | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        # Set once the signature verified (steps 3 to 5): that answer is signed.
        self.verified_key = verified_key

    def to_body(self) -> dict[str, str]:
        return {"error": self.code, "message": self.message}


@dataclass(frozen=True, slots=True)
class AgentRecord:
    """What auth needs to know of an issued agent."""

    agent_id: str
    revoked: bool


class VerifiedAgent(NamedTuple):
    """An agent request whose signature verified (one for every agent request: a tuple
    costs a third of a frozen dataclass's ``object.__setattr__`` per field)."""

    agent_id: str
    key: bytes  # the key whose signature verified; answers are signed with it
    nonce: str
    timestamp: int


class AgentAuth:
    """Verifies agent requests; ``lookup`` reads an agent's record (None: never issued)."""

    def __init__(
        self,
        fleet_secrets: Sequence[bytes],
        lookup: Callable[[str], AgentRecord | None],
        *,
        not_before: int,
        nonces_per_agent: int = 2000,
    ) -> None:
        if not fleet_secrets:
            raise ValueError("at least one fleet secret is needed")
        self.fleet_secrets = tuple(fleet_secrets)
        self._lookup = lookup
        self._keys: dict[str, tuple[bytes, ...]] = {}
        self._revoked: set[str] = set()
        self.nonces = NonceMemory(max_per_agent=nonces_per_agent, not_before=not_before)

    def keys_for(self, agent_id: str) -> tuple[bytes, ...]:
        """Every key the agent may hold (one per listed secret, newest first), cached."""
        keys = self._keys.get(agent_id)
        if keys is None:
            keys = tuple(signing.derive_agent_key(s, agent_id) for s in self.fleet_secrets)
            self._keys[agent_id] = keys
        return keys

    def forget(self, agent_id: str) -> None:
        """Drop cached state for an agent (call after revoking it)."""
        self._keys.pop(agent_id, None)
        self.nonces.forget_agent(agent_id)

    def mark_revoked(self, agent_id: str) -> None:
        self._revoked.add(agent_id)
        self.forget(agent_id)

    def preload(self, agents: Iterable[tuple[str, bool]]) -> None:
        """Start from every agent's (id, revoked), keys derived: no read on the loop and no
        derivation for a known agent's first request after a restart (50,000 of them
        arrive within one pace; ~0.2 s here, once). Built before the server tunes the
        garbage collector, the cache is then out of its sight, where keys derived on
        first contact grew the young generation by one tuple a new agent, and made its
        collections long pauses during the first pace."""
        for agent_id, revoked in agents:
            if revoked:
                self._revoked.add(agent_id)
            else:
                self.keys_for(agent_id)

    def _known(self, agent_id: str) -> bool:
        if agent_id in self._revoked:
            return False
        if agent_id in self._keys:
            return True
        record = self._lookup(agent_id)
        if record is None:
            return False
        if record.revoked:
            self._revoked.add(agent_id)
            return False
        return True

    def verify(
        self,
        *,
        method: str,
        path_qs: str,
        headers: Mapping[str, str],
        body: bytes,
        now: float,
        screened_id: str | None = None,
    ) -> VerifiedAgent:
        """Check one request (body already read within the size limit); raise AuthFailure.
        ``screened_id``: what ``screen`` returned for these headers, if it ran."""
        agent = self.authenticate(method=method, path_qs=path_qs, headers=headers, body=body,
                                  screened_id=screened_id)
        self.admit(agent, now)
        return agent

    def screen(self, headers: Mapping[str, str]) -> str:
        """Step 2 on the headers alone, before any of the body is read: an issued, not
        revoked agent id and well-formed signing headers; returns the agent id. A
        stranger is refused here, so nothing is ever buffered for one."""
        agent_id = headers.get(signing.HEADER_AGENT, "")
        if not signing.is_agent_id(agent_id) or not self._known(agent_id):
            raise AuthFailure(401, "unknown_agent", "This agent id is unknown or revoked.")
        signature = headers.get(signing.HEADER_SIGNATURE, "")
        if (
            not signature
            or signing.SIGNATURE_RE.fullmatch(signature) is None
            or signing.TIMESTAMP_RE.fullmatch(headers.get(signing.HEADER_TIMESTAMP, "")) is None
            or not signing.is_nonce(headers.get(signing.HEADER_NONCE, ""))
        ):
            raise AuthFailure(
                401, "bad_signature", "The request signature is missing or malformed."
            )
        return agent_id

    def authenticate(
        self, *, method: str, path_qs: str, headers: Mapping[str, str], body: bytes,
        screened_id: str | None = None,
    ) -> VerifiedAgent:
        """Steps 2 to 4: a known agent whose signature verifies. Writes nothing: ``admit``
        then checks the timestamp and remembers the nonce."""
        agent_id = screened_id if screened_id is not None else self.screen(headers)
        timestamp = headers[signing.HEADER_TIMESTAMP]
        nonce = headers[signing.HEADER_NONCE]
        signature = headers[signing.HEADER_SIGNATURE]
        canonical = signing.canonical_request(timestamp, nonce, method, path_qs, body)
        verified_key: bytes | None = None
        for key in self.keys_for(agent_id):
            expected = signing.SIGNATURE_PREFIX + hmac.new(key, canonical, "sha256").hexdigest()
            # Every key is compared (no early exit) so timing does not say which secret matched.
            if hmac.compare_digest(expected.encode(), signature.encode()) and verified_key is None:
                verified_key = key
        if verified_key is None:
            raise AuthFailure(401, "bad_signature", "The request signature does not verify.")
        return VerifiedAgent(agent_id, verified_key, nonce, int(timestamp))

    def admit(self, agent: VerifiedAgent, now: float) -> None:
        """Steps 5 and 6 for an authenticated request: timestamp window, nonce, budget.

        The agent is checked again first: it may have been revoked while its request
        was being read."""
        if not self._known(agent.agent_id):
            raise AuthFailure(401, "unknown_agent", "This agent id is unknown or revoked.")
        verdict = self.nonces.check_and_remember(agent.agent_id, agent.nonce, agent.timestamp,
                                                 now)
        if verdict is NonceVerdict.STALE:
            raise AuthFailure(
                401,
                "stale_timestamp",
                "The request timestamp is outside the accepted window; correct your clock "
                "from X-VM-Server-Time.",
                verified_key=agent.key,
            )
        if verdict is NonceVerdict.REPLAYED:
            raise AuthFailure(
                409, "replayed_nonce", "This nonce was already used.", verified_key=agent.key
            )
        if verdict is NonceVerdict.TOO_MANY:
            raise AuthFailure(
                429,
                "too_many_requests",
                "Too many requests from this agent within the window; slow down.",
                verified_key=agent.key,
            )


def sign_response(key: bytes, request_nonce: str, status: int, body: bytes) -> str:
    return signing.sign_response(key, request_nonce, status, body)


def admin_authorized(authorization: str | None, token: str) -> bool:
    """``Authorization: Bearer <token>``, compared in constant time."""
    if not authorization:
        return False
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())
