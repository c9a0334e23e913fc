"""Answers that never fail on what is stored: a string that cannot be encoded as UTF-8 (a lone
surrogate in a row written before the request checks of ``text``, or by another program; a file
name that is not UTF-8, surrogate-escaped by Python) is shown escaped — ``\\xff`` for the byte of
a surrogate escape, ``\\ud800`` for another lone surrogate — and a non-finite number as its name.
The error handlers (``errors``), every endpoint's answer (:class:`TextSafeRoute`, before FastAPI's
own serialisation, which fails on such a string) and the app's default response use it."""

from __future__ import annotations

import asyncio
import functools
import json
import math
import re
from collections.abc import Callable
from typing import Any

from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

_SURROGATE = re.compile("[\ud800-\udfff]")


def escape_text(value: str) -> str:
    """``value`` with each lone surrogate written out: a file name's undecodable byte (U+DC80 to
    U+DCFF, Python's surrogate escape) as ``\\xNN``, any other as ``\\uXXXX``."""
    if not _SURROGATE.search(value):
        return value

    def shown(match: re.Match[str]) -> str:
        code = ord(match.group())
        return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"

    return _SURROGATE.sub(shown, value)


def encodable(value: Any) -> Any:
    """``value`` (JSON-shaped) with every string :func:`escape_text`-ed and every non-finite float
    named ("NaN", "Infinity", "-Infinity")."""
    if isinstance(value, str):
        return escape_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {encodable(k): encodable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encodable(v) for v in value]
    return value


def dumps(content: Any) -> bytes:
    """Compact UTF-8 JSON of ``content``; escaped (:func:`encodable`) only when it must be."""
    try:
        return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    except (UnicodeEncodeError, ValueError):
        return json.dumps(encodable(content), ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class SafeJSONResponse(JSONResponse):
    """A JSONResponse that never fails on what is stored (see :func:`dumps`)."""

    def render(self, content: Any) -> bytes:
        return dumps(content)


def _escaping(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """``endpoint`` whose JSON-shaped answer goes through :func:`encodable` (a Response as is)."""
    if asyncio.iscoroutinefunction(endpoint):

        @functools.wraps(endpoint)
        async def escaped_async(*args: Any, **kwargs: Any) -> Any:
            result = await endpoint(*args, **kwargs)
            return encodable(result) if isinstance(result, dict | list) else result

        return escaped_async

    @functools.wraps(endpoint)
    def escaped(*args: Any, **kwargs: Any) -> Any:
        result = endpoint(*args, **kwargs)
        return encodable(result) if isinstance(result, dict | list) else result

    return escaped


class TextSafeRoute(APIRoute):
    """A route whose answer never fails on a stored string that is not text (see the module)."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, _escaping(endpoint), **kwargs)
