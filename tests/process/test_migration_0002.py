"""Revision 0002 upgrades a live store: a job caught mid-run by the upgrade still finishes correctly."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import MetaData, select
from sqlalchemy.orm import Session

from photojobs.testing.samples import generate_samples
from photos import fileops
from photos.exif import ExifEdit, read_metadata, write_metadata
from store.engine import make_engine
from store.models import Intent, Item, PhotoLock
from store.schema import current_revision, head_revision, upgrade
from tests.conftest import PG_ADMIN
from tests.support import Fleet, wait_for


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database (no schema at all)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    request.getfixturevalue("pg_template")  # skips (or fails under CI) without PostgreSQL
    name = f"pj_old_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_job_mid_run_at_0001_finishes_after_upgrade(
    empty_db_url: str, redis_url: str, tmp_path: Path
) -> None:
    # Given a store at revision 0001 holding an EXIF job (+1h) mid-run, as 0001 code left it: its
    # item running under a lease whose worker is gone, its photo lock held, its intent recorded
    # (no base hash; the result hash in the old ``sha256`` column) and its staged file on disk
    folder = tmp_path / "photos"
    (photo,) = generate_samples(folder, 1, seed=5, size=(320, 240))
    taken = datetime.fromisoformat(read_metadata(photo)["taken"])
    staged = fileops.staged_path(photo, "i1-t1")
    write_metadata(photo, staged, ExifEdit.from_params({"shift": "+1h"}))
    result = fileops.sha256_file(staged)
    engine = make_engine(empty_db_url)
    upgrade(engine, "0001")
    meta = MetaData()
    meta.reflect(engine)
    t = meta.tables
    with engine.begin() as c:
        c.execute(
            t["jobs"].insert(),
            {
                "id": 1,
                "lanes": ["exif"],
                "params": {"exif.shift": "+1h"},
                "roots": [str(folder)],
                "fingerprint": "f" * 64,
                "control": None,
                "created_at": 0.0,
            },
        )
        c.execute(
            t["photos"].insert(),
            {"id": 1, "path": str(photo), "size": photo.stat().st_size, "sha256": None, "updated_at": 0.0},
        )
        c.execute(
            t["items"].insert(),
            {
                "id": 1,
                "job_id": 1,
                "lane": "exif",
                "position": 0,
                "photo_id": 1,
                "state": "running",
                "attempt": 1,
                "fencing_token": 1,
                "lease_owner": "gone:1:000000",
                "lease_ttl": 2.0,
                "lease_expires_at": 0.0,
                "not_before": 0.0,
                "updated_at": 0.0,
            },
        )
        c.execute(t["photo_locks"].insert(), {"photo_id": 1, "item_id": 1, "mode": "X", "token": 1})
        c.execute(
            t["intents"].insert(),
            {
                "id": 1,
                "item_id": 1,
                "token": 1,
                "photo_id": 1,
                "kind": "replace",
                "staged": str(staged),
                "target": str(photo),
                "source": str(photo),
                "sha256": result,
                "state": "recorded",
                "created_at": 0.0,
            },
        )
    # When the store is upgraded to the head revision and real workers take over
    upgrade(engine)
    assert current_revision(engine) == head_revision()
    with Session(engine) as s:
        (intent,) = s.execute(select(Intent)).scalars().all()
        assert (intent.result_sha256, intent.base_sha256) == (result, None)
    env = {
        **os.environ,
        "PHOTOJOBS_DATABASE_URL": empty_db_url,
        "PHOTOJOBS_REDIS_URL": redis_url,
        "PHOTOJOBS_LEASE_TTL": "2",
        "PHOTOJOBS_HEARTBEAT_INTERVAL": "0.5",
        "PHOTOJOBS_SWEEP_INTERVAL": "0.5",
        "PHOTOJOBS_REPUBLISH_AFTER": "1",
        "PYTHONUNBUFFERED": "1",
    }
    logs = tmp_path / "logs"
    logs.mkdir()
    fleet = Fleet(env, logs)
    try:
        fleet.start_sweeper()
        fleet.start_worker(["exif"], threads=1)

        def item() -> Item:
            with Session(engine) as s:
                row = s.get(Item, 1)
                assert row is not None
                return row

        wait_for(lambda: item().state in ("succeeded", "failed"), 120, what="the job to finish")
    finally:
        fleet.stop()
    # Then the item succeeded by applying the recorded edit exactly once, and nothing is left over
    assert item().state == "succeeded", (item().error, fleet.logs())
    assert datetime.fromisoformat(read_metadata(photo)["taken"]) == taken + timedelta(hours=1)
    assert fileops.sha256_file(photo) == result
    assert [p for p in folder.iterdir()] == [photo]
    with Session(engine) as s:
        assert [i.state for i in s.execute(select(Intent)).scalars()] == ["applied"]
        assert s.execute(select(PhotoLock)).all() == []
    engine.dispose()
