"""Taking photo locks inside a claim's transaction (the SQL half of ``middleware.locks``).

A lock request says which mode the lane's item takes on its photos (``SHARED`` or ``EXCLUSIVE``)
and how long a conflicting item waits before it is tried again. The Dramatiq lock middleware
(``middleware/locks.py``) decides the request; ``store.items.claim`` carries it out in the same
transaction as the lease, so the item holds its lease and its locks together or neither.

Photos are taken in ascending id order (PostgreSQL row locks on ``photos``; SQLite's write lock
already serializes every claim), then the photo-lock rows of those photos are read by the next
statement: another item's exclusive lock, or any lock when this one is exclusive, is a conflict.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import Connection, Integer, String, bindparam, column, text

SHARED = "S"
EXCLUSIVE = "X"
IN_CHUNK = 10_000  # values per IN list: far below either store's bind-parameter limit
T = TypeVar("T")


@dataclass(frozen=True)
class LockRequest:
    """Photo locks an item takes with its lease: ``mode`` on each of its photos; on a conflict the
    item goes back to ``pending`` for ``retry_after`` seconds, holding nothing."""

    mode: str
    retry_after: float

    def __post_init__(self) -> None:
        if self.mode not in (SHARED, EXCLUSIVE):
            raise ValueError(f"photo lock mode must be {SHARED!r} or {EXCLUSIVE!r}, not {self.mode!r}")


@dataclass(frozen=True)
class Conflict:
    photo_id: int
    held_by: int  # the item holding it


def chunked(values: Sequence[T], size: int = IN_CHUNK) -> Iterator[Sequence[T]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


_ROW_LOCKS = (
    text("SELECT id, path FROM photos WHERE id IN :ids ORDER BY id FOR UPDATE")
    .bindparams(bindparam("ids", expanding=True))
    .columns(column("id", Integer), column("path", String))
)


def lock_photo_rows(conn: Connection, photo_ids: Sequence[int]) -> dict[int, str]:
    """PostgreSQL: lock the photos' rows in ascending id (the one order every transaction that
    locks several photos keeps), returning each one's path as of its lock."""
    paths: dict[int, str] = {}
    for chunk in chunked(sorted(set(photo_ids))):
        for row in conn.execute(_ROW_LOCKS, {"ids": list(chunk)}):
            paths[row.id] = row.path
    return paths


_HELD = (
    text("SELECT photo_id, item_id, mode FROM photo_locks WHERE photo_id IN :ids")
    .bindparams(bindparam("ids", expanding=True))
    .columns(column("photo_id", Integer), column("item_id", Integer), column("mode", String))
)


_DROP_OWN = text("DELETE FROM photo_locks WHERE item_id = :item_id")
_INSERT = text(
    "INSERT INTO photo_locks (photo_id, item_id, mode, token) VALUES (:photo_id, :item_id, :mode, :token)"
)


def take(
    conn: Connection,
    item_id: int,
    photo_ids: Sequence[int],
    request: LockRequest,
    token: int,
    paths: dict[int, str] | None = None,
) -> Conflict | None:
    """Lock the photos for ``item_id`` (caller's transaction, after the item's row): the first
    conflict, or None with the lock rows written (this item's older rows, kept by its unsettled
    intents, are taken over by the new attempt).

    On PostgreSQL ``paths`` receives each photo's path as of its row lock: a row locked after a
    wait is returned in its newest version, while the claim statement's own read of the path
    comes from that statement's snapshot (a rename committed while the claim waited for the
    item's row would be missed)."""
    ordered = sorted(set(photo_ids))
    if conn.dialect.name == "postgresql":
        # The photo rows first, in ascending order, in a statement of their own: the lock rows must
        # be read by a *later* statement, whose snapshot includes what a claimer we waited for
        # committed (read in the same statement, they came from before the wait: two exclusive
        # holders — found by the photo chaos run). SQLite's BEGIN IMMEDIATE serializes claims.
        # (A batch claim takes its items' locks together: ``take_many``.)
        got = lock_photo_rows(conn, ordered)
        if paths is not None:
            paths.update(got)
    own = False
    for chunk in chunked(ordered):
        for row in conn.execute(_HELD, {"ids": list(chunk)}):
            if row.item_id == item_id:
                own = True
            elif request.mode == EXCLUSIVE or row.mode == EXCLUSIVE:
                return Conflict(row.photo_id, row.item_id)
    if own:
        conn.execute(_DROP_OWN, {"item_id": item_id})
    for chunk in chunked(ordered):
        conn.execute(
            _INSERT,
            [{"photo_id": p, "item_id": item_id, "mode": request.mode, "token": token} for p in chunk],
        )
    return None


def take_many(
    conn: Connection, wanted: Sequence[tuple[int, Sequence[int], LockRequest, int]]
) -> dict[int, Conflict]:
    """:func:`take` for a batch claim's items (``wanted``: item id, its photos, its request, its new
    token; in the batch's order), their photos' rows already locked (``lock_photo_rows``): the lock
    rows of all their photos read by one statement, each item's request decided in turn against
    them and against the items before it in ``wanted`` — what taking them one after another would
    decide — and every granted item's rows written by one more. Returns the items that met a
    conflict (nothing of theirs written); an item's own older rows are taken over as in
    :func:`take`."""
    held: dict[int, list[tuple[int, str]]] = {}
    photos = sorted({p for _, ids, _, _ in wanted for p in ids})
    for chunk in chunked(photos):
        for row in conn.execute(_HELD, {"ids": list(chunk)}):
            held.setdefault(row.photo_id, []).append((row.item_id, row.mode))
    conflicts: dict[int, Conflict] = {}
    rows: list[dict[str, object]] = []
    for item_id, ids, request, token in wanted:
        ordered = sorted(set(ids))
        own = False
        conflict = None
        for photo in ordered:
            for holder, mode in held.get(photo, ()):
                if holder == item_id:
                    own = True
                elif conflict is None and (request.mode == EXCLUSIVE or mode == EXCLUSIVE):
                    conflict = Conflict(photo, holder)
        if conflict is not None:
            conflicts[item_id] = conflict
            continue
        if own:
            conn.execute(_DROP_OWN, {"item_id": item_id})
            for photo, holders in held.items():
                held[photo] = [h for h in holders if h[0] != item_id]
        for photo in ordered:
            held.setdefault(photo, []).append((item_id, request.mode))
            rows.append({"photo_id": photo, "item_id": item_id, "mode": request.mode, "token": token})
    for chunk in chunked(rows):
        conn.execute(_INSERT, list(chunk))
    return conflicts
