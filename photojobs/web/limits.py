"""Request limits: body size (HTTP 413, declared and chunked) and failed logins per address (429)."""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import ApiError, error_body


class BodyTooLarge(ApiError):
    def __init__(self, limit: int) -> None:
        super().__init__(
            413, "body_too_large", f"request body is larger than {limit} bytes", {"limit": limit}
        )


class BodyLimit:
    """Refuse a body over ``limit`` bytes: at once when Content-Length says so, else while reading."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                too_big = int(declared) > self.limit
            except ValueError:
                too_big = False
            if too_big:
                await self._refuse(send)
                return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, counted, send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            error_body(
                "body_too_large", f"request body is larger than {self.limit} bytes", {"limit": self.limit}
            )
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class LoginLimiter:
    """Failed logins per client address in a sliding window, in this process (each server process
    counts on its own). After ``failures`` failures within ``window`` seconds the address is refused
    (429 with ``Retry-After``) until its oldest failure leaves the window; while refused, every
    attempt, right or wrong, is refused unchecked (no oracle for a guess)."""

    def __init__(self, failures: int = 5, window: float = 60.0, clock: Callable[[], float] = time.monotonic):
        if failures < 1 or window <= 0:
            raise ValueError(f"login limit needs failures >= 1 and window > 0, not {failures}, {window}")
        self.failures = failures
        self.window = window
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, deque[float]] = {}

    def _trim(self, address: str, now: float) -> deque[float]:
        seen = self._seen.setdefault(address, deque())
        while seen and seen[0] <= now - self.window:
            seen.popleft()
        if len(self._seen) > 10_000:  # forget quiet addresses: bounded memory under a spray
            for quiet in [a for a, q in self._seen.items() if not q and a != address]:
                del self._seen[quiet]
        return seen

    def retry_after(self, address: str) -> int:
        """Seconds until ``address`` may try again (0: it may try now)."""
        with self._lock:
            now = self.clock()
            seen = self._trim(address, now)
            if len(seen) < self.failures:
                return 0
            return max(1, math.ceil(seen[-self.failures] + self.window - now))

    def failed(self, address: str) -> None:
        """Count a failed attempt of ``address`` (keeps at most ``failures`` of them)."""
        with self._lock:
            seen = self._trim(address, self.clock())
            seen.append(self.clock())
            while len(seen) > self.failures:
                seen.popleft()
