"""The file model of the photo chaos run can fail: each kind of damage it must see, made by hand."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import Engine, insert, select, update
from sqlalchemy.orm import Session

from photojobs.testing.samples import generate_samples
from store import jobs as store_jobs
from store.lanes import lane_spec
from store.models import Intent, Item, Photo
from tests.chaos.photo_harness import minimums
from tests.chaos.photo_model import check_files, take_baseline
from tests.raw_support import make_raw, make_xmp_sidecar, preview_jpeg


def _setup(engine: Engine, tmp_path: Path, params: dict[str, object]) -> tuple[Path, dict, int, int]:
    """Two real photos, a one-item-per-photo exif job over them; (folder, baseline, photo, item)."""
    folder = tmp_path / "photos"
    made = generate_samples(folder, 2, seed=5, size=(64, 48))
    before = take_baseline(made)
    job = store_jobs.submit(
        engine,
        [lane_spec("exif", env={})],
        [store_jobs.PhotoInput(str(p), None) for p in made],
        params=params,
    ).job_id
    with Session(engine) as s, s.begin():
        ids = dict(s.execute(select(Photo.path, Photo.id)).all())
        s.execute(update(Item).where(Item.job_id == job).values(state="succeeded"))
        item = s.execute(select(Item.id).where(Item.photo_id == ids[str(made[0])])).scalar_one()
    baseline = {ids[str(p)]: before[str(p)] for p in made}
    return folder, baseline, ids[str(made[0])], item


def _intent(engine: Engine, item: int, photo: int, target: Path, state: str) -> None:
    with Session(engine) as s, s.begin():
        s.execute(
            insert(Intent).values(
                item_id=item,
                token=1,
                photo_id=photo,
                kind="replace",
                staged=f"{target}.staged",
                target=str(target),
                source=str(target),
                result_sha256=None,
                state=state,
                created_at=0.0,
            )
        )


def _check(engine: Engine, folder: Path, baseline: dict) -> list[str]:
    with Session(engine) as s:
        jobs = sorted(set(s.execute(select(Item.job_id)).scalars()))
    return check_files(
        engine, baseline=baseline, folders=[folder], uploads=folder.parent / "up", records=[], job_ids=jobs
    ).violations


def _shift(path: Path, hours: int) -> None:
    subprocess.run(
        ["exiftool", "-q", "-overwrite_original", "-P", f"-ExifIFD:DateTimeOriginal+={hours}", str(path)],
        check=True,
    )


def test_a_shift_applied_once_per_applied_intent_passes_and_a_double_shift_fails(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a shift job whose item applied its intent, and the photo shifted by one hour
    folder, baseline, photo, item = _setup(engine, tmp_path, {"exif.shift": "+1h"})
    path = Path(baseline[photo].path)
    _intent(engine, item, photo, path, "applied")
    with Session(engine) as s, s.begin():  # the other photo's item applied nothing: it must not succeed
        s.execute(update(Item).where(Item.id != item).values(state="cancelled"))
    _shift(path, 1)
    # When the files are checked, Then all is well
    assert _check(engine, folder, baseline) == []
    # When the photo is shifted once more (a second application of the same edit)
    _shift(path, 1)
    # Then the checker reports the shift landed twice
    found = _check(engine, folder, baseline)
    assert len(found) == 1 and "DateTimeOriginal" in found[0] and "landed 2:00:00" in found[0], found


def test_duplicates_missing_photos_staged_files_and_orphaned_intents_are_reported(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a keywords job whose first item is cancelled with its intent still recorded
    folder, baseline, photo, item = _setup(engine, tmp_path, {"exif.keywords": "a,b"})
    path = Path(baseline[photo].path)
    _intent(engine, item, photo, path, "recorded")
    with Session(engine) as s, s.begin():
        s.execute(update(Item).where(Item.id == item).values(state="cancelled"))
        s.execute(update(Item).where(Item.id != item).values(state="cancelled"))
    # And a copy of the photo at its old name (a resurrected file), a staged file left behind, and
    # the other photo gone
    shutil.copy2(path, folder / "resurrected.jpg")
    (folder / f".{path.name}.pj-i9-t1.tmp").write_bytes(b"x")
    other = next(p for p in baseline if p != photo)
    Path(baseline[other].path).unlink()
    # When the files are checked
    found = "\n".join(_check(engine, folder, baseline))
    # Then each is reported
    assert "exists 2 times" in found and "resurrected.jpg" in found
    assert "staged/temp file left behind" in found
    assert f"photo {other}: missing" in found
    assert "orphaned intent" in found


def _exiftool(path: Path, *args: str) -> None:
    subprocess.run(["exiftool", "-q", "-overwrite_original", "-P", *args, str(path)], check=True)


def test_keywords_must_be_where_photo_apps_read_them_and_other_tags_stay(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a keywords job whose item applied its edit, the keywords written only as XPKeywords
    folder, baseline, photo, item = _setup(engine, tmp_path, {"exif.keywords": "sea,sun"})
    path = Path(baseline[photo].path)
    _intent(engine, item, photo, path, "applied")
    with Session(engine) as s, s.begin():
        s.execute(update(Item).where(Item.id != item).values(state="cancelled"))
    _exiftool(path, "-XPKeywords=sea;sun")
    # When the files are checked, Then the keywords are reported invisible
    found = _check(engine, folder, baseline)
    assert len(found) == 1 and "not visible as XMP-dc:Subject or IPTC:Keywords" in found[0], found
    # When they are written as XMP dc:subject too, Then all is well
    _exiftool(path, "-XMP-dc:Subject=sea", "-XMP-dc:Subject=sun")
    assert _check(engine, folder, baseline) == []
    # When a tag nobody asked to change is rewritten and the file time moves
    _exiftool(path, "-ExifIFD:UserComment=analysis results")
    os.utime(path, ns=(baseline[photo].mtime_ns, baseline[photo].mtime_ns + 5_000_000_000))
    # Then both are reported
    found = "\n".join(_check(engine, folder, baseline))
    assert "untouched tag ExifIFD:UserComment changed" in found and "modification time changed" in found, (
        found
    )


def _setup_raw(engine: Engine, tmp_path: Path, params: dict[str, object]) -> tuple[Path, dict, int, Path]:
    """A real raw with an editor's Lightroom-style sidecar (``NAME.xmp``: rating, label, description,
    a keyword) and an exif job over it whose item applied its edit; (folder, baseline, photo, sidecar)."""
    folder = tmp_path / "photos"
    folder.mkdir()
    raw = make_raw(folder / "_DSC0300.ARW", preview=preview_jpeg((80, 60)))
    side = make_xmp_sidecar(
        folder / "_DSC0300.xmp", keywords=("own",), rating=2, description="x", label="Red"
    )
    before = take_baseline([raw])
    job = store_jobs.submit(
        engine, [lane_spec("exif", env={})], [store_jobs.PhotoInput(str(raw), None)], params=params
    ).job_id
    with Session(engine) as s, s.begin():
        s.execute(update(Item).where(Item.job_id == job).values(state="succeeded"))
        photo, item = s.execute(select(Item.photo_id, Item.id).where(Item.job_id == job)).one()
    _intent(engine, item, photo, side, "applied")
    return folder, {photo: before[str(raw)]}, photo, side


def test_a_raw_moves_with_its_sidecar_and_one_left_behind_or_missing_is_reported(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a raw whose keywords edit landed in its sidecar
    folder, baseline, photo, side = _setup_raw(engine, tmp_path, {"exif.keywords": "sea"})
    _exiftool(side, "-XMP-dc:Subject+=sea")
    # And the raw and its sidecar moved together to a new name in another folder (the store follows)
    raw = Path(baseline[photo].path)
    (folder / "2020").mkdir()
    raw.rename(folder / "2020" / "renamed.ARW")
    side.rename(folder / "2020" / "renamed.xmp")
    with Session(engine) as s, s.begin():
        s.execute(update(Photo).where(Photo.id == photo).values(path=str(folder / "2020" / "renamed.ARW")))
    # When the files are checked, Then all is well
    assert _check(engine, folder, baseline) == []
    # When a copy of the sidecar is left at the raw's old location
    shutil.copy2(folder / "2020" / "renamed.xmp", side)
    # Then it is reported as an orphan
    found = _check(engine, folder, baseline)
    assert len(found) == 1 and found[0].startswith(f"orphan sidecar {side}"), found
    # When the moved sidecar is gone (the move left it behind)
    (folder / "2020" / "renamed.xmp").unlink()
    # Then the raw's sidecar is reported missing beside it
    found = "\n".join(_check(engine, folder, baseline))
    assert f"raw {photo}" in found and "sidecar missing, expected" in found and "renamed.xmp" in found, found


def test_a_written_raw_a_sidecar_shift_twice_a_keyword_twice_and_lost_content_are_reported(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a raw whose shift edit (+1h) landed once in its sidecar's exif:DateTimeOriginal
    folder, baseline, photo, side = _setup_raw(engine, tmp_path, {"exif.shift": "+1h"})
    _exiftool(side, "-XMP-exif:DateTimeOriginal=2021:07:04 19:30:05")
    # When the files are checked, Then all is well
    assert _check(engine, folder, baseline) == []
    # When the shift lands a second time, a keyword is written twice and the editor's rating is lost
    _exiftool(
        side, "-XMP-exif:DateTimeOriginal=2021:07:04 20:30:05", "-XMP-dc:Subject+=own", "-XMP-xmp:Rating="
    )
    # Then each is reported
    found = "\n".join(_check(engine, folder, baseline))
    assert "DateTimeOriginal 2021:07:04 20:30:05, expected 2021:07:04 19:30:05" in found, found
    assert "keyword(s) ['own'] written more than once" in found, found
    assert "lost its own content: XMP-xmp:Rating" in found, found
    # When the raw itself is written (its metadata, not its sidecar)
    _exiftool(Path(baseline[photo].path), "-XMP-dc:Subject=raw")
    # Then it no longer counts as the photo: its bytes changed
    found = "\n".join(_check(engine, folder, baseline))
    assert "raw bytes changed" in found and f"photo {photo}: missing" in found, found


def test_an_uploaded_raw_must_be_byte_identical_and_its_uploaded_sidecar_there(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a raw with its sidecar, and a succeeded upload item whose result names the raw's copy
    # and the sidecar's copy in the uploads folder
    folder = tmp_path / "photos"
    folder.mkdir()
    raw = make_raw(folder / "IMG_0200.CR2", preview=preview_jpeg((80, 60)))
    side = make_xmp_sidecar(folder / "IMG_0200.CR2.xmp", keywords=("own",), rating=1)
    before = take_baseline([raw])
    job = store_jobs.submit(
        engine,
        [lane_spec("upload", env={})],
        [store_jobs.PhotoInput(str(raw), None)],
        params={"upload.target": str(tmp_path / "up")},
    ).job_id
    up = tmp_path / "up" / "ab"
    up.mkdir(parents=True)
    copy, side_copy = up / "KEY.CR2", up / "KEY.CR2.xmp"
    shutil.copy2(raw, copy)
    shutil.copy2(side, side_copy)
    result = {"location": str(copy), "sha256": before[str(raw)].sha256, "sidecars": [str(side_copy)]}
    with Session(engine) as s, s.begin():
        s.execute(update(Item).where(Item.job_id == job).values(state="succeeded", result=result))
        photo = s.execute(select(Item.photo_id).where(Item.job_id == job)).scalar_one()
    baseline = {photo: before[str(raw)]}
    # When the files are checked, Then all is well
    assert _check(engine, folder, baseline) == []
    # When the uploaded sidecar is gone and the uploaded raw's bytes differ (its metadata written)
    side_copy.unlink()
    _exiftool(copy, "-XMP-dc:Subject=raw")
    # Then both are reported
    found = "\n".join(_check(engine, folder, baseline))
    assert f"the sidecar {side_copy} it uploaded with {copy} is missing" in found, found
    assert "does not hold the bytes it uploaded" in found, found
    assert f"uploaded file {copy} holds none" in found, found


def test_minimums_scale_with_the_run_and_can_be_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the per-minute minimums, When a 5-minute run asks for its minimums
    monkeypatch.delenv("PHOTOJOBS_CHAOS_MINIMUMS", raising=False)
    long = minimums(300)
    # Then they scale (>= 1,000 items) and none is below one
    assert long["items"] >= 1000 and long["lease_expired"] == 20 and min(minimums(10).values()) == 1
    # When the environment overrides one, Then it wins
    monkeypatch.setenv("PHOTOJOBS_CHAOS_MINIMUMS", "stale_commit_rejected=7")
    assert minimums(300)["stale_commit_rejected"] == 7
