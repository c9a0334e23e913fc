"""The web API and dashboard: ``create_app()`` returns a FastAPI app, mountable in any ASGI app.

    from fastapi import FastAPI
    from photojobs.web import create_app

    app = FastAPI()
    app.mount("/jobs", create_app())      # reads PHOTOJOBS_* from the environment

``photojobs serve`` runs it with uvicorn.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles

from photojobs.api import Client
from photojobs.roots import ROOTS_ENV, parse_roots
from store.retention import parse_age

from . import (
    console_routes,
    errors,
    history_routes,
    lanes_routes,
    metrics,
    routes,
    sync_routes,
    webhook_routes,
)
from .auth import LoopbackOnly, authenticate
from .limits import BodyLimit, LoginLimiter
from .safe_json import SafeJSONResponse
from .schedule_routes import schedules_api
from .sse import MAX_PER_CLIENT, MAX_STREAMS, Sequencer, StreamSlots
from .strict import known_query_only
from .text import RequestText

STATIC = Path(__file__).parent / "static"
TOKEN_ENV = "PHOTOJOBS_API_TOKEN"  # noqa: S105 - the name of an environment variable, not a secret
VIEWER_TOKEN_ENV = "PHOTOJOBS_VIEWER_TOKEN"  # noqa: S105 - the read-only role's token (auth.role_of)
DEFAULT_MAX_BODY = 1 << 20
SESSION_IDLE = 30 * 60  # PHOTOJOBS_SESSION_IDLE: a session unused this long ends
SESSION_MAX_AGE = 12 * 3600  # PHOTOJOBS_SESSION_MAX_AGE: every session ends this long after login
LOGIN_FAILURES = 10  # PHOTOJOBS_LOGIN_FAILURES wrong tokens per address ...
LOGIN_WINDOW = 60.0  # ... within PHOTOJOBS_LOGIN_WINDOW seconds: 429 until the oldest leaves it
# The dashboard loads only its own script and styles, and is never framed (no clickjacking of its buttons).
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


class PageFiles(StaticFiles):
    """The dashboard's script and styles, with the dashboard's headers (CSP, nosniff, no framing)."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update(PAGE_HEADERS)
        return response


@dataclass
class WebConfig:
    client: Client
    token: str | None
    photo_roots: list[Path]
    viewer_token: str | None = None
    allowed_origins: tuple[str, ...] = ()
    keepalive: float = 15.0
    poll: float = 0.25
    session_idle: float = SESSION_IDLE
    session_max_age: float = SESSION_MAX_AGE
    login_limiter: LoginLimiter = field(default_factory=LoginLimiter)
    streams: StreamSlots = field(default_factory=StreamSlots)
    sequencer: Sequencer = field(init=False)

    def __post_init__(self) -> None:
        self.sequencer = Sequencer(self.client.engine, self.poll)


def _env_float(env: dict[str, str], key: str, default: float) -> float:
    raw = env.get(key)
    if not raw:
        return default
    value = float(raw)
    if value <= 0:
        raise ValueError(f"{key}={raw!r} must be positive")
    return value


def _env_age(env: dict[str, str], key: str, default: float) -> float:
    raw = env.get(key)
    if not raw:
        return default
    try:
        value = parse_age(raw)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None
    if value <= 0:
        raise ValueError(f"{key}={raw!r} must be positive")
    return value


def _env_count(env: dict[str, str], key: str, default: int) -> int:
    raw = env.get(key)
    if not raw:
        return default
    if not raw.strip().isdigit() or int(raw) < 1:
        raise ValueError(f"{key}={raw!r} must be a whole number of at least 1")
    return int(raw)


def create_app(
    client: Client | None = None,
    *,
    token: str | None = None,
    viewer_token: str | None = None,
    photo_roots: Sequence[str | Path] | None = None,
    insecure: bool = False,
    keepalive: float | None = None,
    poll: float | None = None,
    max_body: int | None = None,
    allowed_origins: Sequence[str] | None = None,
    local_port: int | None = None,
    env: dict[str, str] | None = None,
) -> FastAPI:
    """The photojobs web app. Unset arguments come from the environment:

    ``PHOTOJOBS_API_TOKEN`` (required unless ``insecure=True``), ``PHOTOJOBS_VIEWER_TOKEN`` (a
    read-only token: every GET, every state change 403; needs the API token), ``PHOTOJOBS_PHOTO_ROOTS``
    (``:``-separated folders submissions may use), ``PHOTOJOBS_SSE_KEEPALIVE`` (15 s),
    ``PHOTOJOBS_SSE_POLL`` (0.25 s), ``PHOTOJOBS_API_MAX_BODY`` (1 MiB),
    ``PHOTOJOBS_ALLOWED_ORIGINS`` (extra origins for cookie-authenticated changes, space-separated),
    ``PHOTOJOBS_SESSION_IDLE`` (30m), ``PHOTOJOBS_SESSION_MAX_AGE`` (12h), ``PHOTOJOBS_LOGIN_FAILURES``
    (10) wrong tokens per address per ``PHOTOJOBS_LOGIN_WINDOW`` (60 s), ``PHOTOJOBS_SSE_MAX_STREAMS``
    (100) event streams open in all and ``PHOTOJOBS_SSE_MAX_PER_CLIENT`` (8) per client address.

    Without a token (``insecure=True``) every request must name a loopback host in ``Host`` (with
    ``local_port`` when given) and any ``Origin`` must be a loopback page (``auth.LoopbackOnly``).
    ``/docs`` and ``/redoc`` are off (they load scripts from a CDN); ``/openapi.json`` is public.
    """
    env = dict(os.environ) if env is None else env
    token = token if token is not None else (env.get(TOKEN_ENV) or None)
    if token is None and not insecure:
        raise ValueError(f"no API token: set {TOKEN_ENV} (or pass insecure=True for a loopback-only server)")
    viewer_token = viewer_token if viewer_token is not None else (env.get(VIEWER_TOKEN_ENV) or None)
    if viewer_token is not None and token is None:
        raise ValueError(f"{VIEWER_TOKEN_ENV} needs {TOKEN_ENV}: on an open server it would grant nothing")
    if viewer_token is not None and viewer_token == token:
        raise ValueError(f"{VIEWER_TOKEN_ENV} must differ from {TOKEN_ENV}")
    client = client or Client()
    roots = [Path(r).expanduser().absolute() for r in photo_roots] if photo_roots is not None else None
    cfg = WebConfig(
        client=client,
        token=token,
        viewer_token=viewer_token,
        photo_roots=roots if roots is not None else parse_roots(env.get(ROOTS_ENV)),
        allowed_origins=tuple(allowed_origins or env.get("PHOTOJOBS_ALLOWED_ORIGINS", "").split()),
        keepalive=keepalive or _env_float(env, "PHOTOJOBS_SSE_KEEPALIVE", 15.0),
        poll=poll or _env_float(env, "PHOTOJOBS_SSE_POLL", 0.25),
        session_idle=_env_age(env, "PHOTOJOBS_SESSION_IDLE", SESSION_IDLE),
        session_max_age=_env_age(env, "PHOTOJOBS_SESSION_MAX_AGE", SESSION_MAX_AGE),
        login_limiter=LoginLimiter(
            _env_count(env, "PHOTOJOBS_LOGIN_FAILURES", LOGIN_FAILURES),
            _env_age(env, "PHOTOJOBS_LOGIN_WINDOW", LOGIN_WINDOW),
        ),
        streams=StreamSlots(
            _env_count(env, "PHOTOJOBS_SSE_MAX_STREAMS", MAX_STREAMS),
            _env_count(env, "PHOTOJOBS_SSE_MAX_PER_CLIENT", MAX_PER_CLIENT),
        ),
    )
    app = FastAPI(
        default_response_class=SafeJSONResponse,
        docs_url=None,
        redoc_url=None,
        title="photojobs",
        version="1",
        description="Durable photo jobs: submit, inspect, control, retry; events as pages and as "
        "Server-Sent Events; workers; Prometheus metrics. Authenticate with "
        "`Authorization: Bearer $PHOTOJOBS_API_TOKEN` or the session cookie from `POST /api/session`.",
    )
    app.state.photojobs = cfg
    errors.install(app)
    app.add_middleware(RequestText)  # inside the body limit: it reads a body BodyLimit has bounded
    app.add_middleware(
        BodyLimit, limit=max_body or int(env.get("PHOTOJOBS_API_MAX_BODY") or DEFAULT_MAX_BODY)
    )
    if token is None:
        app.add_middleware(LoopbackOnly, port=local_port)  # outermost: before anything else runs
    app.include_router(routes.public)
    app.include_router(routes.api)
    app.include_router(lanes_routes.lanes)
    app.include_router(history_routes.history)
    app.include_router(console_routes.console)
    app.include_router(sync_routes.sync_api)
    app.include_router(schedules_api)
    app.include_router(webhook_routes.webhooks_api)

    @app.get("/metrics", tags=["ops"], dependencies=[Depends(authenticate), Depends(known_query_only)])
    def prometheus(request: Request) -> Response:
        """Prometheus text format: items by lane and state, queue depth, backlog, throughput, …"""
        return Response(
            metrics.render(request.app.state.photojobs.client), media_type="text/plain; version=0.0.4"
        )

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(STATIC / "dashboard.html", headers={"Cache-Control": "no-cache", **PAGE_HEADERS})

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> FileResponse:
        """The console's icon (the page names ``static/favicon.svg``; this answers a browser that
        asks for the root's icon anyway, instead of a 404 on every page)."""
        return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml", headers=PAGE_HEADERS)

    app.mount("/static", PageFiles(directory=STATIC), name="static")
    return app


__all__ = ["create_app", "WebConfig"]
