"""``/healthz``: is each component reachable — the database, Redis — and how many workers are live."""

from __future__ import annotations

from typing import Any

import redis

from photojobs.api import Client
from store.events import read_events

REDIS_TIMEOUT = 2.0


def _problem(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    lines = str(orig).strip().splitlines()
    return f"{type(orig).__name__}: {lines[0] if lines else ''}".strip(": ")[:300]


def check(client: Client) -> dict[str, Any]:
    """``{"ok": bool, "database": "ok" | error, "redis": "ok" | error, "workers": N | None}``;
    ``ok`` when the database and Redis answer (no live worker is not an outage: jobs wait)."""
    report: dict[str, Any] = {"ok": False, "database": "ok", "redis": "ok", "workers": None}
    try:
        # Read-only: health must not wait for the SQLite write lock (a big submission holds it).
        read_events(client.engine, after=0, limit=1, sequence=False)
        report["workers"] = sum(1 for w in client.workers() if w.get("state") == "live")
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        report["database"] = _problem(exc)
    try:
        conn = redis.Redis.from_url(
            client.settings.redis_url, socket_connect_timeout=REDIS_TIMEOUT, socket_timeout=REDIS_TIMEOUT
        )
        try:
            conn.ping()
        finally:
            conn.close()
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        report["redis"] = _problem(exc)
    report["ok"] = report["database"] == "ok" and report["redis"] == "ok"
    return report
