"""Authentication for the web API: a bearer token, a server-side session, and the loopback guard.

- ``Authorization: Bearer $PHOTOJOBS_API_TOKEN``, compared in constant time.
- ``POST /api/session {"token": …}`` sets an HttpOnly, SameSite=Strict cookie: an absolute expiry,
  a random nonce and an HMAC of both keyed by the token (it dies with a token change), recorded in
  the store by its SHA-256 (``store.sessions``: logout revokes it, it ends after an idle time or at
  its absolute expiry, it survives a server restart and is shared by several server processes). A
  cookie-authenticated request that changes something must also carry an ``Origin`` equal to the
  app's own origin (or one of ``PHOTOJOBS_ALLOWED_ORIGINS``).
- Wrong tokens (login or bearer) are counted per client address (``limits.LoginLimiter``): past
  the limit, 429 with ``Retry-After``.
- Two roles (``role_of``): the operator (``PHOTOJOBS_API_TOKEN``) may do everything; a viewer
  (``PHOTOJOBS_VIEWER_TOKEN``, bearer or a session cookie signed with it) may read everything —
  every GET, the event stream, the metrics — and every state change is refused with 403
  ``read_only``. ``authenticate`` decides it once for every protected route.
- ``LoopbackOnly`` (a server without a token, ``serve --insecure-local``): every request must name
  a loopback host (and the server's port) in ``Host``, and an ``Origin``, when sent, must be such a
  loopback origin too — a foreign page or a DNS-rebound name gets a 403.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import secrets
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from store.sessions import check_session

from .errors import ApiError, error_body

COOKIE = "photojobs_session"
SESSION_TTL = 12 * 3600
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
OPERATOR = "operator"
VIEWER = "viewer"


def token_matches(given: str | None, token: str) -> bool:
    """Constant-time comparison of a presented token with the configured one."""
    if not given:
        return False
    return hmac.compare_digest(given.encode(), token.encode())


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer …`` header (None for another scheme or none)."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def _key(token: str) -> bytes:
    return hashlib.sha256(b"photojobs-session:" + token.encode()).digest()


def make_session(token: str, now: float | None = None, ttl: float = SESSION_TTL) -> str:
    """A session cookie value: ``expiry.nonce.hmac``, valid until ``expiry``."""
    expires = int((time.time() if now is None else now) + ttl)
    payload = f"{expires}.{secrets.token_urlsafe(32)}"
    sig = hmac.new(_key(token), payload.encode(), hashlib.sha256).hexdigest()
    return f"{payload}.{sig}"


def session_valid(value: str | None, token: str, now: float | None = None) -> bool:
    """True for an unexpired cookie signed with this token."""
    if not value:
        return False
    payload, _, sig = value.rpartition(".")
    expires_text, _, nonce = payload.partition(".")
    if not (payload and sig and nonce and expires_text.isdigit()):
        return False
    good = hmac.new(_key(token), payload.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(good.encode(), sig.encode()):
        return False
    return int(expires_text) > (time.time() if now is None else now)


def own_origin(request: Request) -> str:
    return f"{request.url.scheme}://{request.url.netloc}"


def origin_allowed(origin: str | None, own: str, allowed: Iterable[str] = ()) -> bool:
    """A cookie-authenticated mutation must come from our own page (or a configured origin)."""
    if not origin or origin == "null":
        return False
    return origin.rstrip("/") in {own, *(a.rstrip("/") for a in allowed)}


def client_address(request: Request) -> str:
    """The address failed logins are counted against: the TCP peer (behind a proxy, the proxy),
    or the client a proxy in ``PHOTOJOBS_TRUSTED_PROXIES`` names (``photojobs.web.server``)."""
    return request.client.host if request.client else "unknown"


def refuse_if_limited(request: Request) -> None:
    """429 with ``Retry-After`` while this client has had too many wrong tokens."""
    wait = request.app.state.photojobs.login_limiter.retry_after(client_address(request))
    if wait:
        raise ApiError(
            429,
            "too_many_attempts",
            f"too many wrong tokens from this address; try again in {wait} s",
            {"retry_after": wait},
            headers={"Retry-After": str(wait)},
        )


def _session_role(request: Request, cfg: Any) -> str | None:
    """The role of the request's valid, unrevoked session cookie (``operator`` when signed with the
    API token, ``viewer`` when signed with the viewer token), None without one."""
    cookie = request.cookies.get(COOKIE)
    if not cookie:
        return None
    for role, token in ((OPERATOR, cfg.token), (VIEWER, cfg.viewer_token)):
        if token is not None and session_valid(cookie, token):
            return role if check_session(cfg.client.engine, cookie) else None
    return None


def token_role(given: str | None, cfg: Any) -> str | None:
    """The role a presented token grants: ``operator`` (the API token), ``viewer`` (the viewer
    token), None (neither). Both are compared in constant time, whichever matches."""
    operator = token_matches(given, cfg.token)
    viewer = cfg.viewer_token is not None and token_matches(given, cfg.viewer_token)
    return OPERATOR if operator else VIEWER if viewer else None


def role_of(request: Request) -> str:
    """The role ``authenticate`` gave this request: ``operator`` or ``viewer``."""
    return getattr(request.state, "role", OPERATOR)


def _authorize(request: Request, role: str) -> None:
    """The one rule of the roles: a viewer reads, and any state change is a 403 naming why."""
    request.state.role = role
    if role == VIEWER and request.method not in SAFE_METHODS:
        raise ApiError(
            403,
            "read_only",
            f"the viewer token is read-only: {request.method} {request.url.path} changes state; "
            "use the operator's PHOTOJOBS_API_TOKEN",
            {"role": VIEWER, "method": request.method},
        )


def authenticate(request: Request) -> str:
    """FastAPI dependency: ``"bearer"``, ``"cookie"`` or ``"open"`` (no token configured), or an
    ``ApiError`` 401 (no/bad credentials), 403 (cookie without a matching Origin; a viewer's state
    change) or 429 (too many wrong tokens from this address). An ``Authorization`` header of another
    scheme than Bearer (a proxy's Basic) is ignored: the session cookie beside it counts, and it is
    never a wrong token. The request's role is kept in ``request.state.role`` (``role_of``)."""
    cfg = request.app.state.photojobs
    if cfg.token is None:
        _authorize(request, OPERATOR)
        return "open"
    header = request.headers.get("authorization")
    if header is not None and not header.strip().lower().startswith("bearer"):
        header = None  # another scheme (a proxy's Basic …) is not our credential, nor a guess at it
    if header is not None:
        refuse_if_limited(request)
        role = token_role(bearer_token(header), cfg)
        if role is not None:
            _authorize(request, role)
            return "bearer"
        cfg.login_limiter.failed(client_address(request))
        raise ApiError(
            401, "unauthorized", "the bearer token is wrong", headers={"WWW-Authenticate": "Bearer"}
        )
    role = _session_role(request, cfg)
    if role is not None:
        if request.method not in SAFE_METHODS and not origin_allowed(
            request.headers.get("origin"), own_origin(request), cfg.allowed_origins
        ):
            raise ApiError(
                403,
                "bad_origin",
                "a cookie-authenticated change must come from this app's own page (Origin header)",
                {"origin": request.headers.get("origin"), "expected": own_origin(request)},
            )
        _authorize(request, role)
        return "cookie"
    raise ApiError(
        401,
        "unauthorized",
        "send Authorization: Bearer <PHOTOJOBS_API_TOKEN>, or log in at POST /api/session",
        headers={"WWW-Authenticate": "Bearer"},
    )


def is_loopback(host: str) -> bool:
    """``localhost`` (or a name under ``.localhost``), 127.0.0.0/8 or ::1 (brackets allowed)."""
    name = host.strip().lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def split_host(value: str) -> tuple[str, int | None] | None:
    """``host[:port]`` (``[v6][:port]``) -> (host, port); None when it does not parse."""
    try:
        parts = urlsplit("//" + value.strip())
        return (parts.hostname or "", parts.port)
    except ValueError:
        return None


def loopback_target(value: str | None, port: int | None, default_port: int) -> bool:
    """True for a ``Host`` value naming a loopback host with the server's port (any port when the
    server's is unknown)."""
    parsed = split_host(value or "")
    if parsed is None or not parsed[0] or not is_loopback(parsed[0]):
        return False
    return port is None or (parsed[1] if parsed[1] is not None else default_port) == port


def loopback_origin(origin: str, port: int | None) -> bool:
    """True for an ``Origin`` such as ``http://127.0.0.1:PORT`` (a loopback host, the server's port)."""
    try:
        parts = urlsplit(origin.strip())
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or "@" in parts.netloc or parts.path not in ("", "/"):
        return False
    return loopback_target(parts.netloc, port, 443 if parts.scheme == "https" else 80)


class LoopbackOnly:
    """ASGI middleware for a server without a token: refuse (403, JSON) any request whose ``Host``
    is not a loopback name or address with ``port`` (DNS rebinding), or whose ``Origin``, when
    present, is not such a loopback origin (a page of another site or on another local port)."""

    def __init__(self, app: ASGIApp, port: int | None = None) -> None:
        self.app = app
        self.port = port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers") or []}
        host = headers.get(b"host", b"").decode("latin-1")
        origin = headers.get(b"origin")
        scheme_port = 443 if scope.get("scheme") == "https" else 80
        if not loopback_target(host, self.port, scheme_port):
            await _refuse(send, "bad_host", f"Host {host!r} is not this loopback server", {"host": host})
            return
        if origin is not None and not loopback_origin(origin.decode("latin-1"), self.port):
            text = origin.decode("latin-1")
            await _refuse(
                send, "bad_origin", f"Origin {text!r} is not this loopback server's page", {"origin": text}
            )
            return
        await self.app(scope, receive, send)


async def _refuse(send: Send, code: str, message: str, detail: dict[str, str]) -> None:
    body = json.dumps(error_body(code, message, detail)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 403,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
