"""Per-photo history and undo over HTTP (issue 31): ``GET /api/photos?path=``,
``GET /api/photos/{id}/history``, ``POST /api/jobs/{id}/undo``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from photojobs.history import UnknownPhoto
from photojobs.roots import OUTPUT_ROOTS_ENV, OutsideRoots, confine, parse_roots
from store.errors import BacklogFull, SubmissionError, UnknownJob
from store.history import HISTORY_MAX_PAGE, HISTORY_PAGE, NotInJob

from .auth import authenticate
from .errors import ApiError
from .safe_json import TextSafeRoute
from .strict import known_query_only

history = APIRouter(
    prefix="/api", dependencies=[Depends(authenticate), Depends(known_query_only)], route_class=TextSafeRoute
)

MAX_ROW_ID = 2**31 - 1
PhotoId = Annotated[int, Path(ge=1, le=MAX_ROW_ID, description="a photo id")]
JobId = Annotated[int, Path(ge=1, le=MAX_ROW_ID, description="a job id")]
PhotoPath = Annotated[str, Query(min_length=1, max_length=4096, description="the photo's current path")]
Limit = Annotated[
    int, Query(ge=1, le=HISTORY_MAX_PAGE, description=f"entries per page (default {HISTORY_PAGE})")
]
After = Annotated[
    int | None, Query(ge=0, le=MAX_ROW_ID, description="the entries after this effect: a page's `next`")
]


def _cfg(request: Request) -> Any:
    return request.app.state.photojobs


def _refuse_unknown_query(request: Request, known: set[str]) -> None:
    extra = sorted(set(request.query_params) - known)
    if extra:
        raise ApiError(400, "unknown_parameter", f"unknown query parameter(s): {', '.join(extra)}", extra)


@history.get("/photos", tags=["photos"])
def find_photo(
    request: Request, path: PhotoPath, limit: Limit = HISTORY_PAGE, after: After = None
) -> dict[str, Any]:
    """The photo at ``path`` (its current path, or one a job moved it from) and a page of its
    history (as ``/photos/{id}/history``). 403 a path outside the photo roots, 404 no photo there."""
    _refuse_unknown_query(request, {"path", "limit", "after"})
    cfg = _cfg(request)
    if "\x00" in path or "\n" in path:
        raise ApiError(400, "invalid_path", "a path may not contain NUL or newline characters")
    roots = [*cfg.photo_roots, *parse_roots(cfg.client.settings.env.get(OUTPUT_ROOTS_ENV))]
    try:  # a photo in the photo roots, or one a job archived into an output root
        (path,) = confine([path], roots)
    except OutsideRoots as exc:
        raise ApiError(403, "outside_roots", str(exc), {"path": exc.path}) from None
    except SubmissionError as exc:
        raise ApiError(400, "invalid_path", str(exc), {"path": path}) from None
    try:
        return dict(cfg.client.photo_history(str(path), limit=limit, after=after))
    except UnknownPhoto as exc:
        raise ApiError(404, "unknown_photo", str(exc), {"path": path}) from None


@history.get("/photos/{photo_id}/history", tags=["photos"])
def photo_history(
    photo_id: PhotoId, request: Request, limit: Limit = HISTORY_PAGE, after: After = None
) -> dict[str, Any]:
    """``{"photo": ID, "path": CURRENT_PATH, "history": [ENTRY, …], "next": EFFECT | null}``, oldest
    first: one entry per effect a job applied (its sidecars' too), with hashes, changed tags and
    ``undone_by``; ``limit`` entries after effect ``after``, ``next`` the ``after`` of the next page."""
    _refuse_unknown_query(request, {"limit", "after"})
    try:
        return dict(_cfg(request).client.photo_history(photo_id, limit=limit, after=after))
    except UnknownPhoto as exc:
        raise ApiError(404, "unknown_photo", str(exc), {"photo": photo_id}) from None


class UndoRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lane: str | None = Field(default=None, max_length=64, description="undo only this lane's effects")
    uploads: bool = Field(default=False, description="also remove the uploaded copies (never an original)")
    photos: list[Annotated[str, Field(min_length=1, max_length=4096)]] | None = Field(
        default=None, max_length=10_000, description="undo only these photos of the job (current paths)"
    )
    dry_run: bool = Field(default=False, description="the plan per photo only: nothing changed or submitted")


@history.post("/jobs/{job_id}/undo", status_code=201, tags=["jobs"])
def undo(
    job_id: JobId, request: Request, response: Response, body: UndoRequest | None = None
) -> dict[str, Any]:
    """Submit the undo of a job: ``{"job": UNDO_JOB_ID, "items": N}`` (``job`` null and a ``note``
    when nothing of it is left to undo); ``photos``: only those (current paths); ``dry_run``:
    ``{"dry_run": true, "job": null, "plan": [{"path", "action", "reason"}, …]}``, nothing changed.
    404 unknown job, 400 a lane the job does not have or a path that is none of its photos, 403 a
    path outside the photo roots."""
    _refuse_unknown_query(request, set())
    body = body or UndoRequest()
    cfg = _cfg(request)
    photos = None
    if body.photos is not None:
        if any("\x00" in p or "\n" in p for p in body.photos):
            raise ApiError(400, "invalid_path", "a path may not contain NUL or newline characters")
        roots = [*cfg.photo_roots, *parse_roots(cfg.client.settings.env.get(OUTPUT_ROOTS_ENV))]
        try:
            photos = [str(p) for p in confine(body.photos, roots)]
        except OutsideRoots as exc:
            raise ApiError(403, "outside_roots", str(exc), {"path": exc.path}) from None
        except SubmissionError as exc:
            raise ApiError(400, "invalid_path", str(exc), {"job": job_id}) from None
    try:
        out = cfg.client.undo(
            job_id, lane=body.lane, uploads=body.uploads, photos=photos, dry_run=body.dry_run
        )
        if body.dry_run:
            response.status_code = 200  # nothing was created
        return dict(out)
    except UnknownJob as exc:
        raise ApiError(404, "unknown_job", str(exc), {"job": job_id}) from None
    except BacklogFull as exc:
        raise ApiError(429, "backlog_full", str(exc), {"lane": exc.lane}) from None
    except NotInJob as exc:
        raise ApiError(400, "not_in_job", str(exc), {"job": job_id, "paths": exc.paths}) from None
    except (SubmissionError, ValueError) as exc:
        raise ApiError(400, "invalid_undo", str(exc), {"job": job_id}) from None
