"""Camera raws with real workers on both stores: analysed, never written (metadata in an XMP sidecar),
moved and uploaded together with their sidecars as one unit, a RAW+JPEG pair keeps its stem, and a
worker killed between the two moves of a unit is recovered to both moved."""

from __future__ import annotations

import hashlib
import json
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.config import Settings
from photos.fileops import sha256_file
from photos.history import FOLDER as HISTORY  # kept originals (issue 31), not photos
from photos.sidecar import read_sidecar
from store.models import Photo
from tests.process.test_run import Runs
from tests.raw_support import make_raw, preview_jpeg
from tests.support import (
    AWS_TEST_ENV,
    Fleet,
    MotoServer,
    items_of,
    photojobs,
    run_job,
    wait_for,
    wait_job_done,
)

TAKEN = "2021:07:04 18:30:05"


def jpeg_with_time(path: Path, taken: str = TAKEN) -> Path:
    img = Image.new("RGB", (160, 120), (30, 90, 200))
    exif = Image.Exif()
    exif[0x010F] = "NIKON CORPORATION"
    exif.get_ifd(0x8769)[0x9003] = taken
    img.save(path, "JPEG", exif=exif.tobytes())
    return path


def sidecar_with(path: Path, *args: str) -> Path:
    subprocess.run(["exiftool", "-q", "-o", str(path), *args], check=True)
    return path


def fingerprint(path: Path) -> tuple[str, int]:
    return sha256_file(path), path.stat().st_mtime_ns


def results(engine: Engine, job: int, lane: str) -> dict[str, dict]:
    with Session(engine) as s:
        paths = {p.id: p.path for p in s.execute(select(Photo)).scalars()}
    return {
        Path(paths[i.photo_id]).name: {"state": i.state, "result": i.result, "error": i.error}
        for i in items_of(engine, job)
        if i.lane == lane
    }


def names(folder: Path) -> list[str]:
    found = (p for p in folder.rglob("*") if p.is_file() and HISTORY not in p.parts)
    return sorted(str(p.relative_to(folder)) for p in found)


def test_analysis_and_exif_of_raws_write_only_sidecars(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given raws (one with a darktable sidecar holding a keyword and a label), a DNG without preview,
    # a garbage .NEF and a note
    folder = tmp_path / "shoot"
    folder.mkdir()
    nef = make_raw(folder / "DSC_0001.NEF", preview=preview_jpeg())
    sidecar_with(folder / "DSC_0001.NEF.xmp", "-XMP-dc:Subject=family", "-XMP-xmp:Label=Red")
    cr2 = make_raw(folder / "IMG_0002.CR2", make="Canon", model="Canon EOS 5D", preview=preview_jpeg())
    dng = make_raw(folder / "IMG_0003.dng", dng=True)
    broken = folder / "broken.NEF"
    broken.write_bytes(b"\x00 not a raw " * 100)
    (folder / "notes.txt").write_text("shot list")
    before = {p.name: fingerprint(p) for p in (nef, cr2, dng, broken)}
    client = Client(Settings.from_env(env))
    # When analysis and exif run over the folder
    submitted = client.submit(
        ["analysis", "exif"], [folder], {"exif.keywords": "beach,family", "exif.rating": "4"}
    )
    assert submitted.photos == 4 and submitted.skipped == {"not a photo": 1, "sidecar of a raw": 1}
    fleet.start_sweeper()
    fleet.start_worker(["analysis", "exif"], threads=2)
    wait_job_done(engine, submitted.job_id, 120)
    analysis = results(engine, submitted.job_id, "analysis")
    exif = results(engine, submitted.job_id, "exif")
    # Then the raws are analysed from their metadata and preview (the DNG through LibRaw)
    assert analysis["DSC_0001.NEF"]["result"]["model"] == "NIKON D750"
    assert analysis["IMG_0002.CR2"]["result"]["make"] == "Canon"
    assert analysis["DSC_0001.NEF"]["result"]["pixels_from"] == "ThumbnailImage"
    assert analysis["IMG_0003.dng"]["result"]["pixels_from"] == "libraw"
    # and the garbage raw failed analysis with the reason; its exif item ran all the same (exif
    # needs no analysis: a raw's metadata goes to its sidecar, no pixel of it is needed)
    assert analysis["broken.NEF"]["state"] == "failed"
    assert "no usable embedded preview" in analysis["broken.NEF"]["error"]
    assert exif["broken.NEF"]["state"] == "succeeded"
    # and every raw is byte-identical with the same modification time
    assert {p.name: fingerprint(p) for p in (nef, cr2, dng, broken)} == before
    # and the metadata is in sidecars: the existing one merged (its keyword and label kept), new ones made
    assert read_sidecar(folder / "DSC_0001.NEF.xmp")["keywords"] == ["family", "beach"]
    said = subprocess.run(
        ["exiftool", "-j", "-XMP-xmp:Label", str(folder / "DSC_0001.NEF.xmp")], capture_output=True, text=True
    )
    assert json.loads(said.stdout)[0]["Label"] == "Red"
    for name in ("DSC_0001.NEF.xmp", "IMG_0002.CR2.xmp", "IMG_0003.dng.xmp"):
        assert read_sidecar(folder / name)["rating"] == 4
        assert "beach" in read_sidecar(folder / name)["keywords"]
    assert exif["IMG_0002.CR2"]["result"]["sidecar"] == str(folder / "IMG_0002.CR2.xmp")
    assert names(folder) == sorted(
        ["DSC_0001.NEF", "DSC_0001.NEF.xmp", "IMG_0002.CR2", "IMG_0002.CR2.xmp", "IMG_0003.dng",
         "IMG_0003.dng.xmp", "broken.NEF", "broken.NEF.xmp", "notes.txt"]
    )  # fmt: skip
    client.engine.dispose()


def test_rename_moves_raw_and_sidecars_together_and_a_pair_keeps_its_stem(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a RAW+JPEG pair (same capture time), the raw with both kinds of sidecar, and a second raw
    folder = tmp_path / "shoot"
    folder.mkdir()
    raw = make_raw(folder / "IMG_0001.CR2", make="Canon", model="Canon EOS 5D", preview=preview_jpeg())
    jpeg_with_time(folder / "IMG_0001.JPG")
    sidecar_with(folder / "IMG_0001.CR2.xmp", "-XMP-dc:Subject=darktable")
    sidecar_with(folder / "IMG_0001.xmp", "-XMP-dc:Subject=lightroom")
    make_raw(folder / "IMG_0002.NEF", taken="2021:07:04 18:31:00", preview=preview_jpeg())
    raw_sha = sha256_file(raw)
    client = Client(Settings.from_env(env))
    # When they are renamed after their capture time
    job = run_job(
        client,
        engine,
        fleet,
        ["analysis", "rename"],
        folder,
        {"rename.pattern": "{taken:%Y%m%d_%H%M%S}{ext}"},
    )
    # Then the pair shares its new stem, the sidecars followed their raw, the raw's bytes are the same
    assert {i.state for i in items_of(engine, job)} == {"succeeded"}
    assert names(folder) == [
        "20210704_183005.cr2", "20210704_183005.cr2.xmp", "20210704_183005.jpg", "20210704_183005.xmp",
        "20210704_183100.nef",
    ]  # fmt: skip
    assert sha256_file(folder / "20210704_183005.cr2") == raw_sha
    assert read_sidecar(folder / "20210704_183005.cr2.xmp")["keywords"] == ["darktable"]
    assert read_sidecar(folder / "20210704_183005.xmp")["keywords"] == ["lightroom"]
    with Session(engine) as s:
        paths = sorted(Path(p.path).name for p in s.execute(select(Photo)).scalars())
    assert paths == ["20210704_183005.cr2", "20210704_183005.jpg", "20210704_183100.nef"]
    client.engine.dispose()


def test_archive_and_upload_take_the_sidecar_along(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a raw with a Lightroom sidecar
    folder = tmp_path / "shoot"
    folder.mkdir()
    raw = make_raw(folder / "DSC_0007.ARW", make="SONY", model="ILCE-7M3", preview=preview_jpeg())
    sidecar = sidecar_with(folder / "DSC_0007.xmp", "-XMP-dc:Subject=sony")
    raw_sha, side_sha = sha256_file(raw), sha256_file(sidecar)
    uploads, archive = tmp_path / "uploads", tmp_path / "archive"
    client = Client(Settings.from_env(env))
    # When it is uploaded, then archived
    params = {"upload.target": str(uploads), "upload.key": "{taken:%Y}/{name}", "archive.root": str(archive)}
    job = run_job(client, engine, fleet, ["analysis", "upload", "archive"], folder, params)
    # Then the upload holds the raw at its key and the sidecar next to it, named after the key
    assert {i.state for i in items_of(engine, job)} == {"succeeded"}, [i.error for i in items_of(engine, job)]
    assert names(uploads) == ["2021/DSC_0007.ARW", "2021/DSC_0007.xmp"]
    assert sha256_file(uploads / "2021/DSC_0007.ARW") == raw_sha
    assert sha256_file(uploads / "2021/DSC_0007.xmp") == side_sha
    # and the archive holds both, moved together, the folder left empty
    assert names(archive) == ["2021/2021-07-04/DSC_0007.ARW", "2021/2021-07-04/DSC_0007.xmp"]
    assert sha256_file(archive / "2021/2021-07-04/DSC_0007.ARW") == raw_sha
    assert sha256_file(archive / "2021/2021-07-04/DSC_0007.xmp") == side_sha
    assert names(folder) == []
    client.engine.dispose()


@pytest.mark.parametrize("boundary", ["after_apply", "between_unit_moves"])
def test_worker_killed_between_the_moves_of_a_raw_and_its_sidecar_recovers_both_moved(
    boundary: str, engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a raw with a sidecar, and a worker that kills itself right after the raw moved
    # (after_apply: moved, not yet marked; between_unit_moves: moved and marked, the sidecar not yet)
    folder = tmp_path / "shoot"
    folder.mkdir()
    raw = make_raw(folder / "IMG_0001.NEF", preview=preview_jpeg())
    sidecar = sidecar_with(folder / "IMG_0001.NEF.xmp", "-XMP-dc:Subject=keep")
    raw_sha, side_sha = sha256_file(raw), sha256_file(sidecar)
    client = Client(Settings.from_env(env))
    job = client.submit(["rename"], [folder], {"rename.pattern": "{taken:%Y%m%d_%H%M%S}{ext}"}).job_id
    fleet.start_sweeper()
    doomed = fleet.start_worker(["rename"], threads=1, env={"PHOTOJOBS_FAILPOINTS": f"rename.{boundary}"})
    wait_for(lambda: doomed.poll() is not None, 60, what=f"the worker to die at rename.{boundary}")
    # the raw moved and its sidecar did not: the unit is half moved when the worker dies
    assert (folder / "20210704_183005.nef").exists() and sidecar.exists()
    # When a healthy worker takes over
    fleet.start_worker(["rename"], threads=1)
    wait_job_done(engine, job, 90)
    # Then both moved, exactly once, bytes unchanged, no staged file left, the store follows the raw
    assert [i.state for i in items_of(engine, job)] == ["succeeded"]
    assert names(folder) == ["20210704_183005.nef", "20210704_183005.nef.xmp"]
    assert sha256_file(folder / "20210704_183005.nef") == raw_sha
    assert sha256_file(folder / "20210704_183005.nef.xmp") == side_sha
    with Session(engine) as s:
        assert [p.path for p in s.execute(select(Photo)).scalars()] == [str(folder / "20210704_183005.nef")]
    client.engine.dispose()


def test_an_upload_killed_after_only_its_sidecar_was_published_reports_the_photo_not_the_sidecar(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a raw with a sidecar whose upload target holds the raw already (another job put the same
    # bytes there) but not the sidecar, and a worker that kills itself right after it published the
    # sidecar — the unit's only file to publish — before it marked it
    folder, uploads = tmp_path / "shoot", tmp_path / "uploads"
    folder.mkdir()
    uploads.mkdir()
    raw = make_raw(folder / "IMG_0001.NEF", preview=preview_jpeg())
    sidecar = sidecar_with(folder / "IMG_0001.NEF.xmp", "-XMP-dc:Subject=keep")
    (uploads / "IMG_0001.NEF").write_bytes(raw.read_bytes())
    client = Client(Settings.from_env(env))
    job = client.submit(["upload"], [folder], {"upload.target": str(uploads), "upload.key": "{name}"}).job_id
    fleet.start_sweeper()
    doomed = fleet.start_worker(["upload"], threads=1, env={"PHOTOJOBS_FAILPOINTS": "upload.after_apply"})
    wait_for(lambda: doomed.poll() is not None, 60, what="the worker to die after publishing the sidecar")
    assert names(uploads) == ["IMG_0001.NEF", "IMG_0001.NEF.xmp"]
    # When a healthy worker takes over (the next attempt recovers the sidecar's publish)
    fleet.start_worker(["upload"], threads=1)
    wait_job_done(engine, job, 90)
    # Then the item succeeded and its result names the raw's upload, not the sidecar's
    [item] = items_of(engine, job)
    assert item.state == "succeeded", item.error
    where = item.result.get("location", item.result.get("target"))
    assert where == str(uploads / "IMG_0001.NEF"), item.result
    assert sha256_file(uploads / "IMG_0001.NEF.xmp") == sha256_file(sidecar)
    client.engine.dispose()


def test_a_cancelled_rename_killed_between_the_moves_is_settled_both_moved_by_the_sweeper(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a raw with a sidecar whose rename worker died right after the raw moved
    folder = tmp_path / "shoot"
    folder.mkdir()
    make_raw(folder / "IMG_0001.NEF", preview=preview_jpeg())
    sidecar_with(folder / "IMG_0001.NEF.xmp", "-XMP-dc:Subject=keep")
    client = Client(Settings.from_env(env))
    job = client.submit(["rename"], [folder], {"rename.pattern": "{taken:%Y%m%d_%H%M%S}{ext}"}).job_id
    fleet.start_sweeper()
    doomed = fleet.start_worker(
        ["rename"], threads=1, env={"PHOTOJOBS_FAILPOINTS": "rename.between_unit_moves"}
    )
    wait_for(lambda: doomed.poll() is not None, 60, what="the worker to die between the moves")
    # When the job is cancelled (no worker comes back for the item: the sweeper settles its intents)
    client.cancel(job)
    wait_job_done(engine, job, 90)
    # Then the sweeper finished the sidecar's move instead of splitting the unit
    wait_for(lambda: names(folder) == ["20210704_183005.nef", "20210704_183005.nef.xmp"], 60,
             what="the sweeper to settle the sidecar's move")  # fmt: skip
    client.engine.dispose()


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Runs]:
    started = Runs(tmp_path)
    try:
        yield started
    finally:
        started.cleanup()


def test_submit_and_run_say_what_a_folder_scan_left_out(
    env: dict[str, str], runs: Runs, tmp_path: Path
) -> None:
    # Given a folder with a raw and its sidecar, a JPEG, a note, a hidden file and a hidden folder
    folder = tmp_path / "shoot"
    folder.mkdir()
    make_raw(folder / "IMG_0001.RW2", make="Panasonic", model="DC-G9", preview=preview_jpeg())
    sidecar_with(folder / "IMG_0001.RW2.xmp", "-XMP-dc:Subject=x")
    jpeg_with_time(folder / "IMG_0002.jpg")
    (folder / "notes.txt").write_text("n")
    (folder / ".hidden.jpg").write_bytes(b"x")
    (folder / ".cache").mkdir()
    expected = {"hidden file": 1, "hidden folder": 1, "not a photo": 1, "sidecar of a raw": 1}
    # When it is submitted with the CLI (--json, and plain), and run with photojobs run --json
    as_json = photojobs(env, "submit", "--lanes", "analysis", "--json", str(folder))
    plain = photojobs(env, "submit", "--lanes", "noop", str(folder / "IMG_0001.RW2"), str(folder))
    run = runs.start(folder, "--workers", "1", "--json", lanes="analysis")
    # Then each says how many photos it took and what it left out, by reason
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["items"] == 2 and json.loads(as_json.stdout)["skipped"] == expected
    assert plain.returncode == 0 and plain.stdout.strip().isdigit()
    assert "left out: 1 hidden file, 1 hidden folder" in plain.stderr
    assert run.wait() == 0, run.logs()
    summary = run.summary()
    assert summary["skipped_files"] == expected and summary["lanes"]["analysis"]["succeeded"] == 2
    # and each names every file it left out, with its reason (not only the counts)
    named = [
        {"path": str(folder / ".cache"), "reason": "hidden folder"},
        {"path": str(folder / ".hidden.jpg"), "reason": "hidden file"},
        {"path": str(folder / "IMG_0001.RW2.xmp"), "reason": "sidecar of a raw"},
        {"path": str(folder / "notes.txt"), "reason": "not a photo"},
    ]
    assert json.loads(as_json.stdout)["left_out"] == named and summary["left_out_files"] == named
    assert f"  {folder / '.hidden.jpg'}: hidden file" in plain.stderr.splitlines()


def test_s3_upload_puts_the_sidecar_next_to_the_raw_key_and_a_bundle_holds_it(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a real S3-compatible server (moto) with a bucket, and a raw with its darktable sidecar
    moto = MotoServer(tmp_path)
    endpoint = moto.start()
    try:
        env = {**env, **AWS_TEST_ENV}
        s3 = moto.s3_client("photos")
        folder = tmp_path / "shoot"
        folder.mkdir()
        raw = make_raw(folder / "P1000001.RW2", make="Panasonic", model="DC-G9", preview=preview_jpeg())
        sidecar = sidecar_with(folder / "P1000001.RW2.xmp", "-XMP-dc:Subject=lumix")
        raw_sha, side_sha = sha256_file(raw), sha256_file(sidecar)
        client = Client(Settings.from_env(env))
        params = {"upload.target": "s3://photos/backup", "upload.endpoint": endpoint}
        # When the folder is uploaded (twice), and archived as a zip bundle
        first = client.submit(["upload"], [folder], params).job_id
        fleet.env = env
        fleet.start_sweeper()
        fleet.start_worker(["upload", "archive"], threads=2)
        wait_job_done(engine, first, 120)
        second = client.submit(["upload"], [folder], params).job_id
        wait_job_done(engine, second, 120)
        bundle_job = client.submit(
            ["archive"], [folder], {"archive.bundle": "zip", "archive.root": str(tmp_path / "a")}
        )
        wait_job_done(engine, bundle_job.job_id, 120)
        # Then the raw is at its content-addressed key and its sidecar at that key + .xmp, same bytes
        keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="photos", Prefix="backup/")["Contents"])
        raw_key = f"backup/{raw_sha[:2]}/{raw_sha}.rw2"
        assert keys == [raw_key, raw_key + ".xmp"]
        body = s3.get_object(Bucket="photos", Key=raw_key + ".xmp")["Body"].read()
        assert hashlib.sha256(body).hexdigest() == side_sha
        # and the repeat found both there; the bundle holds the raw and its sidecar under its name
        assert [i.state for i in items_of(engine, second)] == ["succeeded"]
        assert items_of(engine, second)[0].result["already_present"] is True
        (bundle,) = (tmp_path / "a").glob("*.zip")
        with zipfile.ZipFile(bundle) as z:
            names_in = sorted(z.namelist())
        assert [n.split("_", 1)[-1] for n in names_in if n != "MANIFEST.json"] == [
            "P1000001.RW2",
            "P1000001.RW2.xmp",
        ]
        client.engine.dispose()
    finally:
        moto.stop()


@pytest.mark.parametrize("boundary", ["after_record", "after_apply"])
def test_a_worker_killed_writing_a_raws_sidecar_shifts_its_time_exactly_once(
    boundary: str, engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a raw taken 18:30:05 with a sidecar, and a worker that kills itself at a step of the edit
    folder = tmp_path / "shoot"
    folder.mkdir()
    raw = make_raw(folder / "IMG_0001.NEF", preview=preview_jpeg())
    sidecar_with(folder / "IMG_0001.NEF.xmp", "-XMP-dc:Subject=keep")
    before = fingerprint(raw)
    client = Client(Settings.from_env(env))
    job = client.submit(["exif"], [folder], {"exif.shift": "+1h", "exif.keywords": "late"}).job_id
    fleet.start_sweeper()
    doomed = fleet.start_worker(["exif"], threads=1, env={"PHOTOJOBS_FAILPOINTS": f"exif.{boundary}"})
    wait_for(lambda: doomed.poll() is not None, 60, what=f"the worker to die at exif.{boundary}")
    # When a healthy worker takes over
    fleet.start_worker(["exif"], threads=1)
    wait_job_done(engine, job, 90)
    # Then the sidecar was shifted once, its keyword kept and the new one added, the raw untouched
    assert [i.state for i in items_of(engine, job)] == ["succeeded"]
    meta = read_sidecar(folder / "IMG_0001.NEF.xmp")
    assert meta["taken"] == "2021-07-04T19:30:05" and meta["keywords"] == ["keep", "late"]
    assert fingerprint(raw) == before
    assert names(folder) == ["IMG_0001.NEF", "IMG_0001.NEF.xmp"]
    client.engine.dispose()
