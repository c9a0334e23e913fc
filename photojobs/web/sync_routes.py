"""``POST /api/sync`` (issue 38): a sync of folders inside the photo roots, as ``photojobs sync``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import ConfigDict, Field

from photojobs.roots import diagnostics_on
from store.errors import SubmissionError

from .auth import authenticate
from .errors import submission_refused
from .routes import IdempotencyKeyHeader, JobRequest
from .safe_json import TextSafeRoute
from .strict import known_query_only

sync_api = APIRouter(
    prefix="/api", dependencies=[Depends(authenticate), Depends(known_query_only)], route_class=TextSafeRoute
)


class SyncRequest(JobRequest):
    """A job request's lanes, paths (folders or files inside the photo roots) and params, and
    whether outdated lane versions run again."""

    model_config = ConfigDict(extra="forbid")
    outdated: bool = Field(
        default=False,
        description="also run each lane again on unchanged photos whose recorded lane version differs",
    )


@sync_api.post("/sync", status_code=200, tags=["jobs"])
def sync(body: SyncRequest, request: Request, idempotency_key: IdempotencyKeyHeader = None) -> dict[str, Any]:
    """Walk the paths and submit one job for the photos that are new or changed since the store
    last saw them: ``{"job": ID | null, "new", "changed", "unchanged", "moved", "missing", …}``
    (``job`` null: nothing changed). 400 a bad lane, parameter or path (one that does not exist),
    403 a path outside the photo roots, 409 an ``Idempotency-Key`` already used with another body,
    429 backlog full. With an ``Idempotency-Key`` used before with the same body: the first sync's
    report (``replayed``), nothing walked.

    Runs in a worker thread: walking a large folder never blocks the event loop."""
    cfg = request.app.state.photojobs
    client = cfg.client
    try:
        report = client.sync(
            body.lanes,
            body.paths,
            body.params,
            outdated=body.outdated,
            allowed_roots=cfg.photo_roots,
            untrusted=True,
            diagnostics=diagnostics_on(client.settings.env),
            priority=body.priority,
            idempotency_key=idempotency_key,
        )
    except SubmissionError as exc:  # outside the roots 403, backlog full 429, the rest 400
        raise submission_refused(exc) from None
    return dict(report.as_dict())
