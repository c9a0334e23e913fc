"""``/api/schedules`` (issue 38): list, add, remove, pause and resume schedules, as
``photojobs schedule …``; a command's paths must lie inside the photo roots."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from photojobs.schedules import BadSchedule
from photojobs.schedules import add as add_schedule
from photojobs.schedules import resume as resume_schedule
from store import schedules as store_schedules
from store.errors import SubmissionError
from store.schedules import ScheduleExists, UnknownSchedule

from .auth import authenticate
from .errors import ApiError, submission_refused
from .safe_json import TextSafeRoute
from .strict import known_query_only

schedules_api = APIRouter(
    prefix="/api", dependencies=[Depends(authenticate), Depends(known_query_only)], route_class=TextSafeRoute
)

ScheduleName = Annotated[str, Path(min_length=1, max_length=64, description="a schedule's name")]


class ScheduleRequest(BaseModel):
    """A schedule: its name, one of ``every``/``cron``, and a ``sync``/``submit`` command line."""

    model_config = ConfigDict(extra="forbid")
    name: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    every: Annotated[str, StringConstraints(max_length=32)] | float | None = Field(
        default=None, description='a tick every so long: "15m", "2h", or seconds'
    )
    cron: Annotated[str, StringConstraints(max_length=128)] | None = Field(
        default=None, description='a five-field crontab line, e.g. "0 3 * * *" (the workers\' time zone)'
    )
    command: list[Annotated[str, StringConstraints(max_length=4096)]] = Field(
        min_length=1,
        max_length=256,
        description='the command line, e.g. ["sync", "/photos/phone", "--lanes", "analysis"]',
    )


def _engine(request: Request) -> Any:
    return request.app.state.photojobs.client.engine


def _not_found(exc: UnknownSchedule) -> ApiError:
    return ApiError(404, "unknown_schedule", str(exc), {"name": exc.name})


@schedules_api.get("/schedules", tags=["schedules"])
def list_schedules(request: Request) -> dict[str, Any]:
    """Every schedule: ``{"schedules": [{"name", "every", "cron", "command", "paused", "running",
    "last_run": {"at", "job"} | null, "next_run", "skipped", "runs", "last_error"}]}``."""
    return {"schedules": [r.as_dict() for r in store_schedules.list_all(_engine(request))]}


@schedules_api.post("/schedules", status_code=201, tags=["schedules"])
def add(body: ScheduleRequest, request: Request) -> dict[str, Any]:
    """Add a schedule, its command checked as that submission would be: 400 a bad name, cadence
    or command line, 403 a path outside the photo roots, 409 the name taken."""
    cfg = request.app.state.photojobs
    try:
        row = add_schedule(
            cfg.client, body.name, body.command, every=body.every, cron=body.cron,
            allowed_roots=cfg.photo_roots, untrusted=True,
        )  # fmt: skip
    except ScheduleExists as exc:
        raise ApiError(409, "schedule_exists", str(exc), {"name": exc.name}) from None
    except BadSchedule as exc:
        raise ApiError(400, "invalid_schedule", str(exc)) from None
    except SubmissionError as exc:
        raise submission_refused(exc) from None
    return row.as_dict()


@schedules_api.delete("/schedules/{name}", tags=["schedules"])
def remove(name: ScheduleName, request: Request) -> dict[str, Any]:
    """Remove a schedule (a run under way finishes); 404 unknown."""
    try:
        store_schedules.remove(_engine(request), name)
    except UnknownSchedule as exc:
        raise _not_found(exc) from None
    return {"name": name, "removed": True}


@schedules_api.post("/schedules/{name}/pause", tags=["schedules"])
def pause(name: ScheduleName, request: Request) -> dict[str, Any]:
    """Pause a schedule: none of its ticks runs; ``changed`` false when it was paused already."""
    try:
        changed = store_schedules.pause(_engine(request), name)
    except UnknownSchedule as exc:
        raise _not_found(exc) from None
    return {**store_schedules.get(_engine(request), name).as_dict(), "changed": changed}


@schedules_api.post("/schedules/{name}/resume", tags=["schedules"])
def resume(name: ScheduleName, request: Request) -> dict[str, Any]:
    """Resume a schedule from its next tick (missed ticks are not run); ``changed`` false when it
    was not paused."""
    try:
        changed = resume_schedule(_engine(request), name)
    except UnknownSchedule as exc:
        raise _not_found(exc) from None
    return {**store_schedules.get(_engine(request), name).as_dict(), "changed": changed}
