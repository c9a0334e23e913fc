"""What a worker holds: the lease, a claim's outcome (its refusal an enum), the lease's own writes."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, update
from sqlalchemy.orm import Session

from .models import RUNNING, Item
from .queries import RENEW_KEY, renew_sql


@dataclass(frozen=True)
class Lease:
    """What a worker holds after a successful claim."""

    item_id: int
    token: int
    job_id: int
    lane: str
    position: int
    photo_id: int | None
    photo_ids: tuple[int, ...]
    attempt: int
    checkpoint: dict[str, Any] | None
    params: dict[str, Any]
    roots: list[str]
    photo_path: str | None
    job_lanes: tuple[str, ...] = ()
    holds_locks: bool = True
    # The claim's database time and when the attempt became ready (revision 0013; None in leases
    # built by hand): its finish event carries ``claimed_at`` (run time = finish - claim).
    claimed_at: float | None = None
    ready_at: float | None = None


class ClaimRefusal(enum.Enum):
    """Why a claim did not take its item (``ClaimOutcome.refusal``); the outcome's ``reason`` says
    the same for people."""

    UNKNOWN_ITEM = "unknown_item"  # no such item (pruned, or a stray message)
    OTHER_LANE = "other_lane"  # the item belongs to another lane
    STALE_TOKEN = "stale"  # noqa: S105 - not a secret: another delivery moved the item on
    PAUSED = "paused"  # its job paused it
    CANCELLED = "cancelled"  # its job cancelled it
    NOT_CLAIMABLE = "not_claimable"  # any other state: waiting, running, ended
    SUBMITTING = "submitting"  # deferred: its job is still being submitted
    LANE_PAUSED = "lane_paused"  # deferred: its lane is paused (store.lane_control)
    LOCKED = "locked"  # deferred: a photo of it is locked by other work
    MOVED_ON = "moved_on"  # it moved on while its photos were locked
    CHANGED = "changed"  # it changed between the claim and the second look, twice


# Refusals of an item its job stopped: its message is skipped quietly (``middleware.claiming``).
JOB_STOPPED = frozenset({ClaimRefusal.PAUSED, ClaimRefusal.CANCELLED})


@dataclass(frozen=True)
class ClaimOutcome:
    """A claim's result: the lease, or why not (``refusal``, None when claimed or not known)."""

    lease: Lease | None
    reason: str  # "claimed", or why the message was skipped / deferred
    deferred: bool = False
    locked: bool = False  # deferred because a photo was locked by other work
    refusal: ClaimRefusal | None = None


@dataclass(frozen=True)
class Renewal:
    held: dict[int, str | None]  # item id -> job control request (None, "cancel", "pause")
    lost: set[int]


def renew(engine: Engine, leases: Mapping[int, int]) -> Renewal:
    """Heartbeat: extend every lease in ``leases`` ({item id: token}) in one statement, guarded by
    token, which also returns each held lease's job control request.

    Returns which are still held (with their job's control request) and which were lost.
    """
    if not leases:
        return Renewal({}, set())
    with engine.begin() as conn:
        renewed = conn.execute(
            renew_sql(conn.dialect.name),
            {"ids": list(leases), "keys": [i * RENEW_KEY + t for i, t in leases.items()]},
        ).all()
    held = {r.id: r.control for r in renewed}
    return Renewal(held, set(leases) - set(held))


# ``items.message_items`` of a running item claimed alone while it waits for one of its process's
# CPU slots (``actors.lane``): its body has not started, so its worker's death is not charged to it
# (``store.sweeper.revoke_expired``). NULL again once it has the slot and its body starts.
WAITING_ALONE = -1


def mark_waiting(engine: Engine, lease: Lease, waiting: bool) -> bool:
    """Record that the running item of ``lease`` (claimed alone) waits for a CPU slot, or no longer
    does (its body starts now). One statement guarded by (item, token, running): a lease that moved
    on is left alone (False). It locks the item's row only (no job, photo or intent row)."""
    with engine.begin() as conn:
        done = conn.execute(
            update(Item)
            .where(Item.id == lease.item_id, Item.fencing_token == lease.token, Item.state == RUNNING)
            .values(message_items=WAITING_ALONE if waiting else None)
        ).rowcount
    return bool(done)


def save_checkpoint(s: Session, lease: Lease, data: dict[str, Any]) -> None:
    """Store the item's checkpoint (call inside a fenced session)."""
    s.execute(
        update(Item)
        .where(Item.id == lease.item_id, Item.fencing_token == lease.token)
        .values(checkpoint=data)
    )
