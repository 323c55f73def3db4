"""The web dashboard's server side: static files, login sessions, CSRF, security headers.

The dashboard is plain files in ``coordinator/web/static`` that call the operator
API. Logging in trades the admin token for a random session id in an
HttpOnly, SameSite=Strict cookie; the session (kept in memory, it dies with
the process) also holds a CSRF token the page reads from ``/auth/session``
and sends back in ``X-CSRF-Token`` on every state-changing request.
``authorize_operator`` is the one check the operator API runs: a Bearer token,
or a live session cookie (plus the CSRF header unless the method is safe).
"""

from __future__ import annotations

import hmac
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
from aiohttp import web

from vast_manager.coordinator import textsafe
from vast_manager.coordinator.decisions import states
from vast_manager.coordinator.exceptions import Refusal
from vast_manager.coordinator.web.auth import admin_authorized
from vast_manager.coordinator.web.guard import CredentialThrottle
from vast_manager.coordinator.web.http import SECURITY_HEADERS, read_body

STATIC_DIR = Path(__file__).resolve().parent / "static"
#: The dashboard's scripts generated from their one definition: ``safeText`` from
#: ``textsafe.UNSAFE_TEXT_RANGES``, ``STATES`` and ``STATE_SETS`` from ``decisions.states``.
GENERATED_SCRIPTS: dict[str, Callable[[], str]] = {
    "textsafe.js": textsafe.dashboard_script,
    "states.js": states.dashboard_script,
}
COOKIE_NAME = "vm_session"
CSRF_HEADER = "X-CSRF-Token"
MAX_SESSIONS = 1000
MAX_LOGIN_BODY_BYTES = 4096
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_STATIC_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
_CONTENT_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
}

# No inline script or style anywhere in the dashboard, so the policy can forbid both.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)


@dataclass(slots=True)
class Session:
    csrf_token: str
    created_at: float
    expires_at: float


class SessionStore:
    """Login sessions in memory: random ids, absolute expiry, a bounded count."""

    def __init__(self, ttl_s: float, clock: Callable[[], float],
                 max_sessions: int = MAX_SESSIONS) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self.max_sessions = max_sessions
        self._sessions: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self) -> tuple[str, Session]:
        now = self.clock()
        if len(self._sessions) >= self.max_sessions:
            self.expire(now)
        while len(self._sessions) >= self.max_sessions:
            # dicts keep insertion order: the first is the oldest login.
            del self._sessions[next(iter(self._sessions))]
        session_id = secrets.token_urlsafe(32)
        session = Session(secrets.token_urlsafe(32), now, now + self.ttl_s)
        self._sessions[session_id] = session
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        if self.clock() >= session.expires_at:
            del self._sessions[session_id]
            return None
        return session

    def drop(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(session_id, None)

    def expire(self, now: float) -> None:
        for sid in [k for k, s in self._sessions.items() if now >= s.expires_at]:
            del self._sessions[sid]


SESSIONS = web.AppKey("sessions", SessionStore)
ADMIN_TOKEN = web.AppKey("dashboard_admin_token", str)
THROTTLE = web.AppKey("credential_throttle", CredentialThrottle)
ON_REFUSED: web.AppKey[Callable[[str], None]] = web.AppKey("on_refused")


def throttled(request: web.Request, what: str) -> Refusal | None:
    """The ``429`` for an address past its failed attempts (checked before any token is
    compared, so a guesser learns nothing more), else None."""
    wait = request.config_dict[THROTTLE].retry_after_s(request.remote)
    if wait is None:
        return None
    return Refusal(429, "too_many_attempts",
                   f"Too many failed {what} from this address; try again in {wait} s.",
                   retry_after_s=wait)


def authorize_operator(request: web.Request, admin_token: str) -> None:
    """Raise ``Refusal`` unless the request carries the Bearer token or a live session.

    A request that names an Authorization header is judged by it alone, and a wrong
    token counts against its address (``coordinator.web.guard.CredentialThrottle``). A
    session-authenticated request that can change state must also carry the
    session's CSRF token (a cross-site page can make the browser send the
    cookie, SameSite aside, but cannot read the token).
    """
    authorization = request.headers.get("Authorization")
    if authorization is not None:
        refusal = throttled(request, "admin-token attempts")
        if refusal is not None:
            raise refusal
        if admin_authorized(authorization, admin_token):
            request.config_dict[THROTTLE].succeeded(request.remote)
            return
        request.config_dict[THROTTLE].failed(request.remote)
        raise Refusal(401, "unauthorized", "The admin token is not valid.")
    session = request.config_dict[SESSIONS].get(request.cookies.get(COOKIE_NAME))
    if session is None:
        raise Refusal(401, "unauthorized",
                      "The operator API needs Authorization: Bearer <admin token> "
                      "or a dashboard login.")
    if request.method in SAFE_METHODS:
        return
    given = request.headers.get(CSRF_HEADER, "")
    if not given or not hmac.compare_digest(given.encode(), session.csrf_token.encode()):
        raise Refusal(403, "csrf_failed",
                      f"A state-changing request from the dashboard needs the {CSRF_HEADER} "
                      "header of its session.")


# --- handlers --------------------------------------------------------------------------


def _json(payload: object, status: int = 200) -> web.Response:
    response = web.Response(body=orjson.dumps(payload), status=status,
                             content_type="application/json")
    response.headers["Cache-Control"] = "no-store"
    return response


def _error(status: int, code: str, message: str) -> web.Response:
    return _json({"error": code, "message": message}, status)


def _secure_request(request: web.Request) -> bool:
    # Behind a TLS-terminating proxy the browser still speaks HTTPS; the header
    # can only make the cookie stricter, so trusting it here is harmless.
    return request.secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https"


def _refuse(request: web.Request, status: int, code: str, message: str,
            retry_after_s: int | None = None) -> web.Response:
    request.config_dict[ON_REFUSED](code)
    response = _error(status, code, message)
    if retry_after_s is not None:
        response.headers["Retry-After"] = str(retry_after_s)
    return response


async def _login(request: web.Request) -> web.Response:
    if request.content_type != "application/json":
        # A cross-site form cannot send JSON without a CORS preflight we never answer.
        return _error(415, "unsupported_media_type", "Send the token as a JSON object.")
    # Counted before the body is read, in the same step as the check: a guesser past the
    # limit costs nothing more, and parallel logins cannot all pass a check made before
    # any of them failed. At most the limit's bodies (4 KiB each) per address are read.
    throttle = request.config_dict[THROTTLE]
    wait = throttle.attempt(request.remote)
    if wait is not None:
        return _refuse(request, 429, "too_many_attempts",
                       f"Too many failed logins from this address; try again in {wait} s.",
                       wait)
    # The whole body (not what the first packet brought) within the body deadline: a
    # stranger's login that never finishes is cut off like any slow body
    # (docs/reliability.md, "Bounds").
    try:
        raw, _ = await read_body(request, limit=MAX_LOGIN_BODY_BYTES)
    except Refusal as err:
        if err.status == 413:
            return _error(413, "body_too_large", "The login body is too large.")
        return _refuse(request, err.status, err.code, err.message)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        throttle.refund(request.remote)  # no token in it: nothing was guessed
        return _error(400, "bad_request", "The body is not valid JSON.")
    token = body.get("token") if isinstance(body, dict) else None
    admin_token = request.config_dict[ADMIN_TOKEN]
    if not isinstance(token, str):
        throttle.refund(request.remote)
        return _refuse(request, 401, "unauthorized", "That is not the admin token.")
    if not hmac.compare_digest(token.encode(), admin_token.encode()):
        return _refuse(request, 401, "unauthorized", "That is not the admin token.")
    request.config_dict[THROTTLE].succeeded(request.remote)
    sessions = request.config_dict[SESSIONS]
    request.config_dict[SESSIONS].drop(request.cookies.get(COOKIE_NAME))
    session_id, session = sessions.create()
    response = _json({"ok": True, "csrf_token": session.csrf_token,
                      "expires_at": session.expires_at})
    response.set_cookie(COOKIE_NAME, session_id, max_age=int(sessions.ttl_s), path="/",
                        httponly=True, samesite="Strict", secure=_secure_request(request))
    return response


async def _logout(request: web.Request) -> web.Response:
    sessions = request.config_dict[SESSIONS]
    session_id = request.cookies.get(COOKIE_NAME)
    session = sessions.get(session_id)
    if session is not None:
        given = request.headers.get(CSRF_HEADER, "")
        if not hmac.compare_digest(given.encode(), session.csrf_token.encode()):
            return _error(403, "csrf_failed", f"Logging out needs the {CSRF_HEADER} header.")
        sessions.drop(session_id)
    response = _json({"ok": True})
    response.del_cookie(COOKIE_NAME, path="/")
    return response


async def _session(request: web.Request) -> web.Response:
    session = request.config_dict[SESSIONS].get(request.cookies.get(COOKIE_NAME))
    if session is None:
        return _error(401, "unauthorized", "Not logged in.")
    # Same-origin reads only: another site's page cannot read this answer.
    return _json({"ok": True, "csrf_token": session.csrf_token,
                  "expires_at": session.expires_at})


def _static_file(name: str) -> web.FileResponse:
    if _STATIC_NAME.fullmatch(name) is None or ".." in name:
        raise web.HTTPNotFound(reason="No such file.")
    path = STATIC_DIR / name
    content_type = _CONTENT_TYPES.get(path.suffix)
    if content_type is None or not path.is_file():
        raise web.HTTPNotFound(reason="No such file.")
    response = web.FileResponse(path, headers={"Content-Type": f"{content_type}; charset=utf-8",
                                               "Cache-Control": "no-cache"})
    return response


async def _index(request: web.Request) -> web.FileResponse:
    return _static_file("index.html")


async def _static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    generate = GENERATED_SCRIPTS.get(name)
    if generate is not None:
        return web.Response(text=generate(), content_type="text/javascript",
                            charset="utf-8", headers={"Cache-Control": "no-cache"})
    return _static_file(name)


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    if not request.path.startswith("/v1/"):
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        response.headers.setdefault("X-Frame-Options", "DENY")
    if request.path.startswith("/api/"):
        response.headers.setdefault("Cache-Control", "no-store")


def setup_dashboard(
    app: web.Application, *, admin_token: str, session_ttl_s: float, clock: Callable[[], float],
    throttle: CredentialThrottle | None = None,
    on_refused: Callable[[str], None] = lambda _code: None,
) -> None:
    """Register the dashboard's routes, its session store and the security headers.

    ``throttle`` counts failed admin-token attempts per address, for the login and the
    operator API alike; ``on_refused`` is told the code of each refused login."""
    app[SESSIONS] = SessionStore(session_ttl_s, clock)
    app[ADMIN_TOKEN] = admin_token
    app[THROTTLE] = throttle if throttle is not None else CredentialThrottle(clock)
    app[ON_REFUSED] = on_refused
    app.on_response_prepare.append(_security_headers)
    app.router.add_get("/", _index)
    app.router.add_get("/static/{name}", _static)
    app.router.add_post("/auth/login", _login)
    app.router.add_post("/auth/logout", _logout)
    app.router.add_get("/auth/session", _session)
