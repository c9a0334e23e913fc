"""A claim that does not take its item says why as a ``ClaimRefusal`` (SQLite and PostgreSQL), with
the human reason kept; the refusals of an item its job stopped are the quiet ones (``JOB_STOPPED``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from store import claims, control, submission
from store.dispatch import take_for_dispatch
from store.lanes import lane_spec
from store.leases import JOB_STOPPED, ClaimOutcome, ClaimRefusal
from store.models import Item, Job

NOOP = lane_spec("noop", env={})
EXIF = lane_spec("exif", env={})


def _job(engine: Engine, tmp_path: Path, spec=NOOP, name: str = "p.jpg") -> tuple[int, Item]:  # type: ignore[no-untyped-def]
    job = submission.submit(engine, [spec], [submission.PhotoInput(str(tmp_path / name), 1)]).job_id
    take_for_dispatch(engine, spec)
    with Session(engine) as s:
        item = s.execute(select(Item).where(Item.job_id == job)).scalar_one()
    return job, item


def _unknown(engine: Engine, tmp_path: Path) -> ClaimOutcome:
    return claims.claim(engine, NOOP, 999_999, 0, "w")


def _other_lane(engine: Engine, tmp_path: Path) -> ClaimOutcome:
    _, item = _job(engine, tmp_path)
    return claims.claim(engine, EXIF, item.id, 0, "w")


def _stale_token(engine: Engine, tmp_path: Path) -> ClaimOutcome:
    _, item = _job(engine, tmp_path)
    claims.claim(engine, NOOP, item.id, 0, "w1")
    return claims.claim(engine, NOOP, item.id, 0, "w2")


def _paused(engine: Engine, tmp_path: Path) -> ClaimOutcome:
    job, item = _job(engine, tmp_path)
    control.pause(engine, job)
    return claims.claim(engine, NOOP, item.id, 0, "w")


def _cancelled(engine: Engine, tmp_path: Path) -> ClaimOutcome:
    job, item = _job(engine, tmp_path)
    control.cancel(engine, job)
    return claims.claim(engine, NOOP, item.id, 0, "w")


def _running(engine: Engine, tmp_path: Path) -> ClaimOutcome:
    _, item = _job(engine, tmp_path)
    lease = claims.claim(engine, NOOP, item.id, 0, "w1").lease
    assert lease is not None
    return claims.claim(engine, NOOP, item.id, lease.token, "w2")


def _submitting(engine: Engine, tmp_path: Path) -> ClaimOutcome:
    job, item = _job(engine, tmp_path)
    with Session(engine) as s, s.begin():
        s.execute(update(Job).where(Job.id == job).values(submitting=True))
    return claims.claim(engine, NOOP, item.id, 0, "w")


def _locked(engine: Engine, tmp_path: Path) -> ClaimOutcome:
    _, first = _job(engine, tmp_path, EXIF)
    _, second = _job(engine, tmp_path, EXIF)  # the same photo: the exif lane locks it exclusively
    assert claims.claim(engine, EXIF, first.id, 0, "w1").lease is not None
    return claims.claim(engine, EXIF, second.id, 0, "w2")


CASES: dict[str, tuple[Callable[[Engine, Path], ClaimOutcome], ClaimRefusal, str, bool]] = {
    "unknown item": (_unknown, ClaimRefusal.UNKNOWN_ITEM, "unknown item", False),
    "other lane": (_other_lane, ClaimRefusal.OTHER_LANE, "belongs to lane", False),
    "stale token": (_stale_token, ClaimRefusal.STALE_TOKEN, "stale token", False),
    "paused job": (_paused, ClaimRefusal.PAUSED, "is paused, not claimable", False),
    "cancelled job": (_cancelled, ClaimRefusal.CANCELLED, "is cancelled, not claimable", False),
    "running item": (_running, ClaimRefusal.NOT_CLAIMABLE, "is running, not claimable", False),
    "job submitting": (_submitting, ClaimRefusal.SUBMITTING, "still being submitted", True),
    "photo locked": (_locked, ClaimRefusal.LOCKED, "locked by item", True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_refused_claim_names_its_refusal(engine: Engine, tmp_path: Path, case: str) -> None:
    # Given an item in the case's situation, When a message claims it
    make, refusal, text, deferred = CASES[case]
    outcome = make(engine, tmp_path)
    # Then nothing is claimed, the outcome names the refusal, and the reason for people is kept
    assert outcome.lease is None
    assert outcome.refusal is refusal
    assert text in outcome.reason
    assert outcome.deferred is deferred
    # And only a refusal of an item its job stopped is a quiet one
    assert (refusal in JOB_STOPPED) is (case in ("paused job", "cancelled job"))


def test_a_claim_that_takes_its_item_has_no_refusal(engine: Engine, tmp_path: Path) -> None:
    # Given a queued item, When a message claims it
    _, item = _job(engine, tmp_path)
    outcome = claims.claim(engine, NOOP, item.id, 0, "w")
    # Then it holds the lease and names no refusal
    assert outcome.lease is not None and outcome.refusal is None and outcome.reason == "claimed"


def test_a_batch_claim_names_each_refusal(engine: Engine, tmp_path: Path) -> None:
    # Given a queued item and an item its job cancelled, in one batch message
    _, item = _job(engine, tmp_path, name="a.jpg")
    stopped_job, stopped = _job(engine, tmp_path, name="b.jpg")
    control.cancel(engine, stopped_job)
    # When the batch is claimed
    taken, refused = claims.claim_batch(engine, NOOP, [(item.id, 0), (stopped.id, 0)], "w", {})
    # Then the first is claimed and the second names its refusal
    assert taken.lease is not None and taken.refusal is None
    assert refused.lease is None and refused.refusal is ClaimRefusal.CANCELLED
