"""Taking photo locks inside a claim's transaction (the SQL half of ``middleware.locks``).

A lock request says which mode the lane's item takes on its photos (``SHARED`` or ``EXCLUSIVE``)
and how long a conflicting item waits before it is tried again. The Dramatiq lock middleware
(``middleware/locks.py``) decides the request; ``store.items.claim`` carries it out in the same
transaction as the lease, so the item holds its lease and its locks together or neither.

Photos are taken in ascending id order (PostgreSQL row locks on ``photos``; SQLite's write lock
already serializes every claim), then the photo-lock rows of those photos are read in the same
statement: another item's exclusive lock, or any lock when this one is exclusive, is a conflict.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TypeVar

from sqlalchemy import Connection, Integer, String, bindparam, column, text
from sqlalchemy.sql.selectable import TextualSelect

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


@cache
def _locks_sql(dialect: str) -> TextualSelect:
    # ORDER BY + FOR UPDATE OF: PostgreSQL locks the photo rows as they leave the sort, i.e. in
    # ascending id order — the global photo order — and reads their lock rows in the same statement.
    lock = " FOR UPDATE OF photos" if dialect == "postgresql" else ""
    return (
        text(
            f"""
            SELECT photos.id AS photo_id, photo_locks.item_id AS item_id, photo_locks.mode AS mode
            FROM photos LEFT JOIN photo_locks ON photo_locks.photo_id = photos.id
            WHERE photos.id IN :ids ORDER BY photos.id{lock}
            """
        )
        .bindparams(bindparam("ids", expanding=True))
        .columns(column("photo_id", Integer), column("item_id", Integer), column("mode", String))
    )


_DROP_OWN = text("DELETE FROM photo_locks WHERE item_id = :item_id")
_INSERT = text(
    "INSERT INTO photo_locks (photo_id, item_id, mode, token) VALUES (:photo_id, :item_id, :mode, :token)"
)


def take(
    conn: Connection, item_id: int, photo_ids: Sequence[int], request: LockRequest, token: int
) -> Conflict | None:
    """Lock the photos for ``item_id`` (caller's transaction, after the item's row): the first
    conflict, or None with the lock rows written (this item's older rows, kept by its unsettled
    intents, are taken over by the new attempt)."""
    ordered = sorted(set(photo_ids))
    own = False
    statement = _locks_sql(conn.dialect.name)
    for chunk in chunked(ordered):
        for row in conn.execute(statement, {"ids": list(chunk)}):
            if row.item_id is None:
                continue
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
