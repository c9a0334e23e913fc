"""JSON errors everywhere: ``{"error": CODE, "message": …, "detail": …}``, never a traceback."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request

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
}


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


def error_body(code: str, message: str, detail: Any = None) -> dict[str, Any]:
    return {"error": code, "message": message, "detail": detail}


def install(app: FastAPI) -> None:
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
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(
            error_body("internal", f"internal error ({type(exc).__name__}); see the server log"), 500
        )
