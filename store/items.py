"""Item operations of the lease protocol: claim, renew, checkpoint, finish, release.

Every state change is a compare-and-set on (item id, fencing token, state) and writes its event
in the same transaction. Times come from the database clock (``db_now``).

Lock order, on every path (PostgreSQL row locks; SQLite serializes whole transactions):
**job -> item -> photo -> intent** (then photo-lock rows). A path that needs the job's control
request reads it (``lock_job``, a share lock) *before* it touches any item; ``cancel``/``pause``/
``resume`` lock the job for update and then its items; items are locked in ascending id order,
photos in ascending id order. Photo locks of an item with an unsettled intent outlive its lease:
they pass to the intent (``photo_locks.intent_id``) and are released when it is settled.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, Select, and_, literal, select, tuple_, update
from sqlalchemy.orm import Session

from .clock import db_now
from .engine import reader
from .errors import TRANSIENT, StaleLease, classify_store_error, error_text
from .events import emit, emit_many
from .fencing import DEFERRED_EVENTS
from .lanes import NO_LOCK, LaneSpec
from .models import (
    CANCEL,
    CANCELLED,
    FAILED,
    PAUSE,
    PAUSED,
    PENDING,
    QUEUED,
    RUNNING,
    SKIPPED,
    SUCCEEDED,
    WAITING,
    Item,
    ItemPhoto,
    Job,
    Photo,
    unindexed_state,
)
from .photo_locks import Conflict, LockRequest, lock_photo_rows
from .photo_locks import take as take_photo_locks
from .statements import (
    DROP_LOCKS,
    DROP_LOCKS_UNLESS_INTENT,
    LIVE_INTENT,
    LOCKS_TO_INTENT,
    RENEW_KEY,
    claim_sql,
    end_lease_sql,
    event_sql,
    renew_sql,
)

log = logging.getLogger("photojobs.store")
RECORDED_INTENT = "recorded"  # store.intents.RECORDED (that module imports this one)
T = TypeVar("T")
UNFINISHED = (WAITING, PENDING, QUEUED, RUNNING, PAUSED)


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


@dataclass(frozen=True)
class ClaimOutcome:
    lease: Lease | None
    reason: str  # "claimed", or why the message was skipped / deferred
    deferred: bool = False
    locked: bool = False  # deferred because a photo was locked by other work


def item_photo_ids(s: Session, item: Item) -> tuple[int, ...]:
    """The photos an item works on: its photo, or (a bundle, with no single photo) its item_photos."""
    if item.photo_id is not None:
        return (item.photo_id,)
    extra = s.execute(select(ItemPhoto.photo_id).where(ItemPhoto.item_id == item.id)).scalars().all()
    ids = set(extra)
    if item.photo_id is not None:
        ids.add(item.photo_id)
    return tuple(sorted(ids))


IN_CHUNK = 10_000  # values per IN list / rows per statement: far below either store's parameter limit


def chunked(values: Sequence[T], size: int = IN_CHUNK) -> Iterator[Sequence[T]]:
    """``values`` in slices of at most ``size`` (for IN lists and multi-row statements)."""
    for start in range(0, len(values), size):
        yield values[start : start + size]


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

    The compare-and-set is one ``UPDATE … RETURNING`` (``store.statements.claim_sql``); when it
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
        return _defer_locked(engine, spec, item_id, token, worker, request, exc.conflict)  # type: ignore[arg-type]
    if lease is not None:
        return ClaimOutcome(lease, "claimed")
    return _not_claimed(engine, spec, item_id, token, worker, locks, _retried)


def claim_batch(
    engine: Engine,
    spec: LaneSpec,
    pairs: Sequence[tuple[int, int]],
    worker: str,
    requests: Mapping[int, LockRequest | None],
) -> list[ClaimOutcome]:
    """The claims of a batch message's items (``pairs``: (item id, token)) in one transaction, in
    the global lock order: every item's compare-and-set (``claim``'s, in ascending item id), then —
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
        rows: dict[int, Any] = {}
        for item_id, token in sorted(pairs):
            row = _claim_cas(conn, spec, item_id, token, worker)
            if row is not None:
                rows[item_id] = row
        if conn.dialect.name == "postgresql" and any(requests.get(i) is not None for i in rows):
            lock_photo_rows(conn, [p for i, r in rows.items() for p in _row_photos(conn, i, r)])
        for item_id, row in rows.items():
            request = requests.get(item_id)
            got = _claim_rest(conn, spec, item_id, row, worker, request, len(pairs), events, rows_locked=True)
            if isinstance(got, Conflict):
                if request is None:
                    raise RuntimeError('internal error: expected request is not None')
                _unclaim(conn, spec.name, item_id, row, worker, request.retry_after, got)
                reason = f"photo {got.photo_id} locked by item {got.held_by}"
                deferred[item_id] = ClaimOutcome(None, reason, True, True)
            else:
                leases[item_id] = got
        if events:
            conn.execute(event_sql(conn.dialect.name), events)
    outcomes: list[ClaimOutcome] = []
    for item_id, token in pairs:
        if item_id in leases:
            outcomes.append(ClaimOutcome(leases[item_id], "claimed"))
        elif item_id in deferred:
            outcomes.append(deferred[item_id])
        else:
            outcomes.append(_not_claimed(engine, spec, item_id, token, worker, requests.get(item_id), False))
    return outcomes


def _row_photos(conn: Connection, item_id: int, row: Any) -> tuple[int, ...]:
    return (row.photo_id,) if row.photo_id is not None else _bundle_photo_ids(conn, item_id)


def _unclaim(
    conn: Connection, lane: str, item_id: int, row: Any, worker: str, delay: float, conflict: Conflict
) -> None:
    """Undo a claim's compare-and-set inside its own transaction (a photo of the item is locked by
    other work): token, attempt and lease as before the claim, and the item back to ``pending`` for
    ``delay`` seconds (``item_deferred``), as a claim that rolled back and deferred leaves it."""
    conn.execute(
        update(Item)
        .where(Item.id == item_id, Item.fencing_token == row.fencing_token)
        .values(
            state=PENDING,
            fencing_token=row.fencing_token - 1,
            attempt=row.attempt - 1,
            lease_owner=None,
            lease_expires_at=None,
            queued_at=None,
            not_before=db_now() + delay,
            updated_at=db_now(),
        )
    )
    emit(
        conn,
        "item_deferred",
        job_id=row.job_id,
        item_id=item_id,
        photo_id=row.photo_id,
        lane=lane,
        attempt=row.attempt - 1,
        token=row.fencing_token - 1,
        worker=worker,
        detail={"reason": "photo locked", "photo": conflict.photo_id, "held_by": conflict.held_by},
    )


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
    """The claim of ``claim``, made inside another transaction: the finish of the item the same
    worker thread just ran (``middleware.lease``: chained claims), so one write transaction ends
    one item and starts the next. The same compare-and-set, lock request and ``item_claimed``
    event, in a savepoint: None — and nothing of it written, the finish unharmed — when the item is
    not claimable now, a photo is locked, or the claim raised (logged; a deadlock the database
    broke, a bug); the message's own claim then runs and says why."""
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


def _claim_cas(conn: Connection, spec: LaneSpec, item_id: int, token: int, worker: str) -> Any:
    """The claim's compare-and-set (``store.statements.claim_sql``): its row, or None."""
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
    rows_locked: bool = False,
) -> Lease | Conflict:
    """The rest of a claim whose compare-and-set matched ``row``: the photo locks ``request`` asks
    for (a ``Conflict``, with nothing of them written, when a photo is locked by other work), then
    the ``item_claimed`` event. ``batch``: the items of the message (the event says so when more
    than one); ``events``: where to leave the event row for the caller to insert with its batch's
    rows (same transaction) instead of inserting it now; ``rows_locked``: the photos' rows are
    already locked (a batch claim locks all its photos at once, in ascending order)."""
    photo_ids = _row_photos(conn, item_id, row)
    new_token = row.fencing_token
    holds = request is not None and bool(photo_ids)
    current: dict[int, str] = {}
    if holds:
        if request is None:
            raise RuntimeError('internal error: expected request is not None')
        conflict = take_photo_locks(
            conn, item_id, photo_ids, request, new_token, current, rows_locked=rows_locked
        )
        if conflict is not None:
            return conflict
        if row.photo_id is None:
            # A bundle's thousands of lock rows take time: its lease runs from now.
            conn.execute(
                update(Item)
                .where(Item.id == item_id)
                .values(lease_expires_at=db_now() + spec.lease_ttl)
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
        "detail": _claim_detail(photo_ids, batch),
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
    )


def _claim_detail(photo_ids: Sequence[int], batch: int) -> dict[str, Any] | None:
    detail: dict[str, Any] = {}
    if len(photo_ids) > 1:
        detail["photos"] = list(photo_ids)
    if batch > 1:
        detail["batch"] = batch  # claimed with the other items of a batch message
    return detail or None


def _bundle_photo_ids(conn: Connection, item_id: int) -> tuple[int, ...]:
    rows = conn.execute(select(ItemPhoto.photo_id).where(ItemPhoto.item_id == item_id)).scalars()
    return tuple(sorted(set(rows)))


def _defer_locked(
    engine: Engine,
    spec: LaneSpec,
    item_id: int,
    token: int,
    worker: str,
    request: LockRequest,
    conflict: Conflict,
) -> ClaimOutcome:
    """A photo of the item is locked by other work: back to ``pending`` for a while, holding nothing
    (the message's (item, token) is checked again: another delivery may have moved it on)."""
    with Session(engine) as s, s.begin():
        item = s.execute(select(Item).where(Item.id == item_id).with_for_update()).scalar_one_or_none()
        if item is None or item.fencing_token != token or item.state not in (QUEUED, PENDING):
            return ClaimOutcome(None, f"item {item_id} moved on while its photos were locked")
        _defer(
            s,
            item,
            worker,
            request.retry_after,
            {"reason": "photo locked", "photo": conflict.photo_id, "held_by": conflict.held_by},
        )
    return ClaimOutcome(None, f"photo {conflict.photo_id} locked by item {conflict.held_by}", True, True)


def _not_claimed(
    engine: Engine, spec: LaneSpec, item_id: int, token: int, worker: str, locks: object, retried: bool
) -> ClaimOutcome:
    """Why the claim's compare-and-set matched nothing (off the hot path: stray, stale or early
    messages). A job still being submitted defers the item; everything else is a skip."""
    with Session(engine) as s, s.begin():
        row = s.execute(
            select(Item, Job.submitting)
            .join(Job, Job.id == Item.job_id)
            .where(Item.id == item_id)
            .with_for_update(of=Item)
        ).first()
        if row is None:
            return ClaimOutcome(None, f"unknown item {item_id}")
        item, submitting = row
        if item.lane != spec.name:
            return ClaimOutcome(None, f"item {item_id} belongs to lane {item.lane!r}, not {spec.name!r}")
        if item.fencing_token != token:
            return ClaimOutcome(None, f"stale token {token}: item {item_id} is at token {item.fencing_token}")
        if item.state not in (QUEUED, PENDING):
            return ClaimOutcome(None, f"item {item_id} is {item.state}, not claimable")
        if submitting:  # the dispatcher passes such jobs over; a stray message waits too
            _defer(s, item, worker, 1.0, {"reason": "job still being submitted"})
            return ClaimOutcome(None, f"job {item.job_id} is still being submitted", True)
    # Claimable now: it changed between the two transactions (another delivery released it).
    if retried:
        return ClaimOutcome(None, f"item {item_id} changed while being claimed; skipped")
    return claim(engine, spec, item_id, token, worker, locks, _retried=True)


def _defer(s: Session, item: Item, worker: str | None, delay: float, detail: dict[str, Any]) -> None:
    """The item (queued/pending, row locked) goes back to ``pending`` for ``delay`` s, holding nothing."""
    s.execute(
        update(Item)
        .where(Item.id == item.id)
        .values(state=PENDING, queued_at=None, not_before=db_now() + delay, updated_at=db_now())
    )
    emit(
        s,
        "item_deferred",
        job_id=item.job_id,
        item_id=item.id,
        photo_id=item.photo_id,
        lane=item.lane,
        attempt=item.attempt,
        token=item.fencing_token,
        worker=worker,
        detail=detail,
    )


def claim_failed(
    engine: Engine, spec: LaneSpec, item_id: int, token: int, error: str, worker: str, *, counts: bool
) -> str | None:
    """Record a claim that raised instead of claiming (the store answered, the claim did not work).

    It counts as an attempt when ``counts`` (a deterministic error: a programming or data error,
    too many bind parameters) or when it is the same error as the item's last failed claim (an
    error that repeats will not pass by itself): the token moves on, ``item_claim_failed`` is
    written, and once the lane's attempts are spent the item ends ``failed`` with the error (later
    lanes of its photos are skipped). A first, possibly passing error only defers the item with
    backoff (``item_deferred``). Returns the item's new state, or None when (item, token) is no
    longer claimable (someone else moved it on)."""
    message = f"claim failed: {error}"
    with Session(engine) as s, s.begin():
        # Lock order job -> item (as cancel/pause and the sweeper): the job first, then the item.
        job_id = s.execute(select(Item.job_id).where(Item.id == item_id)).scalar_one_or_none()
        if job_id is None:
            return None
        lock_job(s, job_id)
        item = s.execute(select(Item).where(Item.id == item_id).with_for_update()).scalar_one_or_none()
        if item is None or item.fencing_token != token or item.state not in (QUEUED, PENDING):
            return None
        if not counts and item.error != message:
            _defer(
                s,
                item,
                worker,
                spec.retry_delay(item.attempt + 1),
                {"reason": "claim failed", "error": error},
            )
            s.execute(update(Item).where(Item.id == item_id).values(error=message))
            return PENDING
        attempt, new_token = item.attempt + 1, token + 1
        exhausted = attempt >= spec.max_attempts
        state = FAILED if exhausted else ready_state(s, item.job_id)
        s.execute(
            update(Item)
            .where(Item.id == item_id, Item.fencing_token == token)
            .values(
                state=state,
                attempt=attempt,
                fencing_token=new_token,
                queued_at=None,
                error=message,
                not_before=db_now() + spec.retry_delay(attempt),
                updated_at=db_now(),
            )
        )
        common: dict[str, Any] = {
            "job_id": item.job_id,
            "item_id": item_id,
            "photo_id": item.photo_id,
            "lane": item.lane,
            "attempt": attempt,
            "token": new_token,
            "worker": worker,
        }
        emit(s, "item_claim_failed", **common, detail={"error": error, "state": state})
        if exhausted:
            emit(s, "item_failed", **common, detail={"error": message})
            skip_successors(s, item.job_id, item.position, item_photo_ids(s, item), f"{item.lane} {message}")
        return state


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


def lock_job(s: Session, job_id: int) -> str | None:
    """Share-lock the job row and return its control request. Called before any item is touched
    (the global lock order job -> item -> photo -> intent), so a concurrent cancel/pause (which
    locks the job for update, then its items) either sees this transaction's result or waits."""
    return s.execute(select(Job.control).where(Job.id == job_id).with_for_update(read=True)).scalar_one()


def lock_for_finish(s: Session, lease: Lease) -> str | None:
    """The job's share lock and control request, taken once per finishing transaction and job (a
    batch finish ends several items of a job), before the item (lock order job -> item). Only a
    finish that needs the control request takes it (a retry, a stop, a successor to make ready): a
    last-lane success touches no job row."""
    key = ("finish_locked", lease.job_id)
    if key in s.info:
        return s.info[key]  # type: ignore[no-any-return]
    control = lock_job(s, lease.job_id)
    s.info[key] = control
    return control


def lock_batch_finish(s: Session, leases: Sequence[Lease]) -> None:
    """Before a batch finish writes anything (PostgreSQL): its jobs share-locked, then its items
    together with the rows their finishes may move on (the next lane's waiting items of their
    photos, or a waiting bundle: ``lock_successors``), then its photos, each set in ascending id —
    the global order job -> item -> photo, which the finishes one after another (each job, item,
    photo, photo-lock rows in turn, then the next item) would cross between items. The jobs'
    control requests are kept for ``lock_for_finish``. SQLite serializes whole transactions."""
    if s.get_bind().dialect.name != "postgresql" or not leases:
        return
    jobs = sorted({lease.job_id for lease in leases})
    controls = s.execute(
        select(Job.id, Job.control).where(Job.id.in_(jobs)).order_by(Job.id).with_for_update(read=True)
    ).all()
    for job_id, control in controls:
        s.info[("finish_locked", job_id)] = control
    items = {lease.item_id for lease in leases}
    items |= _successor_ids(s, [(x.job_id, x.position, x.photo_ids) for x in leases if not _last_lane(x)])
    _lock_items(s, items)
    photos = [p for lease in leases for p in lease.photo_ids]
    if photos:
        lock_photo_rows(s.connection(), photos)


def _last_lane(lease: Lease) -> bool:
    """Nothing follows the lease's lane in its job (no next lane's item, no bundle to release)."""
    return bool(lease.job_lanes) and lease.position >= len(lease.job_lanes) - 1


def _lock_items(s: Session, item_ids: Iterable[int]) -> None:
    """Row-lock the items, in ascending id."""
    for chunk in chunked(sorted(set(item_ids))):
        s.execute(select(Item.id).where(Item.id.in_(chunk)).order_by(Item.id).with_for_update()).all()


def _successor_ids(s: Session, finishing: Iterable[tuple[int, int, Iterable[int]]]) -> set[int]:
    """The rows that ending the items ``finishing`` ((job id, position, photo ids) each) may move
    on: the waiting bundle of the next position, and the waiting items of later lanes of their
    photos."""
    groups: dict[tuple[int, int], set[int]] = {}
    for job_id, position, photo_ids in finishing:
        groups.setdefault((job_id, position), set()).update(photo_ids)
    ids: set[int] = set()
    for (job_id, position), photos in sorted(groups.items()):
        bundle_id = _waiting_bundle(s, job_id, position + 1)
        if bundle_id is not None:
            ids.add(bundle_id)
        ids.update(row.id for row in _successors(s, job_id, position, sorted(photos)))
    return ids


def lock_successors(s: Session, item_ids: Sequence[int]) -> None:
    """PostgreSQL: row-lock, in ascending id, what ending the items ``item_ids`` may move on (the
    next lane's waiting bundle, the later lanes' waiting items of their photos: ``skip_successors``):
    a transaction that ends several items and releases their photo locks (the sweeper's
    revocation) takes these rows before its first photo-lock row, as the global order asks (a later
    UPDATE of a row locked here waits for nobody). Called before the items themselves are locked
    (the sweeper locks them ``SKIP LOCKED``): a finish of one of them holds the bundle before its own
    row (``lock_bundle``), so waiting here for the bundle while holding the item would deadlock with
    it. The caller holds the jobs' share locks."""
    if s.get_bind().dialect.name != "postgresql" or not item_ids:
        return
    finishing: list[tuple[int, int, list[int]]] = []
    for chunk in chunked(sorted(set(item_ids))):
        rows = s.execute(select(Item.job_id, Item.position, Item.photo_id).where(Item.id.in_(chunk))).all()
        finishing += [(r.job_id, r.position, [r.photo_id] if r.photo_id is not None else []) for r in rows]
    _lock_items(s, _successor_ids(s, finishing))


def release_locks(s: Session, item_id: int) -> int | None:
    """An item's lease ended: drop its photo locks, unless it has an unsettled intent; then the
    intent holds them (returned) until it is settled (``store.intents``)."""
    conn = s.connection()
    if conn.execute(DROP_LOCKS_UNLESS_INTENT, {"item_id": item_id}).rowcount:
        return None  # no unsettled intent: the rows are gone (one statement on the hot path)
    live = conn.execute(LIVE_INTENT, {"item_id": item_id}).scalar_one_or_none()
    if live is None:
        conn.execute(DROP_LOCKS, {"item_id": item_id})
    else:
        conn.execute(LOCKS_TO_INTENT, {"item_id": item_id, "intent_id": live})
    return live


def _stale(s: Session, lease: Lease) -> StaleLease:
    row = s.execute(select(Item.state, Item.fencing_token).where(Item.id == lease.item_id)).first()
    return StaleLease(
        lease.item_id, lease.token, row.state if row else None, row.fencing_token if row else None
    )


def _fence_held(s: Session, lease: Lease, row: Any) -> None:
    """The finishing compare-and-set matched (the lease held, and its row stays locked until the
    commit): the fenced session needs no separate check. No row: the lease is stale."""
    if row is None:
        raise _stale(s, lease)
    s.info["fence_verified"] = True
    s.info.setdefault("fenced_items", set()).add(lease.item_id)


def _end_lease(s: Session, lease: Lease, *, release: bool = True, **values: Any) -> None:
    """CAS the running item to its next state (the fence folded into the ``WHERE``) and release its
    photo locks (``release`` False: the caller does, later). A finish that reads the job's control
    request locked the job first."""
    row = s.execute(
        update(Item)
        .where(Item.id == lease.item_id, Item.fencing_token == lease.token, Item.state == RUNNING)
        .values(lease_owner=None, lease_expires_at=None, updated_at=db_now(), **values)
        .returning(Item.id)
    ).first()
    _fence_held(s, lease, row)
    if release and lease.holds_locks:
        release_locks(s, lease.item_id)


def _event(
    s: Session, type: str, lease: Lease, worker: str | None, detail: dict[str, Any] | None = None
) -> None:
    emit(
        s,
        type,
        job_id=lease.job_id,
        item_id=lease.item_id,
        photo_id=lease.photo_id,
        lane=lease.lane,
        attempt=lease.attempt,
        token=lease.token,
        worker=worker,
        detail=detail,
    )


def succeed(
    s: Session,
    lease: Lease,
    result: dict[str, Any] | None,
    worker: str | None,
    writes: Sequence[Callable[[Session], None]] = (),
) -> None:
    """Finish a running item as ``succeeded`` (fenced session): one compare-and-set that is also
    the fence, the photo's next lane made ready, then ``writes`` (the actor's own rows, e.g. the
    photo's hash), the lock release and the events (the success before the next lane's).

    Lock order (job -> item -> photo -> photo-lock rows): a middle lane share-locks the job and
    the waiting bundle it may release (created before its job's photo items: a lower id) before
    its own row, and makes the next lane's items ready before it writes its photo or drops its
    photo-lock rows."""
    last_lane = _last_lane(lease)
    bundle = None
    control: str | None = None
    if not last_lane:
        control = lock_for_finish(s, lease)  # job -> item: the next lane's state follows it
        bundle = lock_bundle(s, lease.job_id, lease.position + 1)
    conn = s.connection()
    dialect = conn.dialect.name
    row = conn.execute(
        end_lease_sql(dialect, SUCCEEDED, result=True),
        {"item_id": lease.item_id, "token": lease.token, "result": result},
    ).first()
    _fence_held(s, lease, row)
    ready: list[dict[str, Any]] = []
    if not last_lane:
        ready = _advance(s, lease.job_id, lease.position, lease.photo_ids, state_for(control), bundle)
    for write in writes:
        write(s)
    if lease.holds_locks:
        release_locks(s, lease.item_id)
    succeeded = {
        "type": "item_succeeded",
        "job_id": lease.job_id,
        "item_id": lease.item_id,
        "photo_id": lease.photo_id,
        "lane": lease.lane,
        "attempt": lease.attempt,
        "token": lease.token,
        "worker": worker,
        "detail": {"result": result} if result else None,
    }
    deferred = s.info.get(DEFERRED_EVENTS)
    if deferred is not None and last_lane:
        # A batch finish (store.fencing.fenced_batch) inserts its rows together before the commit;
        # only a last lane's: nothing follows it, so the events keep their order within the item
        # (a next lane's ``item_ready`` always comes after its predecessor's success).
        deferred.append(succeeded)
    else:
        conn.execute(event_sql(dialect), succeeded)
    emit_many(s, ready)


def fail(
    s: Session, spec: LaneSpec, lease: Lease, error: str, worker: str | None, *, retry: bool = True
) -> str:
    """Finish a running item after an error: ``pending`` with backoff while attempts remain, else ``failed``.

    Returns the new state. A failure for good skips the photo's later lanes (``skip_successors``)
    before it drops its photo-lock rows (lock order: items before photo-lock rows).
    """
    control = lock_for_finish(s, lease)
    if retry and lease.attempt < spec.max_attempts:
        delay = spec.retry_delay(lease.attempt)
        state = state_for(control)
        _end_lease(s, lease, state=state, error=error, not_before=db_now() + delay)
        _event(s, "item_retry_scheduled", lease, worker, {"error": error, "delay": delay, "state": state})
        return state
    bundle = lock_bundle(s, lease.job_id, lease.position + 1)
    _end_lease(s, lease, release=False, state=FAILED, error=error)
    reason = f"{lease.lane} failed: {error}"
    skipped = _skip(s, lease.job_id, lease.position, lease.photo_ids, reason, state_for(control), bundle)
    if lease.holds_locks:
        release_locks(s, lease.item_id)
    _event(s, "item_failed", lease, worker, {"error": error})
    emit_many(s, skipped)
    return FAILED


def stop(s: Session, lease: Lease, worker: str | None, reason: str) -> str:
    """End a running item that stopped cooperatively, as its job asks *now* (read in this
    transaction, under a share lock): ``cancelled``, ``paused``, or back to ``pending`` (a resume
    came first, or the worker is shutting down). A stop that was not a failure does not use up an
    attempt, whichever state it ends in: the claim's attempt is handed back on cancel as on pause
    (a batch-mate cancelled before its turn never ran)."""
    state = state_for(lock_for_finish(s, lease))
    if state == CANCELLED:
        _end_lease(s, lease, state=CANCELLED, attempt=Item.attempt - 1)
        _event(s, "item_cancelled", lease, worker, {"reason": reason})
        return CANCELLED
    _end_lease(s, lease, state=state, attempt=Item.attempt - 1)
    _event(
        s,
        "item_paused" if state == PAUSED else "item_released",
        lease,
        worker,
        {"reason": reason, "state": state},
    )
    return state


def ready_state(s: Session, job_id: int) -> str:
    """The state an item becomes when it is ready to run: ``pending``, or ``paused``/``cancelled``
    when its job asks so. Reads the job under a share lock so a concurrent cancel/pause (which
    locks the job row for update) sees this transaction's result and sweeps it up."""
    return state_for(lock_job(s, job_id))


def state_for(control: str | None) -> str:
    """The ready state for a job control request."""
    return {CANCEL: CANCELLED, PAUSE: PAUSED}.get(control or "", PENDING)


def successors_query(job_id: int, position: int, photo_ids: Sequence[int]) -> Select[Any]:
    """Waiting items of later lanes for these photos: ``ix_items_job_photo`` (job, photo, position);
    the columns the finish needs, not ORM entities."""
    return select(Item.id, Item.photo_id, Item.lane, Item.fencing_token, Item.position).where(
        Item.job_id == job_id,
        Item.position > position,
        Item.photo_id.in_(photo_ids),
        unindexed_state(WAITING),
    )


def _successors(s: Session, job_id: int, position: int, photo_ids: Iterable[int]) -> list[Any]:
    ids = tuple(photo_ids)
    out: list[Any] = []
    for chunk in chunked(ids):
        out += s.execute(successors_query(job_id, position, chunk)).all()
    return out


def unfinished_in_lane(job_id: int, lane: str, state: str, dialect: str) -> Select[tuple[int, str, str]]:
    """The first (job, lane, state) at or after (``job_id``, ``lane``, ``state``) in
    ``ix_items_job_state``: one seek that stops at the first row. An item of the lane is in
    ``state`` when that row equals the key. On PostgreSQL a row-value comparison in the index's
    order, so the planner cannot prefer reading the table for a LIMIT 1; on SQLite plain equalities
    (its row-value ranges are slow)."""
    if dialect == "postgresql":
        key = tuple_(Item.job_id, Item.lane, Item.state)
        where = key >= tuple_(literal(job_id), literal(lane), literal(state))
    else:
        where = and_(Item.job_id == job_id, Item.lane == lane, Item.state == state)
    return (
        select(Item.job_id, Item.lane, Item.state)
        .where(where)
        .order_by(Item.job_id, Item.lane, Item.state)
        .limit(1)
    )


def lane_unfinished(s: Session, job_id: int, lane: str) -> bool:
    """Has any item of the job's ``lane`` not ended? One seek per unfinished state, so finishing
    an item of a 100,000-photo job does not count the others (a count over the lane's items — and
    before that a scan of the job's items, ``position`` having no index — made it quadratic)."""
    dialect = s.get_bind().dialect.name
    for state in UNFINISHED:
        row = s.execute(unfinished_in_lane(job_id, lane, state, dialect)).first()
        if row is not None and tuple(row) == (job_id, lane, state):
            return True
    return False


def _waiting_bundle(s: Session, job_id: int, position: int) -> int | None:
    """The id of the job's bundle item at ``position`` while it waits (no lock)."""
    return s.execute(
        select(Item.id).where(
            Item.job_id == job_id, Item.position == position, Item.photo_id.is_(None), Item.state == WAITING
        )
    ).scalar_one_or_none()


def lock_bundle(s: Session, job_id: int, position: int) -> Any:
    """The job's waiting bundle item at ``position`` (its id, lane and token), row-locked; None
    when none waits there. Taken by an ending item of the lane before, after the job's share lock
    and before the item's own row (a bundle is created before its job's photo items: a lower id),
    so of two items finishing at once the second waits here, sees the first's commit, and exactly
    one of them releases the bundle (``_bundle_ready``)."""
    bundle_id = _waiting_bundle(s, job_id, position)
    if bundle_id is None:
        return None
    return s.execute(
        select(Item.id, Item.lane, Item.fencing_token)
        .where(Item.id == bundle_id, Item.state == WAITING)
        .with_for_update()
    ).first()


def _bundle_ready(s: Session, job_id: int, position: int, bundle: Any, state: str) -> list[dict[str, Any]]:
    """A bundle item (several photos, at ``position``, locked by ``lock_bundle``) becomes ready
    (``state``) once every item of the lane before it has ended (the ending item's own row already
    written). Its event row, for the caller to insert after the ending item's own event."""
    if bundle is None:
        return []
    lanes = s.execute(select(Job.lanes).where(Job.id == job_id)).scalar_one()
    if position > 0 and lane_unfinished(s, job_id, lanes[position - 1]):
        return []
    s.execute(update(Item).where(Item.id == bundle.id).values(state=state, updated_at=db_now()))
    return [
        {
            "type": "item_ready" if state == PENDING else f"item_{state}",
            "job_id": job_id,
            "item_id": bundle.id,
            "lane": bundle.lane,
            "token": bundle.fencing_token,
            "detail": {"state": state, "bundle": True},
        }
    ]


def bundle_members(engine: Engine, item_id: int) -> list[tuple[int, str]]:
    """(photo id, current path) of a bundle's photos whose item in the lane before succeeded
    (all of them when the bundle is the first lane)."""
    with Session(reader(engine)) as s:
        bundle = s.get(Item, item_id)
        if bundle is None:
            return []
        q = (
            select(Photo.id, Photo.path)
            .join(ItemPhoto, ItemPhoto.photo_id == Photo.id)
            .where(ItemPhoto.item_id == item_id)
            .order_by(Photo.id)
        )
        if bundle.position > 0:
            done = select(Item.photo_id).where(
                Item.job_id == bundle.job_id, Item.position == bundle.position - 1, Item.state == SUCCEEDED
            )
            q = q.where(Photo.id.in_(done))
        return [(r.id, r.path) for r in s.execute(q)]


def _mark_waiting(s: Session, rows: Sequence[Any], values: dict[str, Any]) -> list[Any]:
    """The still-waiting ones of ``rows`` (items) updated with ``values``; those updated (a
    concurrent cancel may have ended some already)."""
    changed: set[int] = set()
    for chunk in chunked([i.id for i in rows]):
        changed.update(
            s.execute(
                update(Item)
                .where(Item.id.in_(chunk), unindexed_state(WAITING))
                .values(**values, updated_at=db_now())
                .returning(Item.id)
            ).scalars()
        )
    return [i for i in rows if i.id in changed]


def _advance(
    s: Session, job_id: int, position: int, photo_ids: Iterable[int], state: str, bundle: Any
) -> list[dict[str, Any]]:
    """The photo's item of the next lane becomes ready (``state``: pending, or paused/cancelled per
    the job), and the next lane's bundle (locked by ``lock_bundle``) when its lane before ended.
    Their event rows, for the caller to insert after the ending item's own event."""
    events = _bundle_ready(s, job_id, position + 1, bundle, state)
    nxt = [i for i in _successors(s, job_id, position, photo_ids) if i.position == position + 1]
    if not nxt:
        return events
    return events + [
        {
            "type": "item_ready" if state == PENDING else f"item_{state}",
            "job_id": job_id,
            "item_id": i.id,
            "photo_id": i.photo_id,
            "lane": i.lane,
            "token": i.fencing_token,
            "detail": {"state": state},
        }
        for i in _mark_waiting(s, nxt, {"state": state})
    ]


def _skip(
    s: Session, job_id: int, position: int, photo_ids: Iterable[int], reason: str, state: str, bundle: Any
) -> list[dict[str, Any]]:
    """Every later lane's waiting item of the photos becomes ``skipped`` with the reason, and the
    next lane's bundle (locked by ``lock_bundle``) goes on without them once its lane before ended
    (``state``: its ready state). Their event rows, for the caller to insert."""
    events = _bundle_ready(s, job_id, position + 1, bundle, state)
    later = _successors(s, job_id, position, photo_ids)
    if not later:
        return events
    return events + [
        {
            "type": "item_skipped",
            "job_id": job_id,
            "item_id": i.id,
            "photo_id": i.photo_id,
            "lane": i.lane,
            "token": i.fencing_token,
            "detail": {"reason": reason},
        }
        for i in _mark_waiting(s, later, {"state": SKIPPED, "error": reason})
    ]


def skip_successors(s: Session, job_id: int, position: int, photo_ids: Iterable[int], reason: str) -> None:
    """Every later lane's item of the photo becomes ``skipped`` with the reason (a bundle goes on
    without the photo), with their events. Lock order: the job (share), then these items; a
    transaction that dropped photo-lock rows before calling this locked them first
    (``lock_successors``)."""
    state = ready_state(s, job_id)  # the job before any successor row (lock order)
    bundle = lock_bundle(s, job_id, position + 1)
    emit_many(s, _skip(s, job_id, position, photo_ids, reason, state, bundle))


def running_items(engine: Engine, job_id: int) -> list[dict[str, Any]]:
    """The job's running items with their lease owner (for the demo's worker kill and displays)."""
    with Session(reader(engine)) as s:
        rows = s.execute(
            select(Item.id, Item.lane, Item.lease_owner).where(Item.job_id == job_id, Item.state == RUNNING)
        ).all()
    return [{"id": r.id, "lane": r.lane, "lease_owner": r.lease_owner} for r in rows]
