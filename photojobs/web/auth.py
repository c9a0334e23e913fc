"""Authentication for the web API: a bearer token, or a session cookie obtained with it.

- ``Authorization: Bearer $PHOTOJOBS_API_TOKEN``, compared in constant time.
- ``POST /api/session {"token": …}`` sets an HttpOnly, SameSite=Strict cookie holding an expiry and
  an HMAC of it keyed by the token (stateless: it survives a server restart and dies with a token
  change). A cookie-authenticated request that changes something must also carry an ``Origin``
  equal to the app's own origin (or one of ``PHOTOJOBS_ALLOWED_ORIGINS``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Iterable

from starlette.requests import Request

from .errors import ApiError

COOKIE = "photojobs_session"
SESSION_TTL = 12 * 3600
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


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
    payload = f"{expires}.{secrets.token_urlsafe(12)}"
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


def authenticate(request: Request) -> str:
    """FastAPI dependency: ``"bearer"``, ``"cookie"`` or ``"open"`` (no token configured), or an
    ``ApiError`` 401 (no/bad credentials) or 403 (cookie without a matching Origin)."""
    cfg = request.app.state.photojobs
    if cfg.token is None:
        return "open"
    header = request.headers.get("authorization")
    if header is not None:
        if token_matches(bearer_token(header), cfg.token):
            return "bearer"
        raise ApiError(
            401, "unauthorized", "the bearer token is wrong", headers={"WWW-Authenticate": "Bearer"}
        )
    if session_valid(request.cookies.get(COOKIE), cfg.token):
        if request.method not in SAFE_METHODS and not origin_allowed(
            request.headers.get("origin"), own_origin(request), cfg.allowed_origins
        ):
            raise ApiError(
                403,
                "bad_origin",
                "a cookie-authenticated change must come from this app's own page (Origin header)",
                {"origin": request.headers.get("origin"), "expected": own_origin(request)},
            )
        return "cookie"
    raise ApiError(
        401,
        "unauthorized",
        "send Authorization: Bearer <PHOTOJOBS_API_TOKEN>, or log in at POST /api/session",
        headers={"WWW-Authenticate": "Bearer"},
    )
