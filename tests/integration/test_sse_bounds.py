"""Event streams are bounded (issue 37): per client address and in all a server refuses a stream
past its bound with a 503 in the JSON error shape (a real uvicorn server, real connections from two
loopback addresses), gives the slot back when a stream closes, and sends a catch-up in batches, only
a few streams of a process reading theirs at once."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.web import create_app, sse
from photojobs.web.sse import Sequencer, StreamSlots, stream
from store import jobs as store_jobs
from store.events import read_events
from store.lanes import lane_spec
from tests.support import photo_inputs, poll
from tests.web_support import TOKEN, uvicorn_in_thread

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@contextmanager
def server(engine: Engine, **limits: str) -> Iterator[str]:
    """The web app on a real uvicorn server in a thread, with ``limits`` in its environment."""
    env = {"PHOTOJOBS_DATABASE_URL": str(engine.url), "PHOTOJOBS_SSE_POLL": "0.05", **limits}
    client = Client(Settings.from_env(env), engine, migrate=False)
    app = create_app(client, token=TOKEN, photo_roots=[], env=env)
    with uvicorn_in_thread(app) as url:
        yield url


@contextmanager
def open_stream(url: str, source: str) -> Iterator[httpx.Response]:
    """An event stream opened from the loopback address ``source``, held open."""
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, timeout=30) as http, http.stream(
        "GET", f"{url}/api/events/stream", headers=AUTH
    ) as response:
        yield response


def test_streams_past_the_bound_per_client_and_in_all_are_503_and_a_closed_one_gives_its_slot_back(
    engine: Engine,
) -> None:
    # Given a server allowing 2 streams per client and 3 in all
    limits = {"PHOTOJOBS_SSE_MAX_PER_CLIENT": "2", "PHOTOJOBS_SSE_MAX_STREAMS": "3"}
    with server(engine, **limits) as url, ExitStack() as held:
        # When one client opens 2 streams, then a third
        a1 = held.enter_context(open_stream(url, "127.0.0.1"))
        a2 = held.enter_context(open_stream(url, "127.0.0.1"))
        with open_stream(url, "127.0.0.1") as a3:
            third = (a3.status_code, a3.headers.get("retry-after"), a3.read())
        # Then the two are streams and the third is a 503 in the JSON error shape, saying why
        assert (a1.status_code, a2.status_code) == (200, 200)
        assert third[0] == 503 and third[1] == "5"
        body = httpx.Response(503, content=third[2]).json()
        assert body["error"] == "too_many_streams" and "most per client" in body["message"]
        assert body["detail"] == {"per_client": 2, "total": 3}
        # When another client opens one (the third in all), then a second
        b1 = held.enter_context(open_stream(url, "127.0.0.2"))
        with open_stream(url, "127.0.0.2") as b2:
            refused = (b2.status_code, b2.read())
        # Then the server's bound refuses the fourth
        assert b1.status_code == 200 and refused[0] == 503
        assert "most in all" in httpx.Response(503, content=refused[1]).json()["message"]
        # When a stream closes, its slot comes back (the server notices within its poll)
        held.close()

        def reopens() -> bool:
            with open_stream(url, "127.0.0.1") as again:
                return again.status_code == 200

        assert poll(reopens, 20), "a closed stream's slot was not given back"


class _Open:
    async def is_disconnected(self) -> bool:
        return False


def test_a_catch_up_is_sent_in_batches_with_few_streams_reading_at_once(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a log of events, read 5 at a time, and 6 streams catching up from cursor 0 at once on a
    # process allowing 2 catch-up reads at a time (each read made slow enough to overlap)
    monkeypatch.setattr(sse, "BATCH", 5)
    for _ in range(3):
        store_jobs.submit(engine, [lane_spec("noop", env={})], photo_inputs(tmp_path, 8))
    cursors = [e.cursor for e in read_events(engine)]
    assert len(cursors) > 20
    slots = StreamSlots(total=10, per_client=10, catch_up=2)
    reading = {"now": 0, "most": 0}
    lock = threading.Lock()
    real = sse.read_events

    def counted(*args: Any, **kwargs: Any) -> Any:
        with lock:
            reading["now"] += 1
            reading["most"] = max(reading["most"], reading["now"])
        try:
            time.sleep(0.02)
            return real(*args, **kwargs)
        finally:
            with lock:
                reading["now"] -= 1

    monkeypatch.setattr(sse, "read_events", counted)

    async def follow() -> list[list[int]]:
        gen = stream(_Open(), engine, Sequencer(engine, 0.0), after=0, job_id=None, keepalive=30, poll=0.02,
                     slots=slots)  # fmt: skip
        chunks: list[list[int]] = []
        try:
            async for chunk in gen:
                ids = [int(i) for i in re.findall(r"^id: (\d+)$", chunk, re.MULTILINE)]
                if ids:
                    chunks.append(ids)
                if sum(len(c) for c in chunks) >= len(cursors):
                    return chunks
        finally:
            await gen.aclose()
        return chunks

    async def crowd() -> list[list[list[int]]]:
        return await asyncio.gather(*(follow() for _ in range(6)))

    got = asyncio.run(asyncio.wait_for(crowd(), 60))
    # Then every stream gets every event once, in chunks of at most 5, and at most 2 reads ran at once
    for chunks in got:
        assert [i for c in chunks for i in c] == cursors
        assert max(len(c) for c in chunks) <= 5
    assert reading["most"] <= 2, reading
