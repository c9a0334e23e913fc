"""Idempotency keys (issue 38): a retried submission with the same ``Idempotency-Key`` answers the
first job instead of making a second one.

A key is recorded in the transaction that creates its job (``store.submission.submit`` calls
:func:`claim` after it inserted the job), so a key and its job exist together or not at all. The
check is made there too, under the lock that transaction already holds (PostgreSQL: the
submitters' advisory lock; SQLite: the write lock of ``BEGIN IMMEDIATE``), and the primary key
``(scope, key)`` is the backstop: of two requests racing with one key, one makes the job, the other
finds it (:class:`Replay`). A key with another request's hash is refused (:class:`KeyReused`).
Keys are kept ``PHOTOJOBS_IDEMPOTENCY_KEEP`` (default 24 h) and pruned by the sweeper and by
``photojobs prune`` (:func:`prune_keys`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, delete, insert, select, update
from sqlalchemy.orm import Session

from .clock import db_now
from .engine import reader
from .errors import SubmissionError
from .models import IdempotencyKey

KEEP = 86400.0  # seconds a key is kept (PHOTOJOBS_IDEMPOTENCY_KEEP)
MAX_KEY = 255
SCOPES = ("jobs", "sync")


class KeyReused(SubmissionError):
    """The key was already used with another request (HTTP 409)."""

    def __init__(self, scope: str, key: str, job_id: int | None) -> None:
        self.scope, self.key, self.job_id = scope, key, job_id
        super().__init__(
            f"the idempotency key was already used with another request (job {job_id}); "
            "use a new key for a different request"
        )


@dataclass(frozen=True)
class Idempotency:
    """A request's key and its hash (``request_hash``), passed down to the job's transaction."""

    scope: str
    key: str
    request_sha256: str


class Replay(Exception):  # noqa: N818 - a control-flow answer, not a failure
    """The key was used before with the same request: its job and what the first request answered
    (``response``, None while the first is still landing its photos)."""

    def __init__(self, job_id: int | None, response: dict[str, Any] | None) -> None:
        super().__init__(job_id)
        self.job_id, self.response = job_id, response


def request_hash(scope: str, request: Mapping[str, Any]) -> str:
    """The SHA-256 of a request as JSON with sorted keys (a retried request hashes the same)."""
    payload = json.dumps({"scope": scope, **request}, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def make(scope: str, key: str, request: Mapping[str, Any]) -> Idempotency:
    """Check a key (1 to 255 printable ASCII characters) and hash its request."""
    if scope not in SCOPES:
        raise ValueError(f"unknown idempotency scope {scope!r}")
    if not key or len(key) > MAX_KEY or not all(" " < c <= "~" for c in key):
        raise SubmissionError("an idempotency key is 1 to 255 printable ASCII characters without spaces")
    return Idempotency(scope, key, request_hash(scope, request))


def _answer(row: Any, idem: Idempotency) -> Replay:
    if row.request_sha256 != idem.request_sha256:
        raise KeyReused(idem.scope, idem.key, row.job_id)
    return Replay(row.job_id, row.response)


def look_up(engine: Engine, idem: Idempotency) -> Replay | None:
    """The answer of an earlier request with this key (a fast path before the work; the
    authoritative check is :func:`claim`'s). Raises ``KeyReused`` for another request's key."""
    with Session(reader(engine)) as s:
        row = s.execute(_row(idem)).first()
    return None if row is None else _answer(row, idem)


def _row(idem: Idempotency) -> Any:
    return select(IdempotencyKey.request_sha256, IdempotencyKey.job_id, IdempotencyKey.response).where(
        IdempotencyKey.scope == idem.scope, IdempotencyKey.key == idem.key
    )


def check(s: Session, idem: Idempotency) -> None:
    """In the transaction that would create the job, before it does: raise ``Replay`` (same
    request) or ``KeyReused`` (another) when the key is taken."""
    row = s.execute(_row(idem)).first()
    if row is not None:
        raise _answer(row, idem)


def claim(s: Session, idem: Idempotency, job_id: int | None) -> None:
    """Record the key with its job in the caller's transaction (the one that created the job)."""
    s.execute(
        insert(IdempotencyKey).values(
            scope=idem.scope,
            key=idem.key,
            request_sha256=idem.request_sha256,
            job_id=job_id,
            created_at=db_now(),
        )
    )


def replay_after_conflict(engine: Engine, idem: Idempotency) -> Replay:
    """After the key's insert hit the primary key (another request committed it first): its answer."""
    answer = look_up(engine, idem)
    if answer is None:  # pragma: no cover - the row that conflicted was committed
        raise SubmissionError("the idempotency key is being used by another request; try again")
    return answer


def record_response(engine: Engine, idem: Idempotency, response: Mapping[str, Any]) -> None:
    """What the first request answered, for its replays."""
    with Session(engine) as s, s.begin():
        s.execute(
            update(IdempotencyKey)
            .where(IdempotencyKey.scope == idem.scope, IdempotencyKey.key == idem.key)
            .values(response=dict(response))
        )


def record_without_job(engine: Engine, idem: Idempotency, response: Mapping[str, Any]) -> Replay | None:
    """A request that made no job (a sync that found nothing): its key and answer in one
    transaction; the earlier answer (``Replay``) when another request recorded the key first."""
    with Session(engine) as s, s.begin():
        try:
            check(s, idem)
        except Replay as replay:
            return replay
        claim(s, idem, None)
        s.execute(
            update(IdempotencyKey)
            .where(IdempotencyKey.scope == idem.scope, IdempotencyKey.key == idem.key)
            .values(response=dict(response))
        )
    return None


def prune_keys(engine: Engine, keep: float = KEEP) -> int:
    """Delete the keys older than ``keep`` seconds (database clock); how many."""
    with Session(engine) as s, s.begin():
        return (
            s.execute(delete(IdempotencyKey).where(IdempotencyKey.created_at < db_now() - keep)).rowcount or 0
        )
