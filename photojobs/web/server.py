"""How ``photojobs serve`` runs uvicorn: proxy headers only from proxies the operator names, bounded
connections, and one log line (not a flood) when the process runs out of file descriptors.

- ``PHOTOJOBS_TRUSTED_PROXIES`` (addresses or networks, comma- or space-separated; unset: none):
  only a peer in it may set the client address and scheme with ``X-Forwarded-For`` /
  ``X-Forwarded-Proto``. Unset, every such header (and ``Forwarded``, which is never read) is
  ignored: the client is the TCP peer, for the login limiter and for ``Secure`` cookies.
- ``PHOTOJOBS_HTTP_HEADER_TIMEOUT`` (10 s): a request's headers must arrive within this time of its
  first byte (of the connection, for the first request); else the connection is closed.
- ``PHOTOJOBS_HTTP_BODY_TIMEOUT`` (30 s): a request body that sends nothing for this long is dropped.
- ``PHOTOJOBS_HTTP_KEEPALIVE`` (5 s): an idle kept-alive connection is closed after this.
- ``PHOTOJOBS_HTTP_MAX_CONNECTIONS`` (1000, and at most 3/4 of the process's open-file limit): a
  connection past it is closed at once, so accepting never runs out of descriptors.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import resource
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("photojobs.web")

TRUSTED_PROXIES_ENV = "PHOTOJOBS_TRUSTED_PROXIES"
HEADER_TIMEOUT = 10.0
BODY_TIMEOUT = 30.0
KEEPALIVE = 5
MAX_CONNECTIONS = 1000
RESOURCE_LOG_EVERY = 10.0  # seconds between two "out of descriptors" lines
_OUT_OF = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def trusted_proxies(text: str | None) -> list[str]:
    """``"127.0.0.1, 10.0.0.0/8"`` -> the addresses and networks (ValueError naming a bad one)."""
    out = []
    for part in (text or "").replace(",", " ").split():
        try:
            if "/" in part:
                ipaddress.ip_network(part, strict=False)
            else:
                ipaddress.ip_address(part)
        except ValueError:
            raise ValueError(f"{TRUSTED_PROXIES_ENV}: {part!r} is not an IP address or network") from None
        out.append(part)
    return out


def _positive(env: Mapping[str, str], key: str, default: float) -> float:
    raw = env.get(key)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{key}={raw!r} is not a number of seconds") from None
    if not 0 < value < 86400:
        raise ValueError(f"{key}={raw!r} must be between 0 and 86400 seconds")
    return value


@dataclass(frozen=True)
class ServerLimits:
    """The connection limits of one ``serve`` process (see the module docstring)."""

    trusted: tuple[str, ...] = ()
    header_timeout: float = HEADER_TIMEOUT
    body_timeout: float = BODY_TIMEOUT
    keepalive: float = KEEPALIVE
    max_connections: int = MAX_CONNECTIONS

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ServerLimits:
        wanted = int(_positive(env, "PHOTOJOBS_HTTP_MAX_CONNECTIONS", MAX_CONNECTIONS))
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        ceiling = max(16, soft * 3 // 4) if soft != resource.RLIM_INFINITY else wanted
        return cls(
            trusted=tuple(trusted_proxies(env.get(TRUSTED_PROXIES_ENV))),
            header_timeout=_positive(env, "PHOTOJOBS_HTTP_HEADER_TIMEOUT", HEADER_TIMEOUT),
            body_timeout=_positive(env, "PHOTOJOBS_HTTP_BODY_TIMEOUT", BODY_TIMEOUT),
            keepalive=_positive(env, "PHOTOJOBS_HTTP_KEEPALIVE", KEEPALIVE),
            max_connections=max(1, min(wanted, ceiling)),
        )


class _RateLimitedLog:
    """At most one warning per ``every`` seconds, counting what it held back."""

    def __init__(self, every: float = RESOURCE_LOG_EVERY) -> None:
        self.every = every
        self._last = -float("inf")
        self._held = 0

    def __call__(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last < self.every:
            self._held += 1
            return
        held, self._held, self._last = self._held, 0, now
        more = f" ({held} more since the last such line)" if held else ""
        log.warning("%s%s", message, more)


_refusals = _RateLimitedLog()
_resources = _RateLimitedLog()


def loop_exception_handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """asyncio's handler, except that running out of descriptors (or memory) while accepting is one
    line every 10 s, not a traceback per attempt (Python 3.11 logs up to 100 per event-loop pass)."""
    exc = context.get("exception")
    if isinstance(exc, OSError) and exc.errno in _OUT_OF:
        _resources(
            f"photojobs serve: cannot accept connections: {exc.strerror} (errno {exc.errno}); "
            "raise the open-file limit (ulimit -n) or lower PHOTOJOBS_HTTP_MAX_CONNECTIONS"
        )
        return
    loop.default_exception_handler(context)


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline, a body idle timeout and a connection cap."""

    limits = ServerLimits()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._read_timer: asyncio.TimerHandle | None = None
        self._reading: str | None = None
        if len(self.connections) > self.limits.max_connections:
            _refusals(
                f"photojobs serve: {len(self.connections) - 1} connections open, the limit "
                f"(PHOTOJOBS_HTTP_MAX_CONNECTIONS={self.limits.max_connections}); closing new ones"
            )
            transport.abort()
            return
        self._arm("headers", self.limits.header_timeout)

    def _arm(self, what: str | None, seconds: float = 0.0) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
        self._reading = what
        if what is not None:
            self._read_timer = self.loop.call_later(seconds, self._read_timeout)

    def _read_timeout(self) -> None:
        self._read_timer = None
        if not self.transport.is_closing():
            self.transport.close()  # connection_lost ends a waiting request (http.disconnect)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._arm("body", self.limits.body_timeout)  # each chunk restarts the idle timer
        elif state is h11.IDLE:
            if self._reading != "headers":  # the first byte of a (next) request: its deadline starts
                self._arm("headers", self.limits.header_timeout)
        else:
            self._arm(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if getattr(self, "_read_timer", None) is not None:
            self._arm(None)
        super().connection_lost(exc)


def protocol_class(limits: ServerLimits) -> type[BoundedH11Protocol]:
    """A :class:`BoundedH11Protocol` subclass with these limits (uvicorn instantiates the class)."""
    return type("PhotojobsH11Protocol", (BoundedH11Protocol,), {"limits": limits})


def run(app: Any, host: str, port: int, limits: ServerLimits) -> None:
    """Serve ``app`` with uvicorn (h11) under ``limits`` until interrupted."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol_class(limits),
        loop="asyncio",
        log_level="warning",
        timeout_graceful_shutdown=2,
        timeout_keep_alive=int(max(1, limits.keepalive)),
        proxy_headers=bool(limits.trusted),
        forwarded_allow_ips=list(limits.trusted) or None,
        server_header=False,
    )
    server = uvicorn.Server(config)

    async def serve() -> None:
        asyncio.get_running_loop().set_exception_handler(loop_exception_handler)
        await server.serve()

    asyncio.run(serve())
