"""Server-Sent Events over the event log: ``id:`` = cursor, ``event:`` = type, ``data:`` = the event.

The stream reads the log by cursor (``store.events``), so a client that reconnects with
``Last-Event-ID`` (or ``?after=``) gets exactly the events after the last one it saw — none missed,
none repeated — across reconnects and server restarts. Idle, it sends a comment line every
``keepalive`` seconds so proxies keep the connection open. While the database is out of reach the
stream stays open: it sends a ``: store unavailable`` comment and retries from the same cursor (with
a growing pause, at most ``OUTAGE_PAUSE`` seconds), so no event is missed when the database returns.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from store.events import EventRecord, assign_cursors, read_events

from .errors import is_outage

BATCH = 500
OUTAGE_PAUSE = 2.0


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
) -> AsyncIterator[str]:
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
    while True:
        if await request.is_disconnected():
            return
        try:
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
        if batch:
            for e in batch:
                cursor = e.cursor
            yield "".join(format_event(e) for e in batch)
            last_write = time.monotonic()
            if len(batch) == BATCH:
                continue
        elif time.monotonic() - last_write >= due:
            yield ": keep-alive\n\n"
            last_write = time.monotonic()
        await asyncio.sleep(min(poll, keepalive))
