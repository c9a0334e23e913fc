"""The sweeper: revokes expired leases, re-publishes lost messages, tops up lanes.

Safe with many sweepers at once: every change is a compare-and-set on (item, token, state), and
on PostgreSQL expired rows are taken with ``FOR UPDATE SKIP LOCKED`` so two sweepers split them.
It runs as an APScheduler job inside ``photojobs worker``/``run`` and alone in ``photojobs sweep``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy import Engine, Select, delete, select, update
from sqlalchemy.orm import Session

from photojobs.lanes import LaneSpec

from .clock import db_now
from .dispatch import Publish, mark_republished, stale_queued, take_for_dispatch
from .events import assign_cursors, emit
from .items import ready_state, skip_successors
from .models import FAILED, RUNNING, Item, PhotoLock

log = logging.getLogger("photojobs.sweeper")


class Publisher(Protocol):
    def publish(self, items: list[Publish]) -> None: ...

    def holds(self, item: Publish) -> bool: ...


@dataclass
class SweepReport:
    revoked: int = 0
    quarantined: int = 0
    republished: int = 0
    dispatched: int = 0
    sequenced: int = 0
    errors: list[str] = field(default_factory=list)


def expired_leases(limit: int) -> Select[tuple[Item]]:
    """Running items whose lease has expired, oldest expiry first: a range of ``ix_items_lease``
    (state, lease_expires_at), so the scan reads only expired leases, not the table."""
    return (
        select(Item)
        .where(Item.state == RUNNING, Item.lease_expires_at < db_now())
        .order_by(Item.lease_expires_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )


def revoke_expired(engine: Engine, specs: Mapping[str, LaneSpec], limit: int = 500) -> tuple[int, int]:
    """Revoke every lease whose expiry (database clock) has passed.

    Bumps the token (so the old holder's commits are refused), frees its photo locks and sends the
    item back to ``pending`` (``paused``/``cancelled`` if its job asks), or to ``failed`` with
    ``quarantined: killed its worker N times`` once its attempts are spent. Returns (revoked, quarantined).
    """
    revoked = quarantined = 0
    with Session(engine) as s, s.begin():
        rows = s.execute(expired_leases(limit)).scalars().all()
        for item in rows:
            # Read before the UPDATE: the session refreshes ``item`` from it.
            old_token, owner = item.fencing_token, item.lease_owner
            spec = specs.get(item.lane)
            max_attempts = spec.max_attempts if spec else 1
            exhausted = item.attempt >= max_attempts
            state = FAILED if exhausted else ready_state(s, item.job_id)
            error = f"quarantined: killed its worker {item.attempt} times" if exhausted else item.error
            done = s.execute(
                update(Item)
                .where(Item.id == item.id, Item.fencing_token == old_token, Item.state == RUNNING)
                .values(
                    state=state,
                    fencing_token=old_token + 1,
                    lease_owner=None,
                    lease_expires_at=None,
                    error=error,
                    updated_at=db_now(),
                )
            ).rowcount
            if not done:
                continue
            s.execute(delete(PhotoLock).where(PhotoLock.item_id == item.id))
            revoked += 1
            emit(
                s,
                "lease_expired",
                job_id=item.job_id,
                item_id=item.id,
                photo_id=item.photo_id,
                lane=item.lane,
                attempt=item.attempt,
                token=old_token + 1,
                worker=owner,
                detail={"old_token": old_token, "state": state},
            )
            if exhausted:
                quarantined += 1
                emit(
                    s,
                    "item_failed",
                    job_id=item.job_id,
                    item_id=item.id,
                    photo_id=item.photo_id,
                    lane=item.lane,
                    attempt=item.attempt,
                    token=old_token + 1,
                    detail={"error": error},
                )
                skip_successors(
                    s,
                    item.job_id,
                    item.position,
                    [item.photo_id] if item.photo_id else [],
                    f"{item.lane} {error}",
                )
    return revoked, quarantined


def sweep_once(
    engine: Engine,
    specs: Mapping[str, LaneSpec],
    publisher: Publisher,
    *,
    republish_after: float = 2.0,
) -> SweepReport:
    """One pass: revoke expired leases, re-publish lost messages, top up every lane, number events."""
    report = SweepReport()
    try:
        report.revoked, report.quarantined = revoke_expired(engine, specs)
    except Exception as exc:  # noqa: BLE001 - one failing step must not stop the others
        log.exception("revoking expired leases failed")
        report.errors.append(f"revoke: {exc}")
    try:
        lost = [p for p in stale_queued(engine, republish_after) if not publisher.holds(p)]
        again = mark_republished(engine, lost, "message not in Redis")
        publisher.publish(again)
        report.republished = len(again)
    except Exception as exc:  # noqa: BLE001
        log.exception("re-publishing lost messages failed")
        report.errors.append(f"republish: {exc}")
    for spec in specs.values():
        try:
            batch = take_for_dispatch(engine, spec)
            publisher.publish(batch)
            report.dispatched += len(batch)
        except Exception as exc:  # noqa: BLE001
            log.exception("dispatching lane %s failed", spec.name)
            report.errors.append(f"dispatch {spec.name}: {exc}")
    try:
        report.sequenced = assign_cursors(engine)
    except Exception as exc:  # noqa: BLE001
        log.exception("numbering events failed")
        report.errors.append(f"events: {exc}")
    return report
