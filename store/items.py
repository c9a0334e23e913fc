"""The item protocol's public functions, re-exported from the modules that implement them.

Where each part lives: claims (alone, batch, chained) in ``store.claims``; why a claim took
nothing (``ClaimRefusal``), deferrals and failed claims in ``store.claim_refusals``; ``Lease``,
``ClaimOutcome``, renewals and checkpoints in ``store.leases``; succeed / fail / stop and the
photo-lock release in ``store.finishing``; job control reads, an item's photos, the next lanes and
bundles in ``store.pipeline``; the named statements in ``store.queries``. Lock order, on every path:
job -> item -> photo -> intent -> photo-lock rows (``docs/design.md``). New code imports from the
implementing module; this one keeps existing callers working.
"""

from __future__ import annotations

from .claim_refusals import claim_failed
from .claims import can_chain_claims, claim, claim_batch, claim_chained, lane_lock_request
from .finishing import fail, lock_batch_finish, plain_success, release_locks, stop, succeed, succeed_many
from .leases import (
    JOB_STOPPED,
    WAITING_ALONE,
    ClaimOutcome,
    ClaimRefusal,
    Lease,
    Renewal,
    mark_waiting,
    renew,
    save_checkpoint,
)
from .pipeline import (
    bundle_members,
    lock_successors,
    skip_successors,
    state_for,
)
from .queries import successors_query, unfinished_in_lane
from .summaries import running_items

__all__ = [
    "JOB_STOPPED",
    "WAITING_ALONE",
    "ClaimOutcome",
    "ClaimRefusal",
    "Lease",
    "Renewal",
    "bundle_members",
    "can_chain_claims",
    "claim",
    "claim_batch",
    "claim_chained",
    "claim_failed",
    "fail",
    "lane_lock_request",
    "lock_batch_finish",
    "plain_success",
    "lock_successors",
    "mark_waiting",
    "release_locks",
    "renew",
    "running_items",
    "save_checkpoint",
    "skip_successors",
    "state_for",
    "stop",
    "succeed",
    "succeed_many",
    "successors_query",
    "unfinished_in_lane",
]
