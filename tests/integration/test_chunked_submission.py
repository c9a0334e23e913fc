"""Submission in bounded chunks: the ``submitting`` state, a crashed or cancelled submitter, backlog."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, event, func, select, update
from sqlalchemy.orm import Session

from store import items as store_items
from store import jobs as store_jobs
from store import submission as store_submission
from store.dispatch import take_for_dispatch
from store.errors import BacklogFull
from store.events import read_events
from store.lanes import lane_spec
from store.models import Item, Job
from tests.chaos.checker import analyse, check

NOOP = lane_spec("noop", env={})


def photos(tmp_path: Path, n: int, tag: str = "p") -> list[store_jobs.PhotoInput]:
    return [store_jobs.PhotoInput(str(tmp_path / f"{tag}{i:06d}.jpg"), 1) for i in range(n)]


def commits_during(engine: Engine, fn):  # type: ignore[no-untyped-def]
    seen = []
    listener = lambda conn: seen.append(1)  # noqa: E731
    event.listen(engine, "commit", listener)
    try:
        result = fn()
    finally:
        event.remove(engine, "commit", listener)
    return result, len(seen)


def test_large_submission_commits_in_bounded_chunks(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given chunks of at most 300 photos
    monkeypatch.setattr(store_submission, "CHUNK_FIRST", 300)
    monkeypatch.setattr(store_submission, "CHUNK_MAX", 300)
    sizes: list[int] = []
    land = store_submission._land_chunk

    def spy(engine, job_id, lanes, chunk, *args):  # type: ignore[no-untyped-def]
        sizes.append(len(chunk))
        return land(engine, job_id, lanes, chunk, *args)

    monkeypatch.setattr(store_submission, "_land_chunk", spy)
    # When 2,000 photos are submitted over two lanes
    result, commits = commits_during(
        engine, lambda: store_jobs.submit(engine, [NOOP, lane_spec("exif", env={})], photos(tmp_path, 2000))
    )
    # Then they landed in chunks of at most 300 photos, each its own transaction
    assert max(sizes) <= 300 and sum(sizes) == 2000 and commits >= len(sizes) + 2
    # And the job is complete: every item, not submitting, one job_submitted event
    assert result.items == 4000 and result.photos == 2000
    status = store_jobs.job_status(engine, result.job_id)
    assert status.state == "running" and status.submission is None
    assert status.lanes == {"noop": {"pending": 2000}, "exif": {"waiting": 2000}}
    assert [
        e.detail for e in read_events(engine, job_id=result.job_id, limit=10_000) if e.type == "job_submitted"
    ] == [{"lanes": ["noop", "exif"], "photos": 2000, "items": 4000}]
    assert analyse(engine, job_ids=[result.job_id], require_settled=False).violations == []


def test_a_crashed_submission_stays_submitting_is_not_dispatched_and_can_be_cancelled(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a submitter that dies after its first chunk
    monkeypatch.setattr(store_submission, "CHUNK_FIRST", 100)
    monkeypatch.setattr(store_submission, "CHUNK_MAX", 100)
    land = store_submission._land_chunk
    calls = []

    def dies_on_second(*args):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("submitter killed")
        return land(*args)

    monkeypatch.setattr(store_submission, "_land_chunk", dies_on_second)
    # (killed: none of its own clean-up runs, as under SIGKILL)
    monkeypatch.setattr(store_submission, "end_submission", lambda *args: False)
    inputs = photos(tmp_path, 500)
    fp = store_jobs.job_fingerprint(["noop"], [p.path for p in inputs], {})
    with pytest.raises(KeyboardInterrupt):
        store_jobs.submit(engine, [NOOP], inputs, fingerprint=fp)
    with Session(engine) as s:
        job_id = s.execute(select(Job.id)).scalar_one()
    # When status, the dispatcher, a stray claim and a rerun look at it
    status = store_jobs.job_status(engine, job_id)
    dispatched = take_for_dispatch(engine, NOOP)
    with Session(engine) as s:
        some_item = s.execute(select(Item.id).where(Item.job_id == job_id).limit(1)).scalar_one()
    stray = store_items.claim(engine, NOOP, some_item, 0, "w")
    # Then it is "submitting" with what landed, nothing runs, and a rerun does not resume it
    assert status.state == "submitting"
    assert status.submission is not None and status.submission["landed"] == 100
    assert status.submission["photos"] == 500 and status.as_dict()["submission"]["landed"] == 100
    assert dispatched == [] and stray.lease is None and stray.deferred
    assert store_jobs.find_job_by_fingerprint(engine, fp) is None
    # When it is cancelled
    store_jobs.cancel(engine, job_id)
    # Then it ends cancelled
    final = store_jobs.job_status(engine, job_id)
    assert final.state == "cancelled" and final.lanes == {"noop": {"cancelled": 100}}


def test_cancel_during_submission_stops_it(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a submission in chunks of 100, cancelled after its second chunk
    monkeypatch.setattr(store_submission, "CHUNK_FIRST", 100)
    monkeypatch.setattr(store_submission, "CHUNK_MAX", 100)
    land = store_submission._land_chunk
    calls = []

    def cancel_after_two(engine, job_id, *args):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 3:
            store_jobs.cancel(engine, job_id)
        return land(engine, job_id, *args)

    monkeypatch.setattr(store_submission, "_land_chunk", cancel_after_two)
    # When it goes on / Then it stops with a clear error, writing nothing more
    with pytest.raises(store_jobs.SubmissionCancelled, match="cancelled while it was being submitted"):
        store_jobs.submit(engine, [NOOP], photos(tmp_path, 1000))
    with Session(engine) as s:
        job = s.execute(select(Job)).scalar_one()
        items = s.execute(select(func.count()).select_from(Item)).scalar_one()
    assert items == 200 and not job.submitting
    assert store_jobs.job_status(engine, job.id).state == "cancelled"
    assert check(engine, job_ids=[job.id]) == []


def test_backlog_full_writes_nothing_and_counts_submissions_in_flight(engine: Engine, tmp_path: Path) -> None:
    # Given a lane with a backlog of 150 and a submission of 100 that is still landing
    from dataclasses import replace

    small = replace(NOOP, backlog=150)
    with Session(engine) as s, s.begin():
        s.add(
            Job(
                lanes=["noop"],
                params={},
                roots=[],
                fingerprint="x",
                created_at=0.0,
                submitting=True,
                photos=100,
                landed=0,
            )
        )
    # When 60 more are submitted / Then BacklogFull, and no job was written for them
    with pytest.raises(BacklogFull) as caught:
        store_jobs.submit(engine, [small], photos(tmp_path, 60))
    assert caught.value.backlog == 100
    with Session(engine) as s:
        assert s.execute(select(func.count()).select_from(Job)).scalar_one() == 1


def test_rerun_finds_the_completed_job_by_fingerprint(engine: Engine, tmp_path: Path) -> None:
    # Given a job submitted in several chunks
    inputs = photos(tmp_path, 1200)
    fp = store_jobs.job_fingerprint(["noop"], [p.path for p in inputs], {})
    job = store_jobs.submit(engine, [NOOP], inputs, fingerprint=fp).job_id
    # When a rerun looks it up / Then it is found
    assert store_jobs.find_job_by_fingerprint(engine, fp) == job


@pytest.mark.parametrize(
    "failure", [UnicodeEncodeError("utf-8", "x", 0, 1, "surrogates"), KeyboardInterrupt()]
)
def test_a_submission_that_fails_ends_its_job_instead_of_leaving_it_submitting(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException
) -> None:
    # Given a submitter whose second chunk fails (a value the store cannot take; Ctrl-C)
    monkeypatch.setattr(store_submission, "CHUNK_FIRST", 100)
    monkeypatch.setattr(store_submission, "CHUNK_MAX", 100)
    land = store_submission._land_chunk
    calls = []

    def fails_on_second(*args):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:
            raise failure
        return land(*args)

    monkeypatch.setattr(store_submission, "_land_chunk", fails_on_second)
    # When it submits 500 photos
    with pytest.raises(type(failure)):
        store_jobs.submit(engine, [NOOP], photos(tmp_path, 500))
    # Then the job is not left submitting: it is cancelled with what landed, saying why
    with Session(engine) as s:
        job_id = s.execute(select(Job.id)).scalar_one()
    status = store_jobs.job_status(engine, job_id)
    assert status.state == "cancelled" and status.submission is None
    assert status.lanes == {"noop": {"cancelled": 100}}
    (done,) = [e.detail for e in read_events(engine, job_id=job_id) if e.type == "job_submitted"]
    assert done["cancelled"] is True and type(failure).__name__ in done["why"]
    assert analyse(engine, job_ids=[job_id], require_settled=False).violations == []


def test_the_sweeper_ends_a_submission_whose_submitter_died(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from photojobs.maintenance.duties import EndAbandonedSubmissions

    # Given a submitter killed after its first chunk (no clean-up), and a submission still landing
    monkeypatch.setattr(store_submission, "CHUNK_FIRST", 100)
    monkeypatch.setattr(store_submission, "CHUNK_MAX", 100)
    land = store_submission._land_chunk
    monkeypatch.setattr(store_submission, "end_submission", lambda *args: False)

    def killed(*args):  # type: ignore[no-untyped-def]
        if args[6]:  # start: its second chunk
            raise KeyboardInterrupt("killed")
        return land(*args)

    monkeypatch.setattr(store_submission, "_land_chunk", killed)
    with pytest.raises(KeyboardInterrupt):
        store_jobs.submit(engine, [NOOP], photos(tmp_path, 300, "dead"))
    with pytest.raises(KeyboardInterrupt):
        store_jobs.submit(engine, [NOOP], photos(tmp_path, 300, "live"))
    monkeypatch.undo()
    with Session(engine) as s:
        dead, live = s.execute(select(Job.id).order_by(Job.id)).scalars().all()
        # (the dead one's last chunk landed 11 minutes ago)
        s.execute(update(Job).where(Job.id == dead).values(submit_touched_at=Job.submit_touched_at - 660))
        s.commit()
    # When the sweeper's duty runs (default: a submission idle for 10 minutes lost its submitter)
    ended = EndAbandonedSubmissions(engine).run_once()
    # Then the dead submission is ended (cancelled, saying why); the recent one is left alone
    assert ended == {"submissions_ended": 1}
    assert store_jobs.job_status(engine, dead).state == "cancelled"
    assert store_jobs.job_status(engine, live).state == "submitting"
    (done,) = [e.detail for e in read_events(engine, job_id=dead) if e.type == "job_submitted"]
    assert "submitter stopped" in done["why"]
