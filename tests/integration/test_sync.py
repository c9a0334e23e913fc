"""``photojobs sync`` against SQLite and PostgreSQL without workers: what it counts, which photos
its job names, what it reads and what it records (issue 38). The files are photo-named byte
strings: a sync never decodes a photo, it compares ``stat`` and content hashes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

import photojobs.sync as sync_module
from photojobs.api import Client
from photojobs.config import Settings
from photojobs.web import create_app
from store import jobs as store_jobs
from store.errors import SubmissionError
from store.intents import RECORDED
from store.models import Intent, Item, Job, Photo, PhotoFile
from tests.web_support import TOKEN

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def client(engine: Engine, redis_url: str) -> Client:
    env = {"PHOTOJOBS_DATABASE_URL": str(engine.url), "PHOTOJOBS_REDIS_URL": redis_url}
    return Client(Settings.from_env(env), engine, migrate=False)


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every file a sync reads to hash it (a descriptor), counted."""
    reads: list[int] = []
    real = sync_module._hash_fd

    def counting(fd: int) -> str:
        reads.append(fd)
        return real(fd)

    monkeypatch.setattr(sync_module, "_hash_fd", counting)
    return reads


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def library(root: Path, n: int = 5) -> list[Path]:
    return [write(root / f"IMG_{i:04d}.jpg", f"photo {i} " * 50) for i in range(n)]


def items(engine: Engine, job: int | None) -> dict[str, list[str]]:
    """The job's items: photo path -> its lanes."""
    if job is None:
        return {}
    with Session(engine) as s:
        rows = s.execute(
            select(Photo.path, Item.lane).join(Photo, Photo.id == Item.photo_id).where(Item.job_id == job)
        ).all()
    out: dict[str, list[str]] = {}
    for path, lane in rows:
        out.setdefault(path, []).append(lane)
    return out


def photo_ids(engine: Engine) -> dict[str, int]:
    with Session(engine) as s:
        return {p: i for i, p in s.execute(select(Photo.id, Photo.path))}


def counts(report: Any) -> dict[str, int]:
    d = report.as_dict()
    return {k: d[k] for k in ("new", "changed", "unchanged", "moved", "missing")}


def test_a_second_sync_of_an_unchanged_library_reads_no_file_and_makes_no_job(
    client: Client, engine: Engine, photos: Path, hashed: list[int]
) -> None:
    # Given a library synced once
    library(photos, 6)
    first = client.sync(["analysis"], [photos])
    assert counts(first) == {"new": 6, "changed": 0, "unchanged": 0, "moved": 0, "missing": 0}
    assert len(items(engine, first.job)) == 6 and len(hashed) == 6
    hashed.clear()
    # When it is synced again with nothing changed
    again = client.sync(["analysis"], [photos])
    # Then every photo is unchanged, no file was read and no job made
    assert counts(again) == {"new": 0, "changed": 0, "unchanged": 6, "moved": 0, "missing": 0}
    assert again.job is None and again.jobs == [] and hashed == []
    with Session(engine) as s:
        assert s.execute(select(Job.id)).scalars().all() == [first.job]


def test_add_change_move_and_delete_make_exactly_the_new_and_changed_items_and_the_moved_photo_keeps_its_id(
    client: Client, engine: Engine, photos: Path
) -> None:
    # Given a synced library
    files = library(photos, 5)
    client.sync(["analysis", "exif"], [photos])
    ids = photo_ids(engine)
    # When a photo is added, one edited, one moved into a new folder (a new name with a space and
    # an accent), one deleted
    added = write(photos / "new one.jpg", "a new photo")
    write(files[1], "edited content " * 60)
    moved = photos / "2024 été" / "renamed à la main.jpg"
    moved.parent.mkdir()
    os.rename(files[2], moved)
    files[3].unlink()
    report = client.sync(["analysis", "exif"], [photos])
    # Then the sync counts each, and its job names exactly the new and the changed photo
    assert counts(report) == {"new": 1, "changed": 1, "unchanged": 2, "moved": 1, "missing": 1}
    assert items(engine, report.job) == {
        str(added): ["analysis", "exif"],
        str(files[1]): ["analysis", "exif"],
    }
    # And the moved photo kept its id, now at its new path, with the move in its history
    after = photo_ids(engine)
    assert after[str(moved)] == ids[str(files[2])] and str(files[2]) not in after
    history = client.photo_history(str(moved))
    assert history["photo"] == ids[str(files[2])]
    assert [(e["kind"], e["from_path"], e["to_path"], e["job"]) for e in history["history"]] == [
        ("moved outside photojobs", str(files[2]), str(moved), None)
    ]
    # And the deleted photo is reported, never deleted from the store
    assert report.missing_paths == [str(files[3])] and str(files[3]) in after
    assert client.sync(["analysis", "exif"], [photos]).as_dict()["missing"] == 1


def test_a_photo_rewritten_in_place_with_the_same_size_and_inode_is_changed(
    client: Client, engine: Engine, photos: Path
) -> None:
    # Given a synced photo
    (photo, *_rest) = library(photos, 2)
    client.sync(["analysis"], [photos])
    before = os.stat(photo)
    # When a program rewrites bytes inside it: same size, same inode, only the mtime moves
    with open(photo, "r+b") as f:
        f.seek(10)
        f.write(b"XYZ")
    os.utime(photo, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    after = os.stat(photo)
    assert (after.st_size, after.st_ino) == (before.st_size, before.st_ino)
    report = client.sync(["analysis"], [photos])
    # Then the mtime alone sent the sync to the content, and the content decided: changed
    assert counts(report)["changed"] == 1 and list(items(engine, report.job)) == [str(photo)]


def test_a_file_replaced_by_one_of_identical_content_is_unchanged_and_read_only_once(
    client: Client, engine: Engine, photos: Path, hashed: list[int]
) -> None:
    # Given a synced photo replaced by a copy of itself (a new inode and mtime, the same bytes)
    (photo, *_rest) = library(photos, 2)
    client.sync(["analysis"], [photos])
    copy = write(photos / ".tmp-copy", photo.read_bytes())
    os.replace(copy, photo)
    hashed.clear()
    # When the library is synced twice
    first = client.sync(["analysis"], [photos])
    second = client.sync(["analysis"], [photos])
    # Then it is unchanged both times: read once (stat differed, the hash decided), then not at all
    assert counts(first)["unchanged"] == 2 and first.job is None
    assert counts(second)["unchanged"] == 2 and second.job is None
    assert len(hashed) == 1


def test_a_symlink_is_never_followed_and_a_hard_link_is_one_photo(
    client: Client, engine: Engine, photos: Path, tmp_path: Path
) -> None:
    # Given a library with a symlink to a folder outside it, a symlinked photo and a hard link
    outside = tmp_path / "outside"
    write(outside / "secret.jpg", "not in the roots")
    (photos / "link-out").symlink_to(outside, target_is_directory=True)
    (photo, *_rest) = library(photos, 2)
    (photos / "alias.jpg").symlink_to(photo)
    os.link(photo, photos / "IMG_hardlink.jpg")
    # When it is synced
    report = client.sync(["analysis"], [photos])
    # Then only the two photos are taken: nothing through a symlink, the hard link once
    assert sorted(items(engine, report.job)) == sorted(str(p) for p in library_paths(photos))
    assert report.skipped == {"hard link of another photo": 1, "symlink (never followed)": 2}
    assert not any("secret" in p for p in photo_ids(engine))


def library_paths(photos: Path) -> list[Path]:
    return [photos / "IMG_0000.jpg", photos / "IMG_0001.jpg"]


def test_a_sidecar_travels_with_its_photo_and_its_change_changes_the_photo(
    client: Client, engine: Engine, photos: Path
) -> None:
    # Given a raw with a darktable sidecar, a JPEG, a text file and a sidecar without its photo
    raw = write(photos / "DSC_0001.NEF", "raw bytes " * 100)
    sidecar = write(photos / "DSC_0001.NEF.xmp", "<x:xmpmeta>1</x:xmpmeta>")
    write(photos / "IMG_0001.jpg", "jpeg bytes")
    write(photos / "notes.txt", "not a photo")
    write(photos / "gone.xmp", "<x:xmpmeta/>")
    first = client.sync(["analysis"], [photos])
    # Then the sidecars are no photos of their own
    assert sorted(items(engine, first.job)) == [str(raw), str(photos / "IMG_0001.jpg")]
    assert first.skipped == {"not a photo": 1, "sidecar of a raw": 1, "sidecar without its photo": 1}
    # When only the raw's sidecar is edited (an editor wrote a rating)
    write(sidecar, "<x:xmpmeta>rating 5</x:xmpmeta>")
    edited = client.sync(["analysis"], [photos])
    # Then the raw is changed
    assert counts(edited)["changed"] == 1 and list(items(engine, edited.job)) == [str(raw)]
    # When the raw and its sidecar are moved together into a folder
    (photos / "2024").mkdir()
    os.rename(raw, photos / "2024" / "DSC_0001.NEF")
    os.rename(sidecar, photos / "2024" / "DSC_0001.NEF.xmp")
    moved = client.sync(["analysis"], [photos])
    # Then it is one move, and no new item
    assert counts(moved) == {"new": 0, "changed": 0, "unchanged": 1, "moved": 1, "missing": 0}
    assert moved.job is None


def test_two_copies_of_a_moved_photo_are_one_move_and_one_new_photo(
    client: Client, engine: Engine, photos: Path
) -> None:
    # Given a synced photo copied twice and then deleted (copied to two folders, then removed)
    (photo, *_rest) = library(photos, 2)
    client.sync(["analysis"], [photos])
    original = photo.read_bytes()
    write(photos / "a" / "first.jpg", original)
    write(photos / "b" / "second.jpg", original)
    photo.unlink()
    # When it is synced
    report = client.sync(["analysis"], [photos])
    # Then one copy is the photo moved, the other a new photo
    assert counts(report) == {"new": 1, "changed": 0, "unchanged": 1, "moved": 1, "missing": 0}
    assert list(items(engine, report.job)) == [str(photos / "b" / "second.jpg")]


def test_a_path_a_job_is_moving_a_photo_to_is_busy_not_a_new_photo(
    client: Client, engine: Engine, photos: Path
) -> None:
    # Given a synced photo whose rename a job recorded and applied but not yet marked
    (photo, *_rest) = library(photos, 2)
    client.sync(["rename"], [photos])
    target = photos / "renamed.jpg"
    os.link(photo, target)
    photo.unlink()
    with Session(engine) as s, s.begin():
        item = s.execute(select(Item).where(Item.lane == "rename")).scalars().first()
        assert item is not None
        s.add(Intent(item_id=item.id, token=0, photo_id=item.photo_id, kind="move", staged=str(target),
                     target=str(target), source=str(photo), state=RECORDED, created_at=0.0))  # fmt: skip
    # When the library is synced
    report = client.sync(["rename"], [photos])
    # Then the new path is busy: neither a new photo nor a move (the job's mark moves the row)
    assert report.busy == 1 and report.busy_paths == [str(target)]
    assert counts(report) == {"new": 0, "changed": 0, "unchanged": 1, "moved": 0, "missing": 1}
    assert str(target) not in photo_ids(engine)


def test_outdated_runs_a_lane_again_where_its_version_differs_or_its_item_was_cancelled(
    client: Client, engine: Engine, photos: Path
) -> None:
    # Given a library synced with exif keywords, its job then cancelled halfway
    files = library(photos, 4)
    first = client.sync(["analysis", "exif"], [photos], {"exif.keywords": "a"})
    assert first.job is not None
    photo = photo_ids(engine)[str(files[0])]
    with Session(engine) as s, s.begin():
        s.execute(
            update(Item)
            .where(Item.job_id == first.job, Item.photo_id == photo, Item.lane == "exif")
            .values(state="cancelled")
        )
    # When it is synced with --outdated and the same parameters
    same = client.sync(["analysis", "exif"], [photos], {"exif.keywords": "a"}, outdated=True)
    # Then only the cancelled exif item runs again
    assert same.outdated == 1 and items(engine, same.job) == {str(files[0]): ["exif"]}
    # When the exif parameters change
    other = client.sync(["analysis", "exif"], [photos], {"exif.keywords": "b"}, outdated=True)
    # Then exif runs again on every photo, analysis on none
    assert other.outdated == 4 and items(engine, other.job) == {str(f): ["exif"] for f in files}
    # And without --outdated nothing runs
    assert client.sync(["analysis", "exif"], [photos], {"exif.keywords": "c"}).job is None


def test_a_photo_submitted_before_is_adopted_by_its_first_sync(
    client: Client, engine: Engine, photos: Path
) -> None:
    # Given photos submitted (not synced), one of them analysed (its hash recorded)
    files = library(photos, 3)
    store_jobs.submit(engine, [client.specs["noop"]], [store_jobs.PhotoInput(str(f)) for f in files])
    from photos.fileops import sha256_file

    with Session(engine) as s, s.begin():
        s.execute(update(Photo).where(Photo.path == str(files[0])).values(sha256=sha256_file(files[0])))
    # When the folder is synced for the first time
    report = client.sync(["analysis"], [photos])
    # Then the analysed photo is unchanged (adopted), the others new to the sync, all on their rows
    assert counts(report) == {"new": 2, "changed": 0, "unchanged": 1, "moved": 0, "missing": 0}
    with Session(engine) as s:
        assert len(s.execute(select(PhotoFile.photo_id)).all()) == 3
        assert len(s.execute(select(Photo.id)).all()) == 3


def test_a_root_that_does_not_exist_is_a_clear_error_and_nothing_is_written(
    client: Client, engine: Engine, tmp_path: Path
) -> None:
    with pytest.raises(SubmissionError, match="nowhere: no such file or folder"):
        client.sync(["analysis"], [tmp_path / "nowhere"])
    with Session(engine) as s:
        assert s.execute(select(Job.id)).all() == []


@pytest.fixture
def http(client: Client, tmp_path: Path, photos: Path) -> Iterator[TestClient]:
    app = create_app(client, token=TOKEN, photo_roots=[photos], env=dict(client.settings.env))
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c


def test_the_sync_api_syncs_inside_the_photo_roots_and_refuses_outside(
    http: TestClient, engine: Engine, photos: Path, tmp_path: Path
) -> None:
    library(photos, 2)
    write(tmp_path / "elsewhere" / "x.jpg", "outside")
    r = http.post("/api/sync", json={"lanes": "analysis", "paths": [str(photos)]})
    assert r.status_code == 200, r.text
    assert {k: r.json()[k] for k in ("new", "unchanged")} == {"new": 2, "unchanged": 0}
    again = http.post("/api/sync", json={"lanes": "analysis", "paths": ["."]})  # relative: the first root
    assert again.status_code == 200 and again.json()["job"] is None and again.json()["unchanged"] == 2
    outside = http.post("/api/sync", json={"lanes": "analysis", "paths": [str(tmp_path / "elsewhere")]})
    assert outside.status_code == 403 and outside.json()["error"] == "outside_roots"
    (photos / "escape").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    through = http.post("/api/sync", json={"lanes": "analysis", "paths": [str(photos / "escape")]})
    assert through.status_code == 403
    missing = http.post("/api/sync", json={"lanes": "analysis", "paths": [str(photos / "nope")]})
    assert missing.status_code == 400 and "no such file or folder" in missing.json()["message"]
