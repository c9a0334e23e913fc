"""The console's ``/api`` endpoints of issue 33: an item's attempts, and bulk actions over every job a
jobs filter matches (previewed with a count, applied only when the count is still the one the
operator confirmed)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from store.console import CONSOLE_JOB_STATES, MAX_BULK, UnknownItem, matching_jobs
from store.errors import UnknownJob

from .auth import authenticate
from .errors import ApiError
from .safe_json import TextSafeRoute
from .strict import known_query_only

console = APIRouter(
    prefix="/api", dependencies=[Depends(authenticate), Depends(known_query_only)], route_class=TextSafeRoute
)

MAX_ROW_ID = 2**31 - 1
MAX_SEARCH = 200
RowId = Annotated[int, Path(ge=1, le=2**63 - 1)]
StateQuery = Annotated[str | None, Query(max_length=32, description="a job state, as GET /api/jobs")]
SearchQuery = Annotated[str | None, Query(max_length=MAX_SEARCH, description="a search, as GET /api/jobs")]
ACTIONS = ("retry", "cancel", "discard")


class BulkRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: Literal["retry", "cancel", "discard"] = Field(
        description="retry: failed items back to work; cancel: the jobs; discard: failed items skipped"
    )
    state: str | None = Field(default=None, max_length=32, description="the filter's job state")
    q: str | None = Field(default=None, max_length=MAX_SEARCH, description="the filter's search")
    expected: int = Field(
        ge=0, le=MAX_BULK, description="how many jobs the operator saw match (GET /api/bulk)"
    )


def _client(request: Request) -> Any:
    return request.app.state.photojobs.client


def _filter(state: str | None, q: str | None) -> tuple[str | None, str | None]:
    if state is not None and state not in CONSOLE_JOB_STATES:
        raise ApiError(
            400, "invalid_request", f"unknown job state {state!r}; states: {', '.join(CONSOLE_JOB_STATES)}"
        )
    if q is not None and "\x00" in q:
        raise ApiError(400, "invalid_request", "the search contains a NUL character")
    return state or None, (q or "").strip() or None


def _matching(request: Request, state: str | None, q: str | None) -> list[int]:
    ids = matching_jobs(_client(request).engine, state=state, query=q, cap=MAX_BULK)
    if len(ids) > MAX_BULK:
        raise ApiError(
            400,
            "too_many_jobs",
            f"the filter matches more than {MAX_BULK} jobs; narrow it (a state, a search)",
            {"bound": MAX_BULK},
        )
    return ids


@console.get("/bulk", tags=["control"])
def bulk_preview(request: Request, state: StateQuery = None, q: SearchQuery = None) -> dict[str, Any]:
    """How many jobs a jobs filter (``state``, ``q``: as ``GET /api/jobs``) matches, and the first
    20 of their ids: what ``POST /api/bulk`` would act on. 400 past 10,000 jobs."""
    state, q = _filter(state, q)
    ids = _matching(request, state, q)
    return {"count": len(ids), "jobs": ids[:20], "state": state, "q": q}


@console.post("/bulk", tags=["control"])
def bulk(body: BulkRequest, request: Request) -> dict[str, Any]:
    """Act on every job the filter matches: ``retry`` (each job's failed items back to work),
    ``cancel``, or ``discard`` (each job's failed items become skipped). ``expected`` is the count
    the operator confirmed (``GET /api/bulk``): 409 when the filter now matches another number of
    jobs, and nothing is changed. Answers ``{"matched", "jobs" changed, "items" changed, "skipped"
    jobs it did not apply to}``."""
    state, q = _filter(body.state, body.q)
    ids = _matching(request, state, q)
    if len(ids) != body.expected:
        raise ApiError(
            409,
            "filter_changed",
            f"the filter now matches {len(ids)} job(s), not the {body.expected} confirmed; look again",
            {"matched": len(ids), "expected": body.expected},
        )
    done = _client(request).bulk(body.action, ids)
    return {"action": body.action, "matched": len(ids), **done}


@console.get("/jobs/{job_id}/items/{item_id}", tags=["jobs"])
def item_page(job_id: RowId, item_id: RowId, request: Request) -> dict[str, Any]:
    """An item of a job with its attempts, oldest first (``attempt``, ``token``, ``worker``,
    ``claimed_at``, ``waited``, ``ended_at``, ``ran``, ``outcome``, ``error``, ``traceback``: the
    bounded traceback of an unexpected exception) and all its events. 404 an unknown job or item."""
    if job_id > MAX_ROW_ID or item_id > MAX_ROW_ID:
        raise ApiError(
            404, "unknown_item", f"job {job_id} has no item {item_id}", {"job": job_id, "item": item_id}
        )
    try:
        return dict(_client(request).item_history(job_id, item_id))
    except UnknownJob as exc:
        raise ApiError(404, "unknown_job", str(exc), {"job": job_id}) from None
    except UnknownItem as exc:
        raise ApiError(404, "unknown_item", str(exc), {"job": job_id, "item": item_id}) from None


__all__ = ["console", "ACTIONS"]
