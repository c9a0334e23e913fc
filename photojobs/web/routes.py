"""The ``/api`` endpoints (shapes match the CLI's ``--json``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator
from starlette.background import BackgroundTask

from photojobs.api import Client, NotApplicable, SubmissionError, UnknownJob
from photos.params import SKIPPED_KEY
from store.console import CONSOLE_JOB_STATES, MOVING
from store.jobs import JobStatus
from store.models import ALL_STATES
from store.sessions import create_session, revoke_session

from . import health, sse
from .auth import (
    COOKIE,
    OPERATOR,
    VIEWER,
    authenticate,
    client_address,
    make_session,
    origin_allowed,
    own_origin,
    refuse_if_limited,
    role_of,
    token_role,
)
from .errors import ApiError, submission_refused
from .safe_json import TextSafeRoute
from .strict import known_query_only

public = APIRouter(dependencies=[Depends(known_query_only)], route_class=TextSafeRoute)
api = APIRouter(
    prefix="/api", dependencies=[Depends(authenticate), Depends(known_query_only)], route_class=TextSafeRoute
)

# Ids of jobs and items are 32-bit columns on PostgreSQL; event cursors are 64-bit.
MAX_ROW_ID = 2**31 - 1
MAX_CURSOR = 2**63 - 1
MAX_PATH = 4096
MAX_COMPONENT = 255
MAX_PATHS = 10_000
MAX_SEARCH = 200
MAX_REASON = 300  # a reason class is at most 300 characters (store.reasons)

JobId = Annotated[int, Path(ge=1, le=MAX_CURSOR, description="a job id")]
JobFilter = Annotated[int | None, Query(ge=1, le=MAX_CURSOR, description="only this job's events")]
ItemFilter = Annotated[int | None, Query(ge=1, le=MAX_CURSOR, description="only this item's events")]
PathText = Annotated[str, StringConstraints(min_length=1, max_length=MAX_PATH)]


class JobRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lanes: (
        list[Annotated[str, StringConstraints(max_length=64)]]
        | Annotated[str, StringConstraints(max_length=1024)]
    ) = Field(description='the pipeline, e.g. ["analysis", "exif"] or "analysis,exif"', max_length=64)
    paths: list[PathText] = Field(
        min_length=1,
        description=f"files or folders inside the photo roots (at most {MAX_PATHS} distinct, each at "
        f"most {MAX_PATH} characters with components of at most {MAX_COMPONENT}); repeats count once",
    )
    params: dict[str, Any] = Field(
        default_factory=dict, description='lane parameters, e.g. {"exif.rating": 4}'
    )
    priority: Literal["interactive", "normal"] | None = Field(
        default=None,
        description="interactive: before the lanes' queued backlog (an upload a user waits for); "
        "default: interactive when the job has at most 16 photos (PHOTOJOBS_INTERACTIVE_PHOTOS)",
    )

    @field_validator("paths")
    @classmethod
    def _distinct_sane_paths(cls, paths: list[str]) -> list[str]:
        """Each path once (in first-seen order), no NUL, no component over the file-name limit."""
        distinct = list(dict.fromkeys(paths))
        if len(distinct) > MAX_PATHS:
            raise ValueError(f"at most {MAX_PATHS} distinct paths per job, not {len(distinct)}")
        for p in distinct:
            if "\x00" in p:
                raise ValueError(f"path {p[:80]!r} contains a NUL character")
            longest = max(p.split("/"), key=len)
            if len(longest) > MAX_COMPONENT:
                raise ValueError(
                    f"path component {longest[:40]!r}… is {len(longest)} characters (at most {MAX_COMPONENT})"
                )
        return distinct


class SessionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: str = Field(max_length=4096)


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
        "skipped": st.params.get(SKIPPED_KEY, {}),
    }


def _unknown(exc: UnknownJob) -> ApiError:
    return ApiError(404, "unknown_job", str(exc), {"job": exc.job_id})


def _check_state(state: str | None) -> None:
    if state is not None and state not in ALL_STATES:
        raise ApiError(
            400, "invalid_request", f"unknown item state {state!r}; states: {', '.join(ALL_STATES)}"
        )


# -- public: health, login -----------------------------------------------------------------------
@public.get("/healthz", tags=["ops"], responses={503: {"description": "the database or Redis is down"}})
def healthz(request: Request) -> JSONResponse:
    """Each component: ``{"ok", "database": "ok" | error, "redis": "ok" | error, "workers": N}``
    (no authentication); 503 when the database or Redis is out of reach."""
    report = health.check(_cfg(request).client)
    if report["ok"]:
        return JSONResponse(report)
    down = [k for k in ("database", "redis") if report[k] != "ok"]
    return JSONResponse(
        {**report, "error": "unhealthy", "message": f"not reachable: {', '.join(down)}", "detail": None},
        status_code=503,
        headers={"Retry-After": "5"},
    )


def _cookie_path(request: Request) -> str:
    return (request.scope.get("root_path") or "") + "/"


@public.post("/api/session", status_code=204, tags=["auth"])
def login(body: SessionRequest, request: Request, response: Response) -> Response:
    """Exchange the API token for a session cookie (HttpOnly, SameSite=Strict), recorded server-side:
    it ends at logout, after ``PHOTOJOBS_SESSION_IDLE`` without a request, or at
    ``PHOTOJOBS_SESSION_MAX_AGE``. Too many wrong tokens from one address: 429 with Retry-After."""
    cfg = _cfg(request)
    origin = request.headers.get("origin")
    if origin is not None and not origin_allowed(origin, own_origin(request), cfg.allowed_origins):
        raise ApiError(403, "bad_origin", "log in from this app's own page", {"origin": origin})
    refuse_if_limited(request)
    role = token_role(body.token, cfg) if cfg.token is not None else OPERATOR
    if role is None:
        cfg.login_limiter.failed(client_address(request))
        raise ApiError(401, "unauthorized", "the token is wrong")
    signer = cfg.viewer_token if role == VIEWER else cfg.token
    cookie = make_session(signer or "open", ttl=cfg.session_max_age)
    create_session(cfg.client.engine, cookie, idle=cfg.session_idle, max_age=cfg.session_max_age)
    response.status_code = 204
    response.set_cookie(
        COOKIE,
        cookie,
        max_age=int(cfg.session_max_age),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path=_cookie_path(request),
    )
    return response


@public.delete("/api/session", status_code=204, tags=["auth"])
def logout(request: Request, response: Response) -> Response:
    """End the session: revoked in the store (a copy of the cookie no longer works) and forgotten."""
    cookie = request.cookies.get(COOKIE)
    if cookie:
        revoke_session(_cfg(request).client.engine, cookie)
    response.status_code = 204
    response.delete_cookie(COOKIE, path=_cookie_path(request))
    return response


@api.get("/session", tags=["auth"])
def whoami(request: Request, via: str = Depends(authenticate)) -> dict[str, Any]:
    """Whether the request is authenticated, how (bearer, cookie, open), and its role (``operator``,
    or ``viewer``: read-only, every state change 403)."""
    return {"authenticated": True, "via": via, "role": role_of(request)}


# -- jobs --------------------------------------------------------------------------------------------
IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        max_length=255,
        description="a retry with the same key and body answers the first job (200, `replayed`); "
        "the same key with another body is refused (409); keys are kept PHOTOJOBS_IDEMPOTENCY_KEEP",
    ),
]


@api.post("/jobs", status_code=201, tags=["jobs"])
def submit(
    body: JobRequest, request: Request, response: Response, idempotency_key: IdempotencyKeyHeader = None
) -> dict[str, Any]:
    """Submit a job. 400 bad lane/parameter/path (an S3 endpoint, a raw s3:// target, diagnostics
    without PHOTOJOBS_DIAGNOSTICS=1), 403 a path or destination outside the photo/output roots,
    409 an ``Idempotency-Key`` already used with another body, 429 backlog full. With an
    ``Idempotency-Key`` used before with the same body: 200 and the first job (``replayed``).

    Runs in a worker thread: walking a large folder never blocks the event loop."""
    from photojobs.api import submit_request
    from photojobs.roots import diagnostics_on
    from store.idempotency import make

    cfg = _cfg(request)
    client = cfg.client
    try:
        idem = None
        if idempotency_key is not None:
            asked = submit_request(body.lanes, body.paths, body.params, body.priority)
            idem = make("jobs", idempotency_key, asked)
            earlier = client.earlier_submission(idem)  # before walking the folders again
            if earlier is not None:
                response.status_code = 200
                return earlier.as_dict()
        plan = client.plan(
            body.lanes,
            body.paths,
            body.params,
            allowed_roots=cfg.photo_roots,
            untrusted=True,
            diagnostics=diagnostics_on(client.settings.env),
        )
        done = client.submit(plan.lanes, [], plan=plan, priority=body.priority, idempotency_key=idem)
    except SubmissionError as exc:  # outside the roots 403, backlog full 429, key reused 409, the rest 400
        raise submission_refused(exc) from None
    if done.replayed:
        response.status_code = 200
    return done.as_dict()


@api.get("/jobs", tags=["jobs"])
def list_jobs(
    request: Request,
    state: str | None = Query(None, description="a job state: running, paused, succeeded, failed, ..."),
    q: str | None = Query(
        None, max_length=MAX_SEARCH, description="search: a job id, a lane, a parameter or a photo path"
    ),
    limit: int = Query(20, ge=1, le=1000),
    after: int | None = Query(None, ge=0, le=MAX_CURSOR, description="the previous page's next"),
) -> dict[str, Any]:
    """Jobs filtered by state and search, the moving ones first (then the rest), each part newest
    first (newest first with a state): ``{"jobs": [STATUS, …], "next": CURSOR | null}``; following
    ``next`` reaches every job."""
    if state is not None and state not in CONSOLE_JOB_STATES:
        raise ApiError(
            400, "invalid_request", f"unknown job state {state!r}; states: {', '.join(CONSOLE_JOB_STATES)}"
        )
    if q is not None and "\x00" in q:
        raise ApiError(400, "invalid_request", "the search contains a NUL character")
    if after is not None and after > MOVING + MAX_ROW_ID:
        after = None  # every cursor is below it (a job id, or MOVING + one): the first page
    client = _cfg(request).client
    jobs, nxt = client.find_jobs(state=state, search=q, limit=limit, after=after)
    etas = client.etas(jobs)
    return {"jobs": [status_dict(j) | {"eta": etas.get(j.job_id)} for j in jobs], "next": nxt}


@api.get("/jobs/{job_id}", tags=["jobs"])
def job(job_id: JobId, request: Request) -> dict[str, Any]:
    """STATUS with failures grouped by reason class (counts and examples) and destinations."""
    client = _cfg(request).client
    _known_range(job_id)
    try:
        st = client.status(job_id)
        failures = client.failures(job_id)
    except UnknownJob as exc:
        raise _unknown(exc) from None
    return {
        **status_dict(st),
        "failures": [g.as_dict() for g in failures],
        "destinations": client.destinations(st),
        "times": client.job_times(st).as_dict(),
    }


@api.get("/jobs/{job_id}/items", tags=["jobs"])
def items(
    job_id: JobId,
    request: Request,
    state: str | None = Query(None, max_length=32),
    lane: str | None = Query(None, max_length=64),
    limit: int = Query(100, ge=1, le=1000),
    after: int | None = Query(None, ge=0, le=MAX_CURSOR, description="the previous page's next (an item id)"),
) -> dict[str, Any]:
    """A job's items in id order: ``{"items": [...], "next": CURSOR | null}``."""
    _check_state(state)
    _known_range(job_id)
    try:
        if after is not None and after >= MAX_ROW_ID:
            _cfg(request).client.status(job_id)  # 404 for an unknown job, as without the cursor
            return {"items": [], "next": None}  # no item id is above it
        rows, nxt = _cfg(request).client.items(job_id, state=state, lane=lane, limit=limit, after=after)
    except UnknownJob as exc:
        raise _unknown(exc) from None
    return {"items": [r.as_dict() for r in rows], "next": nxt}


def _known_range(job_id: int) -> None:
    """404 for a job id no store row can have (PostgreSQL's ids are 32-bit)."""
    if job_id > MAX_ROW_ID:
        raise ApiError(404, "unknown_job", f"no job with id {job_id}", {"job": job_id})


def _act(
    request: Request, job_id: int, action: str, change: Callable[[Client], int] | None = None
) -> dict[str, Any]:
    """Do ``action`` to the job (``change(client)``, how many items changed; the job control of that
    name when None) and answer with the job's status: 404 an unknown job, 409 not applicable, 400
    a bad input."""
    client = _cfg(request).client
    _known_range(job_id)
    try:
        changed = change(client) if change is not None else client.control(action, job_id)
        st = client.status(job_id)
    except UnknownJob as exc:
        raise _unknown(exc) from None
    except NotApplicable as exc:
        raise ApiError(409, "not_applicable", str(exc), {"job": job_id, "action": action}) from None
    except SubmissionError as exc:
        raise ApiError(400, "invalid_request", str(exc)) from None
    return {"job": job_id, "action": action, "changed": changed, "status": status_dict(st)}


@api.post("/jobs/{job_id}/cancel", tags=["control"])
def cancel(job_id: JobId, request: Request) -> dict[str, Any]:
    """Cancel: not-yet-running items now, running ones at their next safe point. 409 when finished."""
    return _act(request, job_id, "cancel")


@api.post("/jobs/{job_id}/pause", tags=["control"])
def pause(job_id: JobId, request: Request) -> dict[str, Any]:
    """Pause a running job (resumable). 409 unless running."""
    return _act(request, job_id, "pause")


@api.post("/jobs/{job_id}/resume", tags=["control"])
def resume(job_id: JobId, request: Request) -> dict[str, Any]:
    """Resume a paused job. 409 unless paused."""
    return _act(request, job_id, "resume")


LaneQuery = Annotated[str | None, Query(max_length=64, description="a lane")]
ReasonQuery = Annotated[
    str | None, Query(max_length=MAX_REASON, description="a failure group's reason class (with lane)")
]
ItemQuery = Annotated[int | None, Query(ge=1, le=MAX_CURSOR, description="one item of the job")]


def _chosen(
    request: Request, job_id: int, lane: str | None, reason: str | None, item: int | None
) -> list[int] | None:
    """The items a retry or discard is limited to: one item, one failure group (lane + reason),
    or None (every failed item, of ``lane`` when given)."""
    if item is not None and reason is not None:
        raise ApiError(400, "invalid_request", "give an item or a failure group (lane and reason), not both")
    if item is not None:
        return [item] if item <= MAX_ROW_ID else []
    if reason is None:
        return None
    if lane is None:
        raise ApiError(400, "invalid_request", "a failure group is named by its lane and its reason")
    try:
        return _cfg(request).client.failure_group(job_id, lane, "failed", reason)
    except UnknownJob as exc:
        raise _unknown(exc) from None


@api.post("/jobs/{job_id}/retry", tags=["control"])
def retry(
    job_id: JobId,
    request: Request,
    lane: LaneQuery = None,
    reason: ReasonQuery = None,
    item: ItemQuery = None,
) -> dict[str, Any]:
    """Failed and cancelled items back to pending: all of them, a lane's (``lane``), one failure
    group's (``lane`` and ``reason``, as ``GET /api/jobs/{id}`` lists them) or one ``item``'s.
    409 when there are none."""
    _known_range(job_id)
    chosen = _chosen(request, job_id, lane, reason, item)
    return _act(request, job_id, "retry", lambda client: client.retry(job_id, lane, items=chosen))


@api.post("/jobs/{job_id}/discard", tags=["control"])
def discard(
    job_id: JobId,
    request: Request,
    lane: LaneQuery = None,
    reason: ReasonQuery = None,
    item: ItemQuery = None,
) -> dict[str, Any]:
    """Give up on failed items — one ``item``, one failure group (``lane`` and ``reason``), a
    lane's or all: they become ``skipped`` (error kept, ``item_discarded`` events) and a retry no
    longer picks them up. 409 when none of them is failed."""

    def change(client: Client) -> int:
        chosen = _chosen(request, job_id, lane, reason, item)
        if chosen is None:  # a lane's or all failed items: every page, not only the first
            chosen, after = [], None
            while True:
                rows, after = client.items(job_id, state="failed", lane=lane, limit=1000, after=after)
                chosen += [r.id for r in rows]
                if after is None:
                    break
        return client.discard(job_id, chosen)

    return _act(request, job_id, "discard", change)


@api.get("/jobs/{job_id}/failures", tags=["jobs"])
def failure_group(
    job_id: JobId,
    request: Request,
    lane: Annotated[str, Query(min_length=1, max_length=64)],
    reason: Annotated[str, Query(min_length=1, max_length=MAX_REASON)],
    state: Annotated[str, Query(max_length=32)] = "failed",
    limit: int = Query(100, ge=1, le=1000),
    after: int | None = Query(None, ge=0, le=MAX_CURSOR, description="the previous page's next"),
) -> dict[str, Any]:
    """Every item of one failure group ("show all"): ``{"items": [...], "total": N, "next"}``."""
    _check_state(state)
    _known_range(job_id)
    client = _cfg(request).client
    try:
        ids = client.failure_group(job_id, lane, state, reason)
    except UnknownJob as exc:
        raise _unknown(exc) from None
    if after is not None:
        ids_page = [i for i in ids if i > after]
    else:
        ids_page = ids
    page = ids_page[:limit]
    rows = []
    if page:
        wanted = set(page)
        cursor = page[0] - 1
        while cursor < page[-1]:
            batch, nxt = client.items(job_id, state=state, lane=lane, limit=1000, after=cursor)
            rows += [r for r in batch if r.id in wanted]
            if nxt is None:
                break
            cursor = nxt
    nxt_cursor = page[-1] if len(ids_page) > limit else None
    return {"items": [r.as_dict() for r in rows], "total": len(ids), "next": nxt_cursor}


@api.get("/console/lanes", tags=["lanes"])
def lane_overview(
    request: Request,
    window: float = Query(3600.0, ge=60, le=86400, description="seconds of history"),
    bucket: float = Query(60.0, ge=10, le=3600, description="seconds per bar"),
) -> dict[str, Any]:
    """Every lane: paused, queue depth (waiting, pending, queued, running, paused), live workers
    serving it and items finished per ``bucket`` over the last ``window`` (at most 360 bars)."""
    if window / bucket > 360:
        raise ApiError(400, "invalid_request", "at most 360 bars: raise bucket or lower window")
    return _cfg(request).client.lane_overview(window=window, bucket=bucket)


# -- events, workers, housekeeping ---------------------------------------------------------------
@api.get("/events", tags=["events"])
def events(
    request: Request,
    after: int = Query(0, ge=0, le=MAX_CURSOR, description="cursor: events after this one"),
    job: JobFilter = None,
    limit: int = Query(1000, ge=1, le=10000),
    tail: int | None = Query(None, ge=1, le=1000, description="instead of after: the newest N events"),
    type: str | None = Query(  # noqa: A002 - the query parameter's name
        None,
        max_length=1000,
        description="event types, comma-separated: item_failed,lease_expired",
    ),
    item: ItemFilter = None,
) -> dict[str, Any]:
    """Events in cursor order: ``{"events": [...], "next": CURSOR}`` (pass ``next`` as ``after``);
    filtered by ``job``, ``item`` and ``type``. An unknown parameter (``photo=``) is a 400."""
    client = _cfg(request).client
    types = _event_types(type)
    if (job is not None and job > MAX_ROW_ID) or (item is not None and item > MAX_ROW_ID):
        return {"events": [], "next": after}  # no such job or item
    if types or item is not None:
        batch = client.feed(
            job_id=job, item_id=item, types=types, limit=tail or limit, after=None if tail else after
        )
        return {"events": [e.as_dict() for e in batch], "next": batch[-1].cursor if batch else after}
    if tail is not None:
        batch = client.latest_events(job_id=job, limit=tail)
    else:
        batch = client.events(after=after, job_id=job, limit=limit)
    nxt = batch[-1].cursor if batch else after
    return {"events": [e.as_dict() for e in batch], "next": nxt}


def _event_types(text: str | None) -> list[str]:
    """``type=a,b``: event type names (lower case and underscores, at most 40 characters each)."""
    if not text:
        return []
    types = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in types if not (len(t) <= 40 and t.replace("_", "").isalpha() and t.islower())]
    if bad or len(types) > 40:
        raise ApiError(400, "invalid_request", f"not event types: {', '.join(bad[:5]) or 'too many'}")
    return types


@api.get("/events/stream", tags=["events"], response_class=StreamingResponse)
async def stream(
    request: Request,
    after: int | None = Query(
        None, ge=0, le=MAX_CURSOR, description="start after this cursor (Last-Event-ID wins)"
    ),
    job: JobFilter = None,
    last_event_id: str | None = Header(None, max_length=64),
) -> StreamingResponse:
    """Server-Sent Events: ``id:`` cursor, ``event:`` type, ``data:`` the event JSON; resumable."""
    cfg = _cfg(request)
    start = after or 0
    if last_event_id:
        text = last_event_id.strip()
        if not (text.isascii() and text.isdigit()) or int(text) > MAX_CURSOR:
            raise ApiError(
                400, "invalid_request", f"Last-Event-ID {last_event_id!r} is not a cursor (0 to {MAX_CURSOR})"
            )
        start = int(text)
    if job is not None and job > MAX_ROW_ID:
        job = -1  # no such job: the stream stays open and quiet
    peer = client_address(request)
    refused = cfg.streams.take(peer)
    if refused:
        raise ApiError(
            503, "too_many_streams", f"{refused}; close one or try again later",
            {"per_client": cfg.streams.per_client, "total": cfg.streams.total}, headers={"Retry-After": "5"},
        )  # fmt: skip
    release = cfg.streams.releaser(peer)
    return StreamingResponse(
        sse.stream(
            request,
            cfg.client.engine,
            cfg.sequencer,
            after=start,
            job_id=job,
            keepalive=cfg.keepalive,
            poll=cfg.poll,
            slots=cfg.streams,
            release=release,
        ),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        background=BackgroundTask(release),  # a response never sent gives its slot back too
    )


@api.get("/workers", tags=["workers"])
def workers(request: Request) -> dict[str, Any]:
    """Workers from their registry (idle ones too) and their leases: host, pid, lanes, threads,
    items held (``held_by_lane``), what each busy thread runs (``running``: ``[{"thread", "job",
    "item", "lane", "photo", "path", "since"}]``), last heartbeat and its age, state (live, stale:
    beats stopped, stopped: clean shutdown). Stopped workers leave the list 5 minutes after their
    stop, stale ones 15 minutes after their last beat."""
    return {"workers": _cfg(request).client.workers()}


@api.post("/prune", tags=["ops"])
def prune(body: PruneRequest, request: Request) -> dict[str, Any]:
    """Delete finished jobs and events older than ``older_than`` (the newest event always stays)."""
    try:
        done = _cfg(request).client.prune(body.older_than)
    except ValueError as exc:
        raise ApiError(400, "invalid_request", str(exc)) from None
    return done.as_dict()
