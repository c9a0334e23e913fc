"""The ``/api/lanes`` endpoints: every lane with its pause state; pause and resume a lane across all jobs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request

from photojobs.api import UnknownLane

from .auth import authenticate
from .errors import ApiError
from .safe_json import TextSafeRoute
from .strict import known_query_only

lanes = APIRouter(
    prefix="/api", dependencies=[Depends(authenticate), Depends(known_query_only)], route_class=TextSafeRoute
)

LaneName = Annotated[str, Path(min_length=1, max_length=64, description="a lane name, e.g. exif")]


def _client(request: Request) -> Any:
    return request.app.state.photojobs.client


@lanes.get("/lanes", tags=["lanes"])
def lane_list(request: Request) -> dict[str, Any]:
    """Every lane: ``{"lanes": [{"lane", "paused", "paused_at"}]}`` (``paused_at``: epoch seconds)."""
    return {"lanes": _client(request).lanes()}


def _control(request: Request, lane: str, action: str, via: str) -> dict[str, Any]:
    client = _client(request)
    try:
        changed = getattr(client, f"{action}_lane")(lane, by=f"web:{via}")
    except UnknownLane as exc:
        raise ApiError(404, "unknown_lane", str(exc), {"lane": lane}) from None
    state = next(entry for entry in client.lanes() if entry["lane"] == lane)
    return {"lane": lane, "action": action, "changed": changed, **state}


@lanes.post("/lanes/{lane}/pause", tags=["lanes"])
def pause_lane(lane: LaneName, request: Request, via: str = Depends(authenticate)) -> dict[str, Any]:
    """Pause a lane across all jobs: its queued work is not started, running items finish.
    ``changed`` is false when it was paused already (pausing twice is not an error). Survives restarts."""
    return _control(request, lane, "pause", via)


@lanes.post("/lanes/{lane}/resume", tags=["lanes"])
def resume_lane(lane: LaneName, request: Request, via: str = Depends(authenticate)) -> dict[str, Any]:
    """Resume a paused lane; ``changed`` is false when it was not paused."""
    return _control(request, lane, "resume", via)
