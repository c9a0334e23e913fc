"""store.lane_control: pausing a lane is stored, idempotent and recorded as events (both stores)."""

from __future__ import annotations

from sqlalchemy import Engine

from store.lane_control import lane_paused, pause_lane, paused_lanes, resume_lane
from tests.support import events_of


def test_pause_and_resume_a_lane_are_stored_once_and_recorded(engine: Engine) -> None:
    # Given no lane paused
    assert paused_lanes(engine) == {}
    # When the exif lane is paused twice
    assert pause_lane(engine, "exif", by="cli") is True
    assert pause_lane(engine, "exif", by="cli") is False
    # Then it is paused once, with one lane_paused event, and other lanes are not
    assert set(paused_lanes(engine)) == {"exif"}
    with engine.connect() as conn:
        assert lane_paused(conn, "exif") and not lane_paused(conn, "noop")
    [paused] = events_of(engine, "lane_paused")
    assert paused.lane == "exif" and paused.detail == {"by": "cli"} and paused.job_id is None
    # When it is resumed twice
    assert resume_lane(engine, "exif", by="web") is True
    assert resume_lane(engine, "exif", by="web") is False
    # Then no lane is paused and one lane_resumed event is written
    assert paused_lanes(engine) == {}
    assert len(events_of(engine, "lane_resumed")) == 1
    # And a lane can be paused again after its resume
    assert pause_lane(engine, "exif", by="cli") is True
    assert set(paused_lanes(engine)) == {"exif"}
