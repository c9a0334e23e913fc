"""The web app's live stream (``photojobs.web.sse``) reads the event log by its commit-ordered cursor:
started after a cursor (``Last-Event-ID``, ``?after=``) it sends exactly the events after it, each
once, across reconnects — the store half of ``tests/process/test_web_api.py``'s
``test_sse_resumes_across_a_dropped_connection_and_a_server_restart`` (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from photojobs.web import sse
from photojobs.web.sse import Sequencer, stream
from store import jobs as store_jobs
from store.events import emit, read_events
from store.lanes import lane_spec
from tests.support import photo_inputs

NOOP = lane_spec("noop", env={})


class _Open:
    """A request whose client stays connected (the test closes the stream itself)."""

    async def is_disconnected(self) -> bool:
        return False


def _ids_after(engine: Engine, after: int, until: int) -> list[int]:
    """The ``id:`` lines of a stream started after ``after``, read until it sent ``until``."""

    async def read() -> list[int]:
        gen = stream(
            _Open(), engine, Sequencer(engine, 0.0), after=after, job_id=None, keepalive=30, poll=0.02
        )
        text = ""
        try:
            async for chunk in gen:
                text += chunk
                ids = [int(i) for i in re.findall(r"^id: (\d+)$", text, re.MULTILINE)]
                if ids and (max(ids) >= until or len(set(ids)) < len(ids)):
                    return ids  # done, or an event repeated
        finally:
            await gen.aclose()
        return []

    return asyncio.run(asyncio.wait_for(read(), 30))


def test_a_stream_resumed_after_a_cursor_sends_each_later_event_exactly_once(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a job's events in the log, read by the stream two at a time (its batches, so that a
    # stream goes on from where a batch ended)
    monkeypatch.setattr(sse, "BATCH", 2)
    job = store_jobs.submit(engine, [NOOP], photo_inputs(tmp_path, 3)).job_id
    cursors = [e.cursor for e in read_events(engine, job_id=job)]
    assert len(cursors) >= 3
    # When a stream starts after the first event's cursor (a reconnect with Last-Event-ID)
    first = _ids_after(engine, cursors[0], cursors[-1])
    # Then it sends every later event, once, in cursor order
    assert first == cursors[1:]
    # When more events are committed and the client reconnects after the last id it saw
    store_jobs.cancel(engine, job)
    later = [e.cursor for e in read_events(engine, after=cursors[-1])]
    assert later
    again = _ids_after(engine, first[-1], later[-1])
    # Then it gets exactly the new ones: none missed, none repeated
    assert again == later


def test_events_committed_one_after_another_get_increasing_cursors(engine: Engine) -> None:
    # Given three events, each committed on its own, none numbered yet
    for n in range(3):
        with Session(engine) as s, s.begin():
            emit(s, "test_event", detail={"n": n})
    # When the cursors are assigned (in one pass) and the log is read
    read = [e for e in read_events(engine) if e.type == "test_event"]
    # Then, read in cursor order, they come in commit order
    assert [e.detail for e in read] == [{"n": 0}, {"n": 1}, {"n": 2}]
