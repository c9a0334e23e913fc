"""``GET /api/webhooks`` (issue 38): each webhook target's delivery state, as the console shows it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from photojobs.webhooks import webhook_config
from store import webhooks as webhook_state

from .auth import authenticate
from .safe_json import TextSafeRoute
from .strict import known_query_only

webhooks_api = APIRouter(
    prefix="/api", dependencies=[Depends(authenticate), Depends(known_query_only)], route_class=TextSafeRoute
)


@webhooks_api.get("/webhooks", tags=["ops"])
def webhook_list(request: Request) -> dict[str, Any]:
    """``{"configured": {"host", "target"} | null, "webhooks": [...]}``: the target this server's
    ``PHOTOJOBS_WEBHOOK_URL`` names (its host only: the URL's path may hold a token), and every
    target's state in the store — ``cursor`` delivered through, ``lag`` (``job_finished`` events
    after it), ``delivered``, ``failures``, the current event's ``attempts`` and ``next_attempt_at``,
    ``last_status``/``last_error``, and the sweeper delivering it (``owner``)."""
    client = request.app.state.photojobs.client
    config = webhook_config(client.settings.env)
    configured = None if config is None else {"host": config.host, "target": config.target}
    return {"configured": configured, "webhooks": webhook_state.status(client.engine)}
