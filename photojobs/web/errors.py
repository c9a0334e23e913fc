"""JSON errors everywhere: ``{"error": CODE, "message": …, "detail": …}``, never a traceback.

The database out of reach (or busy past its timeout) is a 503 ``store_unavailable`` with
``Retry-After`` on every endpoint, not a 500; a value the database cannot hold is a 400."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request

from .safe_json import SafeJSONResponse as JSONResponse

log = logging.getLogger("photojobs.web")

CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "not_applicable",
    413: "body_too_large",
    429: "backlog_full",
    503: "unavailable",
}
OUTAGE_RETRY_AFTER = 5


class ApiError(StarletteHTTPException):
    """An error with a code the client can switch on."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        detail: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(status_code=status, detail=message, headers=headers)
        self.code = code
        self.message = message
        self.extra = detail


BACKLOG_RETRY_AFTER = 30


def submission_refused(exc: Exception) -> ApiError:
    """The answer to a refused submission (``POST /api/jobs``, ``POST /api/sync``): 403 a path
    outside the photo roots, 429 a lane's backlog full (with ``Retry-After``), 409 an idempotency
    key used with another request, 400 the rest."""
    from photojobs.roots import OutsideRoots
    from store.errors import BacklogFull
    from store.idempotency import KeyReused

    if isinstance(exc, KeyReused):
        return ApiError(409, "idempotency_key_reused", str(exc), {"job": exc.job_id})
    if isinstance(exc, OutsideRoots):
        return ApiError(403, "outside_roots", str(exc), {"path": exc.path})
    if isinstance(exc, BacklogFull):
        return ApiError(
            429,
            "backlog_full",
            str(exc),
            {"lane": exc.lane, "backlog": exc.backlog, "adding": exc.adding, "bound": exc.bound},
            headers={"Retry-After": str(BACKLOG_RETRY_AFTER)},
        )
    return ApiError(400, "invalid_submission", str(exc), {"kind": type(exc).__name__})


def error_body(code: str, message: str, detail: Any = None) -> dict[str, Any]:
    return {"error": code, "message": message, "detail": detail}


def is_outage(exc: BaseException) -> bool:
    """True when ``exc`` means the database is out of reach or busy (not a bug, not bad input)."""
    import sqlite3

    import psycopg
    from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

    if isinstance(exc, OperationalError | InterfaceError):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | sqlite3.OperationalError)


def outage_response(exc: BaseException) -> JSONResponse:
    """The 503 for a database outage (its first line names the cause; no SQL, no parameters)."""
    orig = getattr(exc, "orig", None) or exc
    lines = str(orig).strip().splitlines()
    cause = f"{type(orig).__name__}: {lines[0] if lines else ''}".strip(": ")
    return JSONResponse(
        error_body(
            "store_unavailable",
            "the database is not reachable right now; try again later",
            {"cause": cause[:300]},
        ),
        status_code=503,
        headers={"Retry-After": str(OUTAGE_RETRY_AFTER)},
    )


def install(app: FastAPI) -> None:
    from sqlalchemy.exc import DataError, DBAPIError

    @app.exception_handler(DBAPIError)
    async def _database(request: Request, exc: DBAPIError) -> JSONResponse:
        if is_outage(exc):
            log.warning("database unavailable on %s %s: %s", request.method, request.url.path, exc.orig)
            return outage_response(exc)
        if isinstance(exc, DataError):  # a value the column cannot hold, past the API's own bounds
            return JSONResponse(
                error_body("invalid_request", "a value in the request is out of range for the store"), 400
            )
        return await _crash(request, exc)

    from store.errors import SearchBusy, SearchTooCostly

    @app.exception_handler(SearchTooCostly)
    async def _costly(request: Request, exc: SearchTooCostly) -> JSONResponse:
        return JSONResponse(error_body("search_too_costly", str(exc), {"seconds": exc.seconds}), 400)

    @app.exception_handler(SearchBusy)
    async def _busy(request: Request, exc: SearchBusy) -> JSONResponse:
        return JSONResponse(
            error_body("search_busy", str(exc), {"slots": exc.slots}), 429, headers={"Retry-After": "1"}
        )

    from store.control import ControlBusy

    @app.exception_handler(ControlBusy)
    async def _control_busy(request: Request, exc: ControlBusy) -> JSONResponse:
        # a job held by a frozen worker's transaction past the lock timeouts (issue 39): nothing changed
        return JSONResponse(
            error_body("job_busy", str(exc), {"job": exc.job_id, "action": exc.action}), 503,
            headers={"Retry-After": "2"},
        )  # fmt: skip

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc, ApiError):
            body = error_body(exc.code, exc.message, exc.extra)
        else:
            code = CODES.get(exc.status_code, "error")
            message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
            body = error_body(code, message, None)
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            {"where": ".".join(str(p) for p in e.get("loc", ())), "problem": e.get("msg")}
            for e in exc.errors()
        ]
        text = "; ".join(f"{p['where']}: {p['problem']}" for p in problems)
        return JSONResponse(error_body("invalid_request", f"invalid request: {text}", problems), 400)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        if is_outage(exc):
            return outage_response(exc)
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(
            error_body("internal", f"internal error ({type(exc).__name__}); see the server log"), 500
        )
