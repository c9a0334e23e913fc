"""Claims: one claim (compare-and-set, photo locks, event) taken alone, for a batch, or chained in a finish.

The three ways share one core: ``_claim_cas`` (the compare-and-set, ``store.queries.claim_sql``)
and ``_claim_rest`` (the photo locks and the ``item_claimed`` event). They differ in the
transaction around it: ``claim`` opens its own; ``claim_batch`` claims a batch message's items in
one, its photos' rows locked together in ascending id; ``claim_chained`` runs inside the finish of
the item its worker just ran (a savepoint; SQLite only). A claim that matched nothing is looked at
again (``store.claim_refusals``): the ``ClaimOutcome`` says why, as a ``ClaimRefusal``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, update
from sqlalchemy.orm import Session

from .claim_refusals import changed_outcome, defer_locked, locked_outcome, not_claimed, unclaim
from .clock import db_now
from .errors import TRANSIENT, classify_store_error, error_text
from .events import insert_events
from .lanes import NO_LOCK, LaneSpec
from .leases import ClaimOutcome, Lease
from .models import Item
from .photo_locks import Conflict, LockRequest, lock_photo_rows, take_many
from .photo_locks import take as take_photo_locks
from .pipeline import item_photo_ids
from .queries import RENEW_KEY, claim_many_sql, claim_sql, event_sql

log = logging.getLogger("photojobs.store")

LANE_LOCKS = object()  # claim's default: the lane's own lock mode (``lane_lock_request``)


def lane_lock_request(spec: LaneSpec) -> LockRequest | None:
    """The photo locks a lane's items take by its declaration: ``spec.lock`` (none for NO_LOCK),
    retried after ``spec.lock_retry``. ``middleware.locks.LockMiddleware`` decides this per message
    (with jitter on the retry); direct callers of ``claim`` get the declaration."""
    return None if spec.lock == NO_LOCK else LockRequest(spec.lock, spec.lock_retry)


class _LockConflict(Exception):
    def __init__(self, conflict: Conflict) -> None:
        self.conflict = conflict


def claim(
    engine: Engine,
    spec: LaneSpec,
    item_id: int,
    token: int,
    worker: str,
    locks: LockRequest | None | object = LANE_LOCKS,
    *,
    _retried: bool = False,
) -> ClaimOutcome:
    """Claim = one transaction: CAS queued/pending -> running, bump token and attempt, set the lease
    from the database clock, take the photo locks ``locks`` asks for (all or nothing, ascending
    photo order), write ``item_claimed``.

    The compare-and-set is one ``UPDATE … RETURNING`` (``store.queries.claim_sql``); when it
    matches no row, a second look says why (unknown item, other lane, stale token, not claimable,
    job still being submitted — then the item is deferred). When a photo is locked by other work the
    transaction rolls back and the item goes back to ``pending`` for ``locks.retry_after`` seconds,
    holding nothing.
    """
    request = lane_lock_request(spec) if locks is LANE_LOCKS else locks
    if request is not None and not isinstance(request, LockRequest):
        raise TypeError(f"a claim's lock request must be a LockRequest, not {type(request).__name__}")
    try:
        with engine.begin() as conn:
            lease = _claim_in(conn, spec, item_id, token, worker, request)
    except _LockConflict as exc:
        return defer_locked(engine, item_id, token, worker, request, exc.conflict)  # type: ignore[arg-type]
    if lease is not None:
        return ClaimOutcome(lease, "claimed")
    return _second_look(engine, spec, item_id, token, worker, locks, _retried)


def _second_look(
    engine: Engine, spec: LaneSpec, item_id: int, token: int, worker: str, locks: object, retried: bool
) -> ClaimOutcome:
    """Why the compare-and-set matched nothing; an item claimable by now is claimed once more."""
    outcome = not_claimed(engine, spec, item_id, token, worker)
    if outcome is not None:
        return outcome
    if retried:
        return changed_outcome(item_id)
    return claim(engine, spec, item_id, token, worker, locks, _retried=True)


def claim_batch(
    engine: Engine,
    spec: LaneSpec,
    pairs: Sequence[tuple[int, int]],
    worker: str,
    requests: Mapping[int, LockRequest | None],
) -> list[ClaimOutcome]:
    """The claims of a batch message's items (``pairs``: (item id, token)) in one transaction, in
    the global lock order: every item's compare-and-set (``claim``'s, in one statement that locks
    the items in ascending id: ``store.queries.claim_many_sql``), then —
    when locks are asked (``requests[item id]``) — all their photos' rows at once in ascending photo
    id (PostgreSQL: a transaction that locked one photo and then waited for another out of that
    order could deadlock with a submission or another batch), then each item's lock rows and
    ``item_claimed`` event (the events in one statement). An item whose photo is locked by other
    work has its compare-and-set undone in the same transaction (token and attempt as before) and
    is deferred, holding nothing. Then, outside it, an item whose compare-and-set matched nothing is
    looked at again (``claim``'s second look). One outcome per pair, in the order of ``pairs``.
    Raises when the transaction fails (nothing is claimed)."""
    leases: dict[int, Lease] = {}
    deferred: dict[int, ClaimOutcome] = {}
    events: list[dict[str, Any]] = []  # the claims' event rows, inserted together
    with engine.begin() as conn:
        rows = _claim_cas_many(conn, spec, pairs, worker)
        photos = {i: item_photo_ids(conn, i, r.photo_id) for i, r in rows.items()}
        wanted = [
            (i, photos[i], request, r.fencing_token)
            for i, r in rows.items()
            if (request := requests.get(i)) is not None and photos[i]
        ]
        paths: dict[int, str] = {}
        if conn.dialect.name == "postgresql" and wanted:
            paths = lock_photo_rows(conn, [p for _, ids, _, _ in wanted for p in ids])
        conflicts = take_many(conn, wanted)  # every item's lock rows: two statements for the batch
        for item_id, row in rows.items():
            request = requests.get(item_id)
            got = _claim_rest(
                conn, spec, item_id, row, worker, request, len(pairs), events,
                taken=(photos[item_id], conflicts.get(item_id), paths),
            )  # fmt: skip
            if isinstance(got, Conflict):
                if request is None:
                    raise RuntimeError("internal error: expected request is not None")
                unclaim(conn, spec.name, item_id, row, worker, request.retry_after, got)
                deferred[item_id] = locked_outcome(got)
            else:
                leases[item_id] = got
        insert_events(conn, events)
    outcomes: list[ClaimOutcome] = []
    for item_id, token in pairs:
        if item_id in leases:
            outcomes.append(ClaimOutcome(leases[item_id], "claimed"))
        elif item_id in deferred:
            outcomes.append(deferred[item_id])
        else:
            outcomes.append(_second_look(engine, spec, item_id, token, worker, requests.get(item_id), False))
    return outcomes


def can_chain_claims(engine: Engine) -> bool:
    """Whether ``claim_chained`` may be used on this store: SQLite only. SQLite serializes whole
    write transactions, so a claim inside another item's finish cannot deadlock. On PostgreSQL it
    would take row locks out of the global order (the finished item's photo, then the next item and
    its photo): the photo chaos run hit a deadlock there, and chaining showed no throughput gain on
    PostgreSQL, whose bound is CPU."""
    return engine.dialect.name == "sqlite"


def claim_chained(
    s: Session, spec: LaneSpec, item_id: int, token: int, worker: str, request: LockRequest | None
) -> Lease | None:
    """The claim of ``claim``, made inside another transaction: the finish of the item the same worker
    thread just ran (chained claims: ``middleware.finishing``, ``middleware.preclaims``), so one write
    transaction ends one item and starts the next. The same compare-and-set, lock request and
    ``item_claimed`` event, in a savepoint: None — and nothing of it written, the finish unharmed — when
    the item is not claimable now, a photo is locked, or the claim raised (logged; a deadlock the
    database broke, a bug); the message's own claim then runs and says why."""
    try:
        with s.begin_nested():
            return _claim_in(s.connection(), spec, item_id, token, worker, request)
    except _LockConflict:
        return None
    except Exception as exc:  # noqa: BLE001 - the finish goes on; the message claims on its own
        level = logging.DEBUG if classify_store_error(exc) == TRANSIENT else logging.WARNING
        log.log(level, "chained claim of item %s failed (%s); it claims on its own", item_id, error_text(exc))
        return None


def _claim_in(
    conn: Connection,
    spec: LaneSpec,
    item_id: int,
    token: int,
    worker: str,
    request: LockRequest | None,
) -> Lease | None:
    """The claim's writes on ``conn`` (see ``claim``): the lease, None when the compare-and-set
    matched no row; raises ``_LockConflict`` (the caller rolls back) when a photo is locked."""
    row = _claim_cas(conn, spec, item_id, token, worker)
    if row is None:
        return None
    lease = _claim_rest(conn, spec, item_id, row, worker, request)
    if isinstance(lease, Conflict):
        raise _LockConflict(lease)  # rolls the claim back
    return lease


def _claim_cas_many(
    conn: Connection, spec: LaneSpec, pairs: Sequence[tuple[int, int]], worker: str
) -> dict[int, Any]:
    """The compare-and-sets of a batch's items in one statement (one round trip however many
    items): their rows by item id, in ascending id, those that matched only."""
    ids = sorted({item_id for item_id, _ in pairs})
    keys = [item_id * RENEW_KEY + token for item_id, token in pairs]
    params = {"ids": ids, "keys": keys, "lane": spec.name, "worker": worker, "ttl": spec.lease_ttl}
    found = conn.execute(claim_many_sql(conn.dialect.name), params).all()
    return {row.id: row for row in sorted(found, key=lambda r: r.id)}


def _claim_cas(conn: Connection, spec: LaneSpec, item_id: int, token: int, worker: str) -> Any:
    """The claim's compare-and-set (``store.queries.claim_sql``): its row, or None."""
    params = {"item_id": item_id, "token": token, "lane": spec.name, "worker": worker, "ttl": spec.lease_ttl}
    return conn.execute(claim_sql(conn.dialect.name), params).first()


def _claim_rest(
    conn: Connection,
    spec: LaneSpec,
    item_id: int,
    row: Any,
    worker: str,
    request: LockRequest | None,
    batch: int = 1,
    events: list[dict[str, Any]] | None = None,
    taken: tuple[tuple[int, ...], Conflict | None, Mapping[int, str]] | None = None,
) -> Lease | Conflict:
    """The rest of a claim whose compare-and-set matched ``row``: the photo locks ``request`` asks
    for (a ``Conflict``, with nothing of them written, when a photo is locked by other work), then
    the ``item_claimed`` event. ``batch``: the items of the message (the event says so when more
    than one); ``events``: where to leave the event row for the caller to insert with its batch's
    rows (same transaction) instead of inserting it now; ``taken``: a batch claim took its items'
    photo locks together (``photo_locks.take_many``): the item's photos, its conflict (or None)
    and the photos' paths as of their row locks (PostgreSQL)."""
    photo_ids = item_photo_ids(conn, item_id, row.photo_id) if taken is None else taken[0]
    new_token = row.fencing_token
    holds = request is not None and bool(photo_ids)
    current: dict[int, str] = {}
    if request is not None and holds:
        if taken is None:
            conflict = take_photo_locks(conn, item_id, photo_ids, request, new_token, current)
        else:
            conflict = taken[1]
            current.update((p, taken[2][p]) for p in photo_ids if p in taken[2])
        if conflict is not None:
            return conflict
        if row.photo_id is None:
            # A bundle's thousands of lock rows take time: its lease runs from now.
            conn.execute(
                update(Item).where(Item.id == item_id).values(lease_expires_at=db_now() + spec.lease_ttl)
            )
    claimed = {
        "type": "item_claimed",
        "job_id": row.job_id,
        "item_id": item_id,
        "photo_id": row.photo_id,
        "lane": spec.name,
        "attempt": row.attempt,
        "token": new_token,
        "worker": worker,
        "detail": _claim_detail(photo_ids, batch, _waited(row)),
    }
    if events is None:
        conn.execute(event_sql(conn.dialect.name), claimed)
    else:
        events.append(claimed)
    lanes = tuple(row.lanes or ())
    return Lease(
        item_id=item_id,
        token=new_token,
        job_id=row.job_id,
        lane=spec.name,
        position=row.position,
        photo_id=row.photo_id,
        photo_ids=tuple(photo_ids),
        attempt=row.attempt,
        checkpoint=row.checkpoint,
        params=dict(row.params or {}),
        roots=list(row.roots or []),
        photo_path=current.get(row.photo_id, row.photo_path),
        job_lanes=lanes,
        holds_locks=holds,
        claimed_at=getattr(row, "claimed_at", None),
        ready_at=getattr(row, "ready_at", None),
    )


def _waited(row: Any) -> float | None:
    """Seconds from the attempt's ready time to its claim (both database clock), or None."""
    claimed, ready = getattr(row, "claimed_at", None), getattr(row, "ready_at", None)
    if claimed is None or ready is None:
        return None
    return round(max(0.0, float(claimed) - float(ready)), 4)


def _claim_detail(photo_ids: Sequence[int], batch: int, waited: float | None = None) -> dict[str, Any] | None:
    detail: dict[str, Any] = {}
    if waited is not None:
        detail["waited"] = waited  # ready -> claim (``photojobs_item_queue_wait_seconds``)
    if len(photo_ids) > 1:
        detail["photos"] = list(photo_ids)
    if batch > 1:
        detail["batch"] = batch  # claimed with the other items of a batch message
    return detail or None
