"""HMAC-SHA256 keys and signatures of docs/protocol.md.

Everything here is a pure function of its arguments: the caller supplies the
time and the nonce, so the agent, the coordinator and the tests compute
exactly the same bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import re

AGENT_KEY_CONTEXT = b"vast-manager agent key v1:"
SIGNATURE_PREFIX = "v1="
TIMESTAMP_WINDOW_S = 300

HEADER_AGENT = "X-VM-Agent"
HEADER_TIMESTAMP = "X-VM-Timestamp"
HEADER_NONCE = "X-VM-Nonce"
HEADER_SIGNATURE = "X-VM-Signature"
HEADER_SERVER_TIME = "X-VM-Server-Time"

AGENT_ID_RE = re.compile(r"ag_[0-9a-f]{20}")
NONCE_RE = re.compile(r"[0-9a-f]{32}")
TIMESTAMP_RE = re.compile(r"[0-9]{1,12}")
SIGNATURE_RE = re.compile(r"v1=[0-9a-f]{64}")


def is_agent_id(value: str) -> bool:
    return AGENT_ID_RE.fullmatch(value) is not None


def is_nonce(value: str) -> bool:
    return NONCE_RE.fullmatch(value) is not None


def derive_agent_key(fleet_secret: bytes, agent_id: str) -> bytes:
    """``HMAC-SHA256(fleet_secret, "vast-manager agent key v1:" + agent_id)``, 32 raw bytes."""
    return hmac.new(fleet_secret, AGENT_KEY_CONTEXT + agent_id.encode(), hashlib.sha256).digest()


def fleet_id(fleet_secret: bytes) -> str:
    """First 8 hex characters of SHA-256 of the (raw 32-byte) newest fleet secret."""
    return hashlib.sha256(fleet_secret).hexdigest()[:8]


def parse_secrets(value: str) -> list[bytes]:
    """Parse ``VM_FLEET_SECRET``: comma-separated hex secrets, newest first.

    Raises ``ValueError`` naming the bad entry's position (never its value).
    """
    secrets: list[bytes] = []
    for position, part in enumerate(value.split(","), start=1):
        part = part.strip()
        try:
            raw = bytes.fromhex(part)
        except ValueError:
            raise ValueError(f"fleet secret #{position} is not hexadecimal") from None
        if len(raw) < 16:
            raise ValueError(f"fleet secret #{position} is shorter than 16 bytes")
        secrets.append(raw)
    return secrets


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def canonical_request(
    timestamp: str, nonce: str, method: str, path: str, body: bytes
) -> bytes:
    return (
        f"vm1-req\n{timestamp}\n{nonce}\n{method.upper()}\n{path}\n{body_digest(body)}"
    ).encode()


def canonical_response(request_nonce: str, status: int, body: bytes) -> bytes:
    return f"vm1-resp\n{request_nonce}\n{status}\n{body_digest(body)}".encode()


def _mac(key: bytes, message: bytes) -> str:
    # hmac.digest: OpenSSL's one-shot HMAC, without the HMAC object hmac.new builds.
    return SIGNATURE_PREFIX + hmac.digest(key, message, "sha256").hex()


def sign_request(
    key: bytes, timestamp: str, nonce: str, method: str, path: str, body: bytes
) -> str:
    return _mac(key, canonical_request(timestamp, nonce, method, path, body))


def sign_response(key: bytes, request_nonce: str, status: int, body: bytes) -> str:
    return _mac(key, canonical_response(request_nonce, status, body))


def verify_response(
    key: bytes, signature: str | None, request_nonce: str, status: int, body: bytes
) -> bool:
    if not signature:
        return False
    expected = sign_response(key, request_nonce, status, body)
    return hmac.compare_digest(expected.encode(), signature.encode())


def request_headers(
    agent_id: str, key: bytes, timestamp: int, nonce: str, method: str, path: str, body: bytes
) -> dict[str, str]:
    """The four signing headers (docs/protocol.md, request signing) for one request."""
    ts = str(int(timestamp))
    return {
        HEADER_AGENT: agent_id,
        HEADER_TIMESTAMP: ts,
        HEADER_NONCE: nonce,
        HEADER_SIGNATURE: sign_request(key, ts, nonce, method, path, body),
        "Content-Type": "application/json",
    }
