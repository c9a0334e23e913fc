"""The sweeper's lease revocation: expired leases back to pending (or quarantined), fenced.

Safe with many sweepers at once: every change is a compare-and-set on (item, token, state), and
on PostgreSQL expired rows are taken with ``FOR UPDATE SKIP LOCKED`` so two sweepers split them.
The sweeper's other duties are store functions of their own modules; ``photojobs.maintenance`` runs
them all as services (inside ``photojobs worker``/``run``, and alone in ``photojobs sweep``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from sqlalchemy import Engine, Select, select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from store.lanes import LaneSpec

from .clock import db_now
from .engine import control_lock_timeout, is_lock_timeout, with_lock_timeout
from .events import emit_for
from .finishing import release_locks
from .job_end import touched
from .leases import WAITING_ALONE
from .messages import ALONE
from .models import FAILED, RUNNING, TERMINAL, Item, Job
from .pipeline import lock_successors, skip_successors, state_for

log = logging.getLogger("photojobs.sweeper")


def expired_leases(limit: int) -> Select[tuple[int, int]]:
    """Running items whose lease has expired, oldest expiry first (id, job id): a range of
    ``ix_items_lease`` (state, lease_expires_at), so the scan reads only expired leases, not the table.
    Taken without locks: the caller locks their jobs, then the items (lock order job -> item)."""
    return (
        select(Item.id, Item.job_id)
        .where(Item.state == RUNNING, Item.lease_expires_at < db_now())
        .order_by(Item.lease_expires_at)
        .limit(limit)
    )


def body_not_known_started(message_items: int | None) -> bool:
    """Whether a running item's body may not have been running when its lease ran out, from
    ``items.message_items``: claimed from a batch message (> 1, kept from its queueing: while one
    item of a batch runs, the others wait for their turn or for the batch's finish), or claimed
    alone and waiting for a CPU slot (``store.items.WAITING_ALONE``). Its worker's death is then not
    charged to it (``revoke_expired``)."""
    return message_items is not None and (message_items > 1 or message_items == WAITING_ALONE)


def revoke_expired(engine: Engine, specs: Mapping[str, LaneSpec], limit: int = 500) -> tuple[int, int]:
    """Revoke every lease whose expiry (database clock) has passed.

    Bumps the token (so the old holder's commits are refused), releases its photo locks (or passes
    them to its unsettled intent, which keeps them until it is settled) and sends the item back to
    ``pending`` (``paused``/``cancelled`` if its job asks), or to ``failed`` with
    ``quarantined: killed its worker N times`` once its attempts are spent. Returns (revoked, quarantined).

    Crash attribution: a lease ends this way when its worker died, froze or lost the store, and the
    item is charged for it (the attempt its claim counted stays used) only when it was claimed alone
    and its body had started. An item claimed from a batch message may have been waiting for its
    turn, or for its batch's finish, while a batch-mate killed the process, and an item claimed alone
    may have been waiting for a CPU slot (``body_not_known_started``): it gets its attempt back
    (``lease_expired`` says ``charged: false``) and its next message carries it alone
    (``store.dispatch.ALONE``), so a photo that kills its worker is charged for its next deaths,
    alone, and the items that waited beside it lose nothing. (Not covered: an item claimed by
    another item's finish, ``claim_chained`` on SQLite, waits in its worker's queue for a few
    milliseconds; a death then is charged to it.)

    Lock order job -> item: the candidates are found without locks, their jobs share-locked (in id
    order), then the items locked (``SKIP LOCKED``, id order) and re-checked.

    Every lock wait is bounded by a lock timeout shorter than a lease (``store.engine``): a round
    that runs into it (a job held by a frozen worker's transaction, ended by the store within the
    lease TTL) revokes nothing, says so in the log, and the next round tries again.
    """
    try:
        return _revoke_expired(with_lock_timeout(engine, control_lock_timeout()), specs, limit)
    except DBAPIError as exc:
        if not is_lock_timeout(exc):
            raise
        log.warning("lease revocation waited past its lock timeout (%s); the next sweep tries again",
                    exc.orig)  # fmt: skip
        return 0, 0


def _revoke_expired(engine: Engine, specs: Mapping[str, LaneSpec], limit: int) -> tuple[int, int]:
    revoked = quarantined = 0
    with Session(engine) as s, s.begin():
        candidates = s.execute(expired_leases(limit)).all()
        if not candidates:
            return 0, 0
        job_ids = sorted({c.job_id for c in candidates})
        controls = dict(
            s.execute(
                select(Job.id, Job.control)
                .where(Job.id.in_(job_ids))
                .order_by(Job.id)
                .with_for_update(read=True)
            ).all()
        )
        # What a quarantine skips (or a bundle it releases): locked before any photo-lock row goes,
        # and before the expired items (a finish holds the bundle before its own row).
        lock_successors(s, [c.id for c in candidates])
        rows = (
            s.execute(
                select(Item)
                .where(
                    Item.id.in_([c.id for c in candidates]),
                    Item.state == RUNNING,
                    Item.lease_expires_at < db_now(),
                )
                .order_by(Item.id)
                .with_for_update(skip_locked=True)
            )
            .scalars()
            .all()
        )
        for item in rows:
            # Read before the UPDATE: the session refreshes ``item`` from it.
            old_token, owner = item.fencing_token, item.lease_owner
            spec = specs.get(item.lane)
            max_attempts = spec.max_attempts if spec else 1
            charged = not body_not_known_started(item.message_items)
            attempt = item.attempt if charged else item.attempt - 1
            exhausted = charged and item.attempt >= max_attempts
            state = FAILED if exhausted else state_for(controls.get(item.job_id))
            error = f"quarantined: killed its worker {item.attempt} times" if exhausted else item.error
            done = s.execute(
                update(Item)
                .where(Item.id == item.id, Item.fencing_token == old_token, Item.state == RUNNING)
                .values(
                    state=state,
                    fencing_token=old_token + 1,
                    attempt=attempt,
                    message_items=item.message_items if charged else ALONE,
                    lease_owner=None,
                    lease_expires_at=None,
                    error=error,
                    updated_at=db_now(),
                )
            ).rowcount
            if not done:
                continue
            held_by = release_locks(s, item.id)
            revoked += 1
            if state in TERMINAL:
                touched(s, item.job_id)
            emit_for(
                s,
                "lease_expired",
                item,
                owner,
                {
                    "old_token": old_token,
                    "state": state,
                    "charged": charged,
                    **({"locks_held_by_intent": held_by} if held_by is not None else {}),
                },
                attempt=attempt,
                token=old_token + 1,
            )
            if exhausted:
                quarantined += 1
                emit_for(s, "item_failed", item, None, {"error": error}, token=old_token + 1)
                skip_successors(
                    s,
                    item.job_id,
                    item.position,
                    [item.photo_id] if item.photo_id else [],
                    f"{item.lane} {error}",
                )
    return revoked, quarantined
