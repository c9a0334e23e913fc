"""Uploads to an S3-compatible target in a photo's history, and their undo (issue 31, round two), on
SQLite and PostgreSQL against a real moto S3 server: the upload and undo lanes' own code run item by
item in the test's process (``tests.inline_lanes``), finished through the fenced store like a worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from actors.undo import undoable
from actors.undo_remote import DELETING
from actors.upload import upload_photo
from middleware.context import ItemContext
from photojobs.api import Client
from photojobs.config import Settings
from photojobs.testing.samples import generate_samples
from photos.errors import PhotoError
from photos.fileops import sha256_file
from store import items as store_items
from store.errors import StaleLease
from store.history import effects_of
from store.lanes import lane_spec
from store.models import Item, Photo
from tests.inline_lanes import run_item
from tests.support import AWS_TEST_ENV, MotoServer


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = MotoServer(tmp_path_factory.mktemp("moto"))
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def s3(endpoint: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Any:
    for k, v in AWS_TEST_ENV.items():
        monkeypatch.setenv(k, v)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    bucket = f"undo-{abs(hash(request.node.nodeid)) % 10**9}"
    client.create_bucket(Bucket=bucket)
    client.bucket = bucket  # type: ignore[attr-defined]
    return client


def _client(engine: Engine, endpoint: str, bucket: str) -> Client:
    env = {"PHOTOJOBS_UPLOAD_TARGETS": f"backup=s3://{bucket}/shots@{endpoint}"}
    return Client(Settings.from_env(env), engine=engine)


def _run(engine: Engine, job: int) -> list[dict[str, Any] | Exception]:
    """Every item of the job in id order: its result, or the error that refused it."""
    with Session(engine) as s:
        items = s.execute(select(Item).where(Item.job_id == job).order_by(Item.id)).scalars().all()
        for item in items:
            s.expunge(item)
    out: list[dict[str, Any] | Exception] = []
    for item in items:
        try:
            out.append(run_item(engine, item))
        except PhotoError as exc:
            out.append(exc)
    return out


def _keys(s3: Any) -> list[str]:
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=s3.bucket).get("Contents", []))


def _upload(client: Client, engine: Engine, folder: Path) -> int:
    job = client.submit(["upload"], [folder], {"upload.target_name": "backup"}).job_id
    assert all(isinstance(r, dict) for r in _run(engine, job))
    return job


def test_an_s3_upload_is_in_the_history_and_undone_only_with_uploads_after_a_later_jobs_upload(
    engine: Engine, endpoint: str, s3: Any, tmp_path: Path
) -> None:
    # Given a photo uploaded to the operator's named S3 target by job A
    folder = tmp_path / "photos"
    (photo,) = generate_samples(folder, 1, seed=7, size=(64, 48))
    original = sha256_file(photo)
    client = _client(engine, endpoint, s3.bucket)
    a = _upload(client, engine, folder)
    key = f"shots/{original[:2]}/{original}.jpg"
    assert _keys(s3) == [key]
    # Then the photo's history lists the upload: kind, target name + key, content hash, created
    (entry,) = client.photo_history(str(photo))["history"]
    assert (entry["job"], entry["kind"], entry["target"], entry["key"]) == (a, "upload", "backup", key)
    assert entry["to_path"] == f"s3://{s3.bucket}/{key}" and entry["from_path"] == str(photo)
    assert entry["after_sha256"] == original and entry["created"] is True and entry["undone_by"] is None
    # When A is undone without --uploads: nothing to undo, the copy stays
    kept = client.undo(a)
    assert kept["job"] is None and "--uploads" in kept["note"] and _keys(s3) == [key]
    # When a later job B uploads the same photo (the same key: already there, created by A)
    b = _upload(client, engine, folder)
    (b_effect,) = effects_of(engine, b)
    assert b_effect.to_path == entry["to_path"] and b_effect.remote and b_effect.remote["created"] is False
    # Then undoing A with --uploads is refused: B's upload of that key must be undone first
    (refused,) = _run(engine, client.undo(a, uploads=True)["job"])
    assert isinstance(refused, PhotoError)
    assert f"changed since job {a} by job {b}'s upload" in str(refused)
    assert f"photojobs undo {b} --uploads" in str(refused) and _keys(s3) == [key]
    # When B is undone with --uploads: B found the object there, so it is left in place
    undo_b = client.undo(b, uploads=True)["job"]
    (left,) = _run(engine, undo_b)
    assert isinstance(left, dict) and left["left"] == [entry["to_path"]] and _keys(s3) == [key]
    # and then A with --uploads: the copy A created is deleted, the original untouched
    undo_a = client.undo(a, uploads=True)["job"]
    (removed,) = _run(engine, undo_a)
    assert isinstance(removed, dict) and removed["removed"] == [entry["to_path"]]
    assert _keys(s3) == [] and sha256_file(photo) == original
    story = client.photo_history(str(photo))["history"]
    assert [(e["job"], e["kind"], e["undone_by"]) for e in story] == [
        (a, "upload", undo_a),
        (b, "upload", undo_b),
        (undo_b, "upload left in place", None),
        (undo_a, "upload removed", None),
    ]
    assert story[3]["undoes"] == entry["effect"] and story[2]["undoes"] == story[1]["effect"]
    # and a second undo of A changes nothing (every effect undone already)
    again = client.undo(a, uploads=True)
    assert again["job"] is None and f"by job {undo_a}" in again["note"]
    client.engine.dispose()


@pytest.mark.parametrize("how", ["same bytes, another writer", "other bytes"])
def test_a_remote_copy_changed_since_is_refused_never_deleted(
    engine: Engine, endpoint: str, s3: Any, tmp_path: Path, how: str
) -> None:
    # Given a photo uploaded by job A, then its object replaced outside photojobs
    folder = tmp_path / "photos"
    (photo,) = generate_samples(folder, 1, seed=8, size=(64, 48))
    client = _client(engine, endpoint, s3.bucket)
    a = _upload(client, engine, folder)
    (key,) = _keys(s3)
    body = photo.read_bytes() if how == "same bytes, another writer" else b"not the photo"
    meta = {"sha256": sha256_file(photo)} if how == "same bytes, another writer" else {}
    s3.put_object(Bucket=s3.bucket, Key=key, Body=body, Metadata=meta)
    # When A is undone with --uploads
    (refused,) = _run(engine, client.undo(a, uploads=True)["job"])
    # Then the item is refused "changed since … outside photojobs" and the object is still there
    assert isinstance(refused, PhotoError), refused
    assert f"changed since job {a} outside photojobs" in str(refused) and "not deleted" in str(refused)
    assert s3.get_object(Bucket=s3.bucket, Key=key)["Body"].read() == body
    (effect,) = effects_of(engine, a)
    assert effect.undone_by is None
    client.engine.dispose()


def test_a_retried_remote_undo_knows_the_copy_its_killed_attempt_deleted(
    engine: Engine, endpoint: str, s3: Any, tmp_path: Path
) -> None:
    # Given a photo uploaded by job A, an undo item, and an earlier attempt of it that recorded the
    # deletion (fenced checkpoint) and deleted the object, then died before its finish
    folder = tmp_path / "photos"
    generate_samples(folder, 1, seed=9, size=(64, 48))
    client = _client(engine, endpoint, s3.bucket)
    a = _upload(client, engine, folder)
    (key,) = _keys(s3)
    (effect,) = effects_of(engine, a)
    undo = client.undo(a, uploads=True)["job"]
    with Session(engine) as s, s.begin():
        item = s.execute(select(Item).where(Item.job_id == undo)).scalar_one()
        item.checkpoint = {DELETING: [effect.id]}
    s3.delete_object(Bucket=s3.bucket, Key=key)
    # When the next attempt runs
    (done,) = _run(engine, undo)
    # Then it finds the copy gone, knows it was its own, and logs one removal
    assert isinstance(done, dict) and done["removed"] == [effect.to_path]
    assert [(e.kind, e.undoes) for e in effects_of(engine, undo)] == [("upload removed", effect.id)]
    # but a copy gone that no attempt deleted is "changed since … outside photojobs: … is gone"
    b = _upload(client, engine, folder)
    s3.delete_object(Bucket=s3.bucket, Key=key)
    (gone,) = _run(engine, client.undo(b, uploads=True)["job"])
    assert isinstance(gone, PhotoError) and f"changed since job {b} outside photojobs" in str(gone)
    assert "is gone" in str(gone)
    client.engine.dispose()


def test_an_undo_worker_that_lost_its_lease_deletes_no_remote_copy(
    engine: Engine, endpoint: str, s3: Any, tmp_path: Path
) -> None:
    # Given a photo uploaded by job A and an undo item claimed by a worker that then loses its lease
    # (frozen past it: the sweeper revoked it, another attempt holds a newer token)
    folder = tmp_path / "photos"
    generate_samples(folder, 1, seed=10, size=(64, 48))
    client = _client(engine, endpoint, s3.bucket)
    a = _upload(client, engine, folder)
    (key,) = _keys(s3)
    undo = client.undo(a, uploads=True)["job"]
    with Session(engine) as s:
        item = s.execute(select(Item).where(Item.job_id == undo)).scalar_one()
        s.expunge(item)
    spec = lane_spec("upload", env={})
    lease = store_items.claim(engine, spec, item.id, item.fencing_token, "frozen-worker").lease
    assert lease is not None
    with Session(engine) as s, s.begin():
        s.execute(update(Item).where(Item.id == item.id).values(fencing_token=Item.fencing_token + 1))
    # When the frozen worker resumes and runs the undo
    ctx = ItemContext(lease=lease, spec=spec, engine=engine, worker="frozen-worker")
    with pytest.raises(StaleLease):
        undoable(upload_photo)(ctx)
    # Then its fenced record before the delete is refused: the copy is still there, nothing logged
    assert _keys(s3) == [key] and effects_of(engine, undo) == []
    client.engine.dispose()


def test_an_upload_whose_killed_attempt_created_the_object_logs_it_as_created(
    engine: Engine, endpoint: str, s3: Any, tmp_path: Path
) -> None:
    # Given an upload item whose earlier attempt put the object (with its uploader metadata) and was
    # killed before its finish, and another photo whose object someone else had put there
    folder = tmp_path / "photos"
    mine, theirs = generate_samples(folder, 2, seed=11, size=(64, 48))
    client = _client(engine, endpoint, s3.bucket)
    job = client.submit(["upload"], [folder], {"upload.target_name": "backup"}).job_id
    with Session(engine) as s:
        query = select(Item.id, Photo.path).join(Photo, Photo.id == Item.photo_id).where(Item.job_id == job)
        rows = s.execute(query)
        ids = {Path(path).name: item for item, path in rows}
    for photo, meta in ((mine, {"photojobs-job": str(job), "photojobs-item": str(ids[mine.name])}),
                        (theirs, {})):  # fmt: skip
        sha = sha256_file(photo)
        s3.put_object(Bucket=s3.bucket, Key=f"shots/{sha[:2]}/{sha}.jpg", Body=photo.read_bytes(),
                      Metadata={**meta, "sha256": sha})  # fmt: skip
    # When the items run (the retry of the first finds its own object there)
    results = _run(engine, job)
    # Then both report it already present, but only the item's own object is logged as created
    assert [r["already_present"] for r in results if isinstance(r, dict)] == [True, True]
    created = {Path(e.from_path or "").name: (e.remote or {}).get("created") for e in effects_of(engine, job)}
    assert created == {mine.name: True, theirs.name: False}
    # and an undo with --uploads deletes the first and leaves the other in place
    assert all(isinstance(r, dict) for r in _run(engine, client.undo(job, uploads=True)["job"]))
    assert _keys(s3) == [f"shots/{sha256_file(theirs)[:2]}/{sha256_file(theirs)}.jpg"]
    client.engine.dispose()
