"""The photos of a job that may share a rename target with one photo: a burst of shots in one
second (``actors/rename.py`` orders their ``_N`` suffixes by sub-seconds). Read-only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Engine, or_, select
from sqlalchemy.orm import Session, aliased

from .engine import reader
from .models import CANCELLED, FAILED, SKIPPED, Item, Photo

_ENDED_WITHOUT_A_NAME = (FAILED, SKIPPED, CANCELLED)


@dataclass(frozen=True)
class Candidate:
    """A photo of the job whose rename item has not ended without a name: where it is now, its
    recorded file time, and its item's state in ``before_lane`` (None: the job has no such lane)."""

    photo_id: int
    path: str
    file_time: float | None
    before_state: str | None


def rename_candidates(
    engine: Engine, job_id: int, folders: Sequence[str], lane: str, before_lane: str | None
) -> list[Candidate]:
    """The job's photos whose ``lane`` item did not fail, skip or cancel and whose current path lies
    directly in one of ``folders``, in photo id order; with the state of their ``before_lane``
    item (the exif lane: has an earlier time shift been applied to the photo yet?)."""
    before = aliased(Item)
    columns = [Photo.id, Photo.path, Photo.file_time]
    q = select(*columns, before.state if before_lane else Photo.id).join(Item, Item.photo_id == Photo.id)
    if before_lane:
        q = q.outerjoin(
            before, (before.photo_id == Photo.id) & (before.job_id == job_id) & (before.lane == before_lane)
        )
    q = q.where(
        Item.job_id == job_id,
        Item.lane == lane,
        Item.state.not_in(_ENDED_WITHOUT_A_NAME),
        or_(*(Photo.path.startswith(folder.rstrip("/") + "/", autoescape=True) for folder in folders)),
    ).order_by(Photo.id)
    wanted = {folder.rstrip("/") for folder in folders}
    with Session(reader(engine)) as s:
        rows = s.execute(q).all()
    return [
        Candidate(r[0], r[1], r[2], r[3] if before_lane else None)
        for r in rows
        if r[1].rsplit("/", 1)[0] in wanted
    ]


def photo_paths(engine: Engine, photo_ids: Sequence[int]) -> dict[int, str]:
    """Where these photos are now (the store's path), by id."""
    if not photo_ids:
        return {}
    with Session(reader(engine)) as s:
        rows = s.execute(select(Photo.id, Photo.path).where(Photo.id.in_(sorted(set(photo_ids))))).all()
    return {r[0]: r[1] for r in rows}
