"""photos.file_time (revision 0003): recorded once at submission, kept across later submissions,
handed to the lanes with the photo's facts; a store made before it upgrades in place."""

from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.command import downgrade
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

from store import jobs as store_jobs
from store.intents import photo_facts
from store.lanes import lane_spec
from store.models import Base, Photo
from store.schema import alembic_config, current_revision, head_revision, upgrade

RENAME = lane_spec("rename", env={})


def _file_times(engine: Engine) -> dict[str, float | None]:
    with Session(engine) as s:
        return {p: t for p, t in s.execute(select(Photo.path, Photo.file_time))}


def test_file_time_is_recorded_once_and_reaches_the_facts(engine: Engine, tmp_path: Path) -> None:
    # Given a photo submitted with its modification time
    path = str(tmp_path / "undated.jpg")
    job = store_jobs.submit(engine, [RENAME], [store_jobs.PhotoInput(path, 10, 1_268_000_000.0)]).job_id
    assert _file_times(engine) == {path: 1_268_000_000.0}
    # When it is submitted again after an edit changed its modification time
    store_jobs.submit(engine, [RENAME], [store_jobs.PhotoInput(path, 12, 1_800_000_000.0)])
    # Then the time recorded first is kept, and the lanes get it with the photo's facts
    assert _file_times(engine) == {path: 1_268_000_000.0}
    with Session(engine) as s:
        photo_id = s.execute(select(Photo.id)).scalar_one()
    assert photo_facts(engine, job, photo_id) == {"file_time": 1_268_000_000.0}


def test_a_store_from_revision_0001_upgrades_and_fills_file_time(engine: Engine, tmp_path: Path) -> None:
    # Given a store at revision 0001 that already knows a photo (no file_time column yet)
    downgrade(alembic_config(engine), "0001")
    assert current_revision(engine) == "0001"
    path = str(tmp_path / "old.jpg")
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO photos (path, size, updated_at) VALUES (:p, 1, 0)"),
            {"p": path},
        )
    # When it is upgraded
    upgrade(engine)
    # Then it is at the head revision, the schema matches the models, the old photo has no file time
    assert current_revision(engine) == head_revision()
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    # (but for PostgreSQL's optional trigram index, which the models leave out: revision 0012)
    assert [d for d in diff if not (d[0] == "remove_index" and d[1].name == "ix_photos_path_trgm")] == []
    assert _file_times(engine) == {path: None}
    # and its next submission records one (and a missing time stays unknown)
    other = str(tmp_path / "unknown.jpg")
    inputs = [store_jobs.PhotoInput(path, 1, 1_500_000_000.0), store_jobs.PhotoInput(other, 1)]
    store_jobs.submit(engine, [RENAME], inputs)
    assert _file_times(engine) == {path: 1_500_000_000.0, other: None}
