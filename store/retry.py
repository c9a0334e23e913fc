"""Retry: a job's failed or cancelled items go back to work (optionally one lane's only).

One transaction under the job's row lock (the same lock cancel/pause/resume take): each failed or
cancelled item of the chosen lane(s), and the later lanes' items of the same photo that were
skipped or cancelled because of it, get a fresh start — attempts back to 0, error cleared, the
fencing token kept (the next claim bumps it, so an old message can never claim the new attempt).
An item is ``pending`` when the lane before it is done for its photo (or it is the first lane),
else ``waiting``; a paused job gets ``paused`` items instead of ``pending`` ones. Retrying a
cancelled job lifts its cancel request.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection

from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from .clock import db_now
from .errors import NotApplicable, UnknownJob
from .events import emit, emit_many
from .job_end import reopen
from .models import (
    CANCEL,
    CANCELLED,
    FAILED,
    PAUSE,
    PAUSED,
    PENDING,
    RUNNING,
    SKIPPED,
    SUCCEEDED,
    TERMINAL,
    WAITING,
    Item,
)
from .queries import job_for_change

CHUNK = 1000


class NothingToRetry(NotApplicable):
    def __init__(self, job_id: int, lane: str | None, why: str = "") -> None:
        self.job_id = job_id
        self.lane = lane
        where = f" in lane {lane}" if lane else ""
        super().__init__(why or f"job {job_id} has no failed or cancelled items{where} to retry")


def retry(engine: Engine, job_id: int, lane: str | None = None, items: Collection[int] | None = None) -> int:
    """Put the job's failed/cancelled items (of ``lane``, or all lanes; only ``items`` when given)
    back to work; returns how many items changed. Raises ``UnknownJob``, or ``NothingToRetry`` when
    there is nothing to retry or the job is still stopping after a cancel."""
    with Session(engine) as s, s.begin():
        job = s.execute(job_for_change(job_id)).scalar_one_or_none()
        if job is None:
            raise UnknownJob(job_id)
        rows = s.execute(
            select(Item.id, Item.lane, Item.position, Item.photo_id, Item.state, Item.fencing_token).where(
                Item.job_id == job_id
            )
        ).all()
        if job.control == CANCEL and any(r.state == RUNNING for r in rows):
            raise NothingToRetry(job_id, lane, f"job {job_id} is still cancelling; retry when it has stopped")
        targets = {
            r.id
            for r in rows
            if r.state in (FAILED, CANCELLED)
            and (lane is None or r.lane == lane)
            and (items is None or r.id in items)
        }
        if not targets:
            raise NothingToRetry(job_id, lane)
        # Later lanes of a retried photo that never ran because of it come back too.
        retried_at: dict[int, int] = {}
        for r in rows:
            if r.id in targets and r.photo_id is not None:
                retried_at[r.photo_id] = min(retried_at.get(r.photo_id, r.position), r.position)
        first_retried = min(r.position for r in rows if r.id in targets)
        for r in rows:
            if r.state not in (SKIPPED, CANCELLED) or r.id in targets:
                continue
            if r.photo_id is not None and r.photo_id in retried_at and r.position > retried_at[r.photo_id]:
                targets.add(r.id)
            elif r.photo_id is None and r.position > first_retried:
                targets.add(r.id)  # a bundle skipped or cancelled after the lanes before it
        ready = PAUSED if job.control == PAUSE else PENDING
        state_of = {r.id: r.state for r in rows}
        by_photo_pos = {(r.photo_id, r.position): r.id for r in rows if r.photo_id is not None}
        by_pos: dict[int, list[int]] = defaultdict(list)
        for r in rows:
            by_pos[r.position].append(r.id)
        for r in rows:  # what each target becomes: everything before it must be settled first
            if r.id in targets:
                state_of[r.id] = WAITING
        new_state: dict[int, str] = {}
        for r in sorted((r for r in rows if r.id in targets), key=lambda r: r.position):
            if r.position == 0:
                st = ready
            elif r.photo_id is not None:
                before = by_photo_pos.get((r.photo_id, r.position - 1))
                st = ready if before is None or state_of.get(before) == SUCCEEDED else WAITING
            else:
                done = all(state_of[i] in TERMINAL for i in by_pos[r.position - 1])
                st = ready if done else WAITING
            state_of[r.id] = st
            new_state[r.id] = st
        if job.control == CANCEL:
            job.control = None
        old = {r.id: r for r in rows if r.id in targets}
        by_new: dict[str, list[int]] = defaultdict(list)
        for item_id, st in new_state.items():
            by_new[st].append(item_id)
        for st, ids in by_new.items():
            for start in range(0, len(ids), CHUNK):
                s.execute(
                    update(Item)
                    .where(Item.id.in_(ids[start : start + CHUNK]))
                    .values(
                        state=st,
                        attempt=0,
                        error=None,
                        not_before=0.0,
                        queued_at=None,
                        lease_owner=None,
                        lease_expires_at=None,
                        updated_at=db_now(),
                    )
                )
        emit_many(
            s,
            [
                {
                    "type": "item_retried",
                    "job_id": job_id,
                    "item_id": item_id,
                    "photo_id": old[item_id].photo_id,
                    "lane": old[item_id].lane,
                    "token": old[item_id].fencing_token,
                    "detail": {"from": old[item_id].state, "state": st},
                }
                for item_id, st in sorted(new_state.items())
            ],
        )
        emit(s, "job_retried", job_id=job_id, lane=lane, detail={"items": len(new_state), "lane": lane})
        reopen(s, job_id)  # its next finish writes job_finished again (store.job_end)
    return len(new_state)
