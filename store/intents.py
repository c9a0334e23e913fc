"""File-effect intents (exactly-once file effects, DESIGN.md rule 9) and the photo facts they use.

An intent says "move ``staged`` to ``target`` (expected content ``sha256``)". It is recorded in a
fenced transaction *before* the file operation, applied with one atomic operation, then marked
``applied`` (or ``discarded``) in another fenced transaction. A recovering attempt of the same item
finishes or discards the intents its predecessors left ``recorded``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from .clock import db_now
from .engine import reader
from .events import emit
from .items import Lease
from .models import SUCCEEDED, Intent, Item, Photo

RECORDED = "recorded"
APPLIED = "applied"
DISCARDED = "discarded"


@dataclass(frozen=True)
class IntentRow:
    id: int
    item_id: int
    token: int
    photo_id: int | None
    kind: str
    staged: str
    target: str
    source: str | None
    sha256: str | None
    state: str


def _row(i: Intent) -> IntentRow:
    return IntentRow(
        i.id, i.item_id, i.token, i.photo_id, i.kind, i.staged, i.target, i.source, i.sha256, i.state
    )


class TargetTaken(Exception):  # noqa: N818
    """Another live intent already claims this target path."""


def record(
    s: Session,
    lease: Lease,
    *,
    kind: str,
    staged: str,
    target: str,
    source: str | None,
    sha256: str | None,
    worker: str | None,
) -> int:
    """Record an intent in the caller's fenced session; ``TargetTaken`` if another live intent
    already names the target (the unique index on live targets decides)."""
    try:
        with s.begin_nested():
            intent_id = s.execute(
                insert(Intent)
                .values(
                    item_id=lease.item_id,
                    token=lease.token,
                    photo_id=lease.photo_id,
                    kind=kind,
                    staged=staged,
                    target=target,
                    source=source,
                    sha256=sha256,
                    state=RECORDED,
                    created_at=db_now(),
                )
                .returning(Intent.id)
            ).scalar_one()
    except IntegrityError as exc:  # the unique index on live targets
        raise TargetTaken(target) from exc
    emit(
        s,
        "intent_recorded",
        job_id=lease.job_id,
        item_id=lease.item_id,
        photo_id=lease.photo_id,
        lane=lease.lane,
        attempt=lease.attempt,
        token=lease.token,
        worker=worker,
        detail={"intent": intent_id, "kind": kind, "target": target, "staged": staged},
    )
    return intent_id


def settle(
    s: Session,
    lease: Lease,
    intent_id: int,
    state: str,
    *,
    worker: str | None,
    photo_path: str | None = None,
    photo_sha256: str | None = None,
    note: str | None = None,
) -> None:
    """Mark an intent applied/discarded (fenced session); an applied move also moves the photo's path."""
    s.execute(update(Intent).where(Intent.id == intent_id, Intent.state == RECORDED).values(state=state))
    values: dict[str, Any] = {}
    if photo_path is not None:
        values["path"] = photo_path
    if photo_sha256 is not None:
        values["sha256"] = photo_sha256
    if values and lease.photo_id is not None:
        values["updated_at"] = db_now()
        s.execute(update(Photo).where(Photo.id == lease.photo_id).values(**values))
    emit(
        s,
        f"intent_{state}",
        job_id=lease.job_id,
        item_id=lease.item_id,
        photo_id=lease.photo_id,
        lane=lease.lane,
        attempt=lease.attempt,
        token=lease.token,
        worker=worker,
        detail={
            "intent": intent_id,
            **({"note": note} if note else {}),
            **({"path": photo_path} if photo_path else {}),
        },
    )


def open_intents(engine: Engine, item_id: int) -> list[IntentRow]:
    """Intents of this item still ``recorded`` (left by earlier attempts, or this one)."""
    with Session(reader(engine)) as s:
        rows = s.execute(
            select(Intent).where(Intent.item_id == item_id, Intent.state == RECORDED).order_by(Intent.id)
        ).scalars()
        return [_row(r) for r in rows]


def item_intents(engine: Engine, item_id: int) -> list[IntentRow]:
    with Session(reader(engine)) as s:
        return [
            _row(r)
            for r in s.execute(select(Intent).where(Intent.item_id == item_id).order_by(Intent.id)).scalars()
        ]


def live_staged_paths(engine: Engine) -> set[str]:
    with Session(reader(engine)) as s:
        return set(s.execute(select(Intent.staged).where(Intent.state == RECORDED)).scalars())


def photo_facts(engine: Engine, job_id: int, photo_id: int | None) -> dict[str, Any] | None:
    """The photo's analysis facts: this job's analysis item if it has one, else the newest from any job;
    plus ``file_time``, the file's modification time recorded at submission, when known."""
    if photo_id is None:
        return None
    with Session(reader(engine)) as s:
        rows = s.execute(
            select(Item.job_id, Item.result)
            .where(Item.photo_id == photo_id, Item.lane == "analysis", Item.state == SUCCEEDED)
            .order_by(Item.id.desc())
        ).all()
        file_time = s.execute(select(Photo.file_time).where(Photo.id == photo_id)).scalar()
    facts = next((dict(result) for job, result in rows if job == job_id and result), None)
    if facts is None and rows and rows[0].result:
        facts = dict(rows[0].result)
    if file_time is not None:
        facts = {**(facts or {}), "file_time": file_time}
    return facts


def set_photo_hash(s: Session, photo_id: int, sha256: str, size: int | None) -> None:
    s.execute(update(Photo).where(Photo.id == photo_id).values(sha256=sha256, size=size, updated_at=db_now()))
