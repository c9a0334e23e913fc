"""Server-Sent Events over the event log: ``id:`` = cursor, ``event:`` = type, ``data:`` = the event.

The stream reads the log by cursor (``store.events``), so a client that reconnects with
``Last-Event-ID`` (or ``?after=``) gets exactly the events after the last one it saw — none missed,
none repeated — across reconnects and server restarts. Idle, it sends a comment line every
``keepalive`` seconds so proxies keep the connection open. While the database is out of reach the
stream stays open: it sends a ``: store unavailable`` comment and retries from the same cursor (with
a growing pause, at most ``OUTAGE_PAUSE`` seconds), so no event is missed when the database returns.

Streams are bounded (issue 37): at most ``PHOTOJOBS_SSE_MAX_STREAMS`` open in a server process and
``PHOTOJOBS_SSE_MAX_PER_CLIENT`` per client address (:class:`StreamSlots`; past either, 503
``too_many_streams`` with ``Retry-After``), and a stream catching up sends the backlog in batches of
``BATCH`` events, at most ``CATCH_UP_READERS`` streams of the process reading a batch at once, so a
crowd reconnecting from cursor 0 never takes every thread the other requests need.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from store.events import EventRecord, assign_cursors, read_events

from .errors import is_outage

BATCH = 500
OUTAGE_PAUSE = 2.0
MAX_STREAMS = 100  # PHOTOJOBS_SSE_MAX_STREAMS: open streams per server process
MAX_PER_CLIENT = 8  # PHOTOJOBS_SSE_MAX_PER_CLIENT: open streams per client address
CATCH_UP_READERS = 4  # streams of a process reading a catch-up batch at once


class StreamSlots:
    """The open streams of an app, in all and per client address; a stream past either bound is
    refused (:meth:`take` says why). Catch-up reads go through a gate of ``catch_up`` at a time."""

    def __init__(self, total: int = MAX_STREAMS, per_client: int = MAX_PER_CLIENT,
                 catch_up: int = CATCH_UP_READERS) -> None:  # fmt: skip
        self.total, self.per_client, self.catch_up = total, per_client, catch_up
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}
        self._gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    def take(self, client: str) -> str | None:
        """Count a new stream of ``client``; or, refused, why (nothing counted)."""
        with self._lock:
            if self._open.get(client, 0) >= self.per_client:
                return f"this client has {self.per_client} event streams open already (the most per client)"
            if sum(self._open.values()) >= self.total:
                return f"the server has {self.total} event streams open already (the most in all)"
            self._open[client] = self._open.get(client, 0) + 1
            return None

    def give_back(self, client: str) -> None:
        with self._lock:
            left = self._open.get(client, 0) - 1
            if left > 0:
                self._open[client] = left
            else:
                self._open.pop(client, None)

    def releaser(self, client: str) -> Callable[[], None]:
        """Gives ``client``'s slot back once, however often it is called (the stream's end and the
        response's background task both call it: a response never sent still gives it back)."""
        given = threading.Event()

        def release() -> None:
            if not given.is_set():
                given.set()
                self.give_back(client)

        return release

    def open_streams(self) -> int:
        with self._lock:
            return sum(self._open.values())

    def gate(self) -> asyncio.Semaphore:
        """This event loop's catch-up gate."""
        loop = asyncio.get_running_loop()
        found = self._gates.get(loop)
        if found is None:
            found = self._gates[loop] = asyncio.Semaphore(self.catch_up)
        return found


class Sequencer:
    """Numbers committed events (``assign_cursors``) at most once per ``interval`` for all streams of
    an app, so many idle streams do not each take the database's write lock."""

    def __init__(self, engine: Any, interval: float) -> None:
        self.engine = engine
        self.interval = interval
        self._lock = threading.Lock()
        self._last = 0.0

    def maybe_run(self) -> bool:
        with self._lock:
            if time.monotonic() - self._last < self.interval:
                return False
            assign_cursors(self.engine)
            self._last = time.monotonic()
            return True


def format_event(e: EventRecord) -> str:
    data = json.dumps(e.as_dict(), separators=(",", ":"))
    return f"id: {e.cursor}\nevent: {e.type}\ndata: {data}\n\n"


async def stream(
    request: Request,
    engine: Any,
    sequencer: Sequencer,
    *,
    after: int,
    job_id: int | None,
    keepalive: float,
    poll: float,
    slots: StreamSlots | None = None,
    release: Callable[[], None] | None = None,
) -> AsyncIterator[str]:
    """The events after ``after`` (of ``job_id``), then each new one, forever. With ``slots`` the
    catch-up is read through the slots' gate, and ``release`` (the stream's slot, taken by the
    caller) is called when the stream ends."""
    try:
        cursor = after
        yield f"retry: {int(max(poll, 0.5) * 1000)}\n: photojobs events after {cursor}\n\n"
        last_write = time.monotonic()
        # Early enough that the comment is never later than ``keepalive`` after the last write, however
        # the poll's sleep and the read fall (the check runs once per poll).
        due = max(keepalive - 2 * poll, keepalive / 2)

        def read() -> list[EventRecord]:
            batch = read_events(engine, after=cursor, job_id=job_id, limit=BATCH, sequence=False)
            if not batch and sequencer.maybe_run():
                batch = read_events(engine, after=cursor, job_id=job_id, limit=BATCH, sequence=False)
            return batch

        outage_pause = 0.0
        catching_up = True  # until a read comes back short of a batch (the first read too)
        while True:
            if await request.is_disconnected():
                return
            try:
                if catching_up and slots is not None:  # a backlog: a batch at a time, a few streams at once
                    async with slots.gate():
                        batch = await run_in_threadpool(read)
                else:
                    batch = await run_in_threadpool(read)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                outage_pause = min(OUTAGE_PAUSE, max(poll, outage_pause * 2))
                yield f": store unavailable ({type(exc).__name__}); retrying after {cursor}\n\n"
                last_write = time.monotonic()
                await asyncio.sleep(outage_pause)
                continue
            outage_pause = 0.0
            catching_up = len(batch) == BATCH
            if batch:
                for e in batch:
                    cursor = e.cursor
                yield "".join(format_event(e) for e in batch)
                last_write = time.monotonic()
                if catching_up:
                    continue
            elif time.monotonic() - last_write >= due:
                yield ": keep-alive\n\n"
                last_write = time.monotonic()
            await asyncio.sleep(min(poll, keepalive))
    finally:
        if release is not None:
            release()
