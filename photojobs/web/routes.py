"""The ``/api`` endpoints (shapes match the CLI's ``--json``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from photojobs.api import NotApplicable, SubmissionError, UnknownJob
from photojobs.roots import OutsideRoots
from store.errors import BacklogFull
from store.events import read_events
from store.jobs import JobStatus
from store.listing import JOB_STATES
from store.models import ALL_STATES

from . import sse
from .auth import COOKIE, SESSION_TTL, authenticate, make_session, origin_allowed, own_origin, token_matches
from .errors import ApiError

public = APIRouter()
api = APIRouter(prefix="/api", dependencies=[Depends(authenticate)])

BACKLOG_RETRY_AFTER = 30


class JobRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lanes: list[str] | str = Field(description='the pipeline, e.g. ["analysis", "exif"] or "analysis,exif"')
    paths: list[str] = Field(min_length=1, description="files or folders inside the photo roots")
    params: dict[str, Any] = Field(
        default_factory=dict, description='lane parameters, e.g. {"exif.rating": 4}'
    )


class SessionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: str


class PruneRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    older_than: str | float = Field(description='an age such as "30d", "12h" or seconds')


def _cfg(request: Request) -> Any:
    return request.app.state.photojobs


def status_dict(st: JobStatus) -> dict[str, Any]:
    """STATUS: the shape of ``photojobs status --json`` plus control, lane order, totals, params."""
    return {
        **st.as_dict(),
        "lane_order": st.lane_order,
        "totals": {k: v for k, v in st.totals().items() if v},
        "created_at": st.created_at,
        "params": st.params,
    }


def _unknown(exc: UnknownJob) -> ApiError:
    return ApiError(404, "unknown_job", str(exc), {"job": exc.job_id})


def _check_state(state: str | None) -> None:
    if state is not None and state not in ALL_STATES:
        raise ApiError(
            400, "invalid_request", f"unknown item state {state!r}; states: {', '.join(ALL_STATES)}"
        )


# -- public: health, login -----------------------------------------------------------------------
@public.get("/healthz", tags=["ops"])
def healthz(request: Request) -> dict[str, Any]:
    """Liveness and store reachability (no authentication)."""
    try:
        # A read-only query: health must not wait for the SQLite write lock (a big submission holds it).
        read_events(_cfg(request).client.engine, after=0, limit=1, sequence=False)
        store = "ok"
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        raise ApiError(
            503, "store_unavailable", f"the store is not reachable: {type(exc).__name__}"
        ) from None
    return {"ok": True, "store": store}


@public.post("/api/session", status_code=204, tags=["auth"])
def login(body: SessionRequest, request: Request, response: Response) -> Response:
    """Exchange the API token for a session cookie (HttpOnly, SameSite=Strict)."""
    cfg = _cfg(request)
    origin = request.headers.get("origin")
    if origin is not None and not origin_allowed(origin, own_origin(request), cfg.allowed_origins):
        raise ApiError(403, "bad_origin", "log in from this app's own page", {"origin": origin})
    if cfg.token is not None and not token_matches(body.token, cfg.token):
        raise ApiError(401, "unauthorized", "the token is wrong")
    response.status_code = 204
    response.set_cookie(
        COOKIE,
        make_session(cfg.token or "open"),
        max_age=SESSION_TTL,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path=(request.scope.get("root_path") or "") + "/",
    )
    return response


@public.delete("/api/session", status_code=204, tags=["auth"])
def logout(request: Request, response: Response) -> Response:
    """Forget the session cookie."""
    response.status_code = 204
    response.delete_cookie(COOKIE, path=(request.scope.get("root_path") or "") + "/")
    return response


@api.get("/session", tags=["auth"])
def whoami(via: str = Depends(authenticate)) -> dict[str, Any]:
    """Whether the request is authenticated, and how (bearer, cookie, open)."""
    return {"authenticated": True, "via": via}


# -- jobs --------------------------------------------------------------------------------------------
@api.post("/jobs", status_code=201, tags=["jobs"])
def submit(body: JobRequest, request: Request) -> dict[str, Any]:
    """Submit a job. 400 bad lane/parameter/path, 403 path outside the photo roots, 429 backlog full.

    Runs in a worker thread: walking a large folder never blocks the event loop."""
    cfg = _cfg(request)
    client = cfg.client
    try:
        plan = client.plan(body.lanes, body.paths, body.params, allowed_roots=cfg.photo_roots)
        done = client.submit(plan.lanes, [], plan=plan)
    except OutsideRoots as exc:
        raise ApiError(403, "outside_roots", str(exc), {"path": exc.path}) from None
    except BacklogFull as exc:
        raise ApiError(
            429,
            "backlog_full",
            str(exc),
            {"lane": exc.lane, "backlog": exc.backlog, "adding": exc.adding, "bound": exc.bound},
            headers={"Retry-After": str(BACKLOG_RETRY_AFTER)},
        ) from None
    except SubmissionError as exc:
        raise ApiError(400, "invalid_submission", str(exc), {"kind": type(exc).__name__}) from None
    return {"job": done.job_id, "items": done.items}


@api.get("/jobs", tags=["jobs"])
def list_jobs(
    request: Request,
    state: str | None = Query(None, description="a job state: running, paused, succeeded, failed, ..."),
    limit: int = Query(20, ge=1, le=1000),
    after: int | None = Query(None, description="the previous page's next"),
) -> dict[str, Any]:
    """Jobs newest first: ``{"jobs": [STATUS, …], "next": CURSOR | null}``."""
    if state is not None and state not in JOB_STATES:
        raise ApiError(
            400, "invalid_request", f"unknown job state {state!r}; states: {', '.join(JOB_STATES)}"
        )
    jobs, nxt = _cfg(request).client.list_jobs(state=state, limit=limit, after=after)
    return {"jobs": [status_dict(j) for j in jobs], "next": nxt}


@api.get("/jobs/{job_id}", tags=["jobs"])
def job(job_id: int, request: Request) -> dict[str, Any]:
    """STATUS with failures grouped by reason class (counts and examples) and destinations."""
    client = _cfg(request).client
    try:
        st = client.status(job_id)
        failures = client.failures(job_id)
    except UnknownJob as exc:
        raise _unknown(exc) from None
    return {
        **status_dict(st),
        "failures": [g.as_dict() for g in failures],
        "destinations": client.destinations(st),
    }


@api.get("/jobs/{job_id}/items", tags=["jobs"])
def items(
    job_id: int,
    request: Request,
    state: str | None = Query(None),
    lane: str | None = Query(None),
    limit: int = Query(100, ge=1, le=1000),
    after: int | None = Query(None, description="the previous page's next (an item id)"),
) -> dict[str, Any]:
    """A job's items in id order: ``{"items": [...], "next": CURSOR | null}``."""
    _check_state(state)
    try:
        rows, nxt = _cfg(request).client.items(job_id, state=state, lane=lane, limit=limit, after=after)
    except UnknownJob as exc:
        raise _unknown(exc) from None
    return {"items": [r.as_dict() for r in rows], "next": nxt}


def _act(request: Request, job_id: int, action: str, lane: str | None = None) -> dict[str, Any]:
    client = _cfg(request).client
    try:
        if action == "retry":
            changed = client.retry(job_id, lane)
        else:
            changed = client.control(action, job_id)
        st = client.status(job_id)
    except UnknownJob as exc:
        raise _unknown(exc) from None
    except NotApplicable as exc:
        raise ApiError(409, "not_applicable", str(exc), {"job": job_id, "action": action}) from None
    except SubmissionError as exc:
        raise ApiError(400, "invalid_request", str(exc)) from None
    return {"job": job_id, "action": action, "changed": changed, "status": status_dict(st)}


@api.post("/jobs/{job_id}/cancel", tags=["control"])
def cancel(job_id: int, request: Request) -> dict[str, Any]:
    """Cancel: not-yet-running items now, running ones at their next safe point. 409 when finished."""
    return _act(request, job_id, "cancel")


@api.post("/jobs/{job_id}/pause", tags=["control"])
def pause(job_id: int, request: Request) -> dict[str, Any]:
    """Pause a running job (resumable). 409 unless running."""
    return _act(request, job_id, "pause")


@api.post("/jobs/{job_id}/resume", tags=["control"])
def resume(job_id: int, request: Request) -> dict[str, Any]:
    """Resume a paused job. 409 unless paused."""
    return _act(request, job_id, "resume")


@api.post("/jobs/{job_id}/retry", tags=["control"])
def retry(job_id: int, request: Request, lane: str | None = Query(None)) -> dict[str, Any]:
    """Failed and cancelled items (of ``lane``) back to pending. 409 when there are none."""
    return _act(request, job_id, "retry", lane)


# -- events, workers, housekeeping ---------------------------------------------------------------
@api.get("/events", tags=["events"])
def events(
    request: Request,
    after: int = Query(0, ge=0, description="cursor: events after this one"),
    job: int | None = Query(None),
    limit: int = Query(1000, ge=1, le=10000),
    tail: int | None = Query(None, ge=1, le=1000, description="instead of after: the newest N events"),
) -> dict[str, Any]:
    """Events in cursor order: ``{"events": [...], "next": CURSOR}`` (pass ``next`` as ``after``)."""
    client = _cfg(request).client
    if tail is not None:
        batch = client.latest_events(job_id=job, limit=tail)
    else:
        batch = client.events(after=after, job_id=job, limit=limit)
    nxt = batch[-1].cursor if batch else after
    return {"events": [e.as_dict() for e in batch], "next": nxt}


@api.get("/events/stream", tags=["events"], response_class=StreamingResponse)
async def stream(
    request: Request,
    after: int | None = Query(None, ge=0, description="start after this cursor (Last-Event-ID wins)"),
    job: int | None = Query(None),
    last_event_id: str | None = Header(None),
) -> StreamingResponse:
    """Server-Sent Events: ``id:`` cursor, ``event:`` type, ``data:`` the event JSON; resumable."""
    cfg = _cfg(request)
    start = after or 0
    if last_event_id:
        if not last_event_id.strip().isdigit():
            raise ApiError(400, "invalid_request", f"Last-Event-ID {last_event_id!r} is not a cursor")
        start = int(last_event_id.strip())
    return StreamingResponse(
        sse.stream(
            request,
            cfg.client.engine,
            cfg.sequencer,
            after=start,
            job_id=job,
            keepalive=cfg.keepalive,
            poll=cfg.poll,
        ),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@api.get("/workers", tags=["workers"])
def workers(request: Request) -> dict[str, Any]:
    """Live workers (from their leases): host, pid, lanes, items held, last heartbeat."""
    return {"workers": _cfg(request).client.workers()}


@api.post("/prune", tags=["ops"])
def prune(body: PruneRequest, request: Request) -> dict[str, Any]:
    """Delete finished jobs and events older than ``older_than`` (the newest event always stays)."""
    try:
        done = _cfg(request).client.prune(body.older_than)
    except ValueError as exc:
        raise ApiError(400, "invalid_request", str(exc)) from None
    return done.as_dict()
