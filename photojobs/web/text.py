"""Text is text, numbers are numbers — at the web boundary, in one place.

In: :class:`RequestText` (ASGI middleware) refuses, with a 400 ``invalid_request`` naming where,
any request whose query, path or JSON body holds a string that is not valid Unicode text (a lone
surrogate such as ``"\\ud800"``: valid JSON, but no UTF-8 can encode it, so it would break every
later answer that includes it) or holds a control character (in a body string only TAB, LF and CR
are allowed; in the query and path none), and any JSON number that is not finite (``NaN``,
``Infinity``, ``1e400``). Nested values (``params``) and object keys are checked too.

Out: ``safe_json.SafeJSONResponse`` shows what is already stored escaped, never a 500.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import ApiError, error_body
from .safe_json import dumps

#: Characters no request string may hold: lone surrogates and C0/C1 controls (DEL included)
#: except TAB, LF and CR (a multi-line description).
_BAD_IN_BODY = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
#: ... and in the query and path, TAB, LF and CR too.
_BAD_IN_URL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class NotText(ValueError):
    """A request value that is not text (or not a finite number); ``where`` says which."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


def text_problem(value: str, bad: re.Pattern[str] = _BAD_IN_BODY) -> str | None:
    """Why ``value`` is not acceptable text (None: it is)."""
    found = bad.search(value)
    if found is None:
        return None
    code = ord(found.group())
    if 0xD800 <= code <= 0xDFFF:
        return f"holds a lone surrogate (U+{code:04X}); strings must be valid Unicode text"
    return f"holds the control character U+{code:04X} at position {found.start()}"


def _refuse_constant(name: str) -> Any:
    raise NotText("body", f"the number {name} is not allowed; numbers must be finite")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotText("body", f"the number {text[:40]} is out of range; numbers must be finite")
    return value


def check_json(body: bytes) -> None:
    """Raise :class:`NotText` for a JSON body holding a non-text string or a non-finite number.
    A body that is not JSON at all is left to the endpoint (its own 400)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotText("body", f"is not UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except NotText:
        raise
    except ValueError:
        return  # malformed JSON: the endpoint answers it
    stack: list[tuple[str, Any]] = [("body", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                raise NotText(where, problem)
        elif isinstance(item, dict):
            for key, sub in item.items():
                problem = text_problem(key, _BAD_IN_URL)
                if problem:
                    raise NotText(f"{where} (a key)", problem)
                stack.append((f"{where}.{key}", sub))
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", sub) for i, sub in enumerate(item))


def check_url(scope: Scope) -> None:
    """Raise :class:`NotText` for a path or query parameter holding a control character."""
    problem = text_problem(scope.get("path", ""), _BAD_IN_URL)
    if problem:
        raise NotText("path", problem)
    query = scope.get("query_string", b"").decode("latin-1")
    for key, value in parse_qsl(query, keep_blank_values=True):
        for where, text in ((f"query {key[:40]!r} (its name)", key), (f"query {key[:40]!r}", value)):
            problem = text_problem(text, _BAD_IN_URL)
            if problem:
                raise NotText(where, problem)


class RequestText:
    """ASGI middleware: 400 for a request whose path, query or JSON body is not text (see module)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            check_url(scope)
        except NotText as exc:
            await _refuse(send, exc)
            return
        if scope.get("method") not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        body = bytearray()
        try:
            while True:
                message = await receive()
                messages.append(message)
                if message["type"] != "http.request":
                    break
                body += message.get("body", b"")
                if not message.get("more_body", False):
                    break
        except ApiError as exc:  # the body limit (413), raised while reading
            await _send_json(send, exc.status_code, error_body(exc.code, exc.message, exc.extra))
            return
        if messages[-1]["type"] != "http.request":
            return  # the client went away before its body ended: nobody to answer
        if body:
            try:
                check_json(bytes(body))
            except NotText as exc:
                await _refuse(send, exc)
                return
        await self.app(scope, _replay(messages, bytes(body), receive), send)


def _replay(messages: list[Message], body: bytes, receive: Receive) -> Callable[[], Any]:
    """A ``receive`` that hands the app the body already read (in one message), then the rest."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


async def _refuse(send: Send, exc: NotText) -> None:
    detail = {"where": exc.where, "problem": exc.problem}
    body = error_body("invalid_request", f"invalid request: {exc.where} {exc.problem}", detail)
    await _send_json(send, 400, body)


async def _send_json(send: Send, status: int, content: Any) -> None:
    data = dumps(content)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})
