"""The backup comes first, with real workers and moto's S3 on both stores: a photo whose edit is
refused is still uploaded and archived byte-identical, a raw nothing can decode is still renamed,
uploaded and archived, and a JPEG's Lightroom sidecar travels with it through exif, rename, upload
and archive (never reported as a sidecar without its photo)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.config import Settings
from photos.fileops import sha256_file
from photos.history import FOLDER as HISTORY  # kept originals (issue 31), not photos
from store.jobs import job_status
from store.models import Photo
from tests.raw_support import make_raw
from tests.support import AWS_TEST_ENV, Fleet, MotoServer, items_of, wait_job_done

from .test_raw_files import jpeg_with_time, sidecar_with


def test_a_refused_edit_and_an_undecodable_raw_are_still_backed_up(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    moto = MotoServer(tmp_path)
    endpoint = moto.start()
    try:
        env = {**env, **AWS_TEST_ENV}
        s3 = moto.s3_client("photos")
        # Given a JPEG with a Lightroom sidecar IMG_1.xmp, a truncated JPEG (an edit of it is
        # refused: it does not decode) and a raw with no preview that LibRaw cannot decode
        folder = tmp_path / "card"
        folder.mkdir()
        good = jpeg_with_time(folder / "IMG_1.jpg")
        sidecar = sidecar_with(folder / "IMG_1.xmp", "-XMP-xmp:Label=Red")
        whole = jpeg_with_time(tmp_path / "whole.jpg").read_bytes()
        broken = folder / "IMG_2.jpg"
        broken.write_bytes(whole[: len(whole) // 2])
        raw = make_raw(folder / "DSC_3.NEF", compression=65000)  # a codec this LibRaw does not know
        broken_sha, raw_sha = sha256_file(broken), sha256_file(raw)
        archive = tmp_path / "archive"
        params = {"exif.keywords": "trip", "upload.target": "s3://photos/backup", "upload.endpoint": endpoint,
                  "archive.root": str(archive)}  # fmt: skip
        lanes = ["analysis", "exif", "rename", "upload", "archive"]
        client = Client(Settings.from_env(env))
        submitted = client.submit(lanes, [folder], params)
        with Session(engine) as db:  # the photos by their names at submission (moves change paths)
            names = {pid: Path(path).name for pid, path in db.execute(select(Photo.id, Photo.path))}
        # When the job runs
        fleet.env = env
        fleet.start_sweeper()
        fleet.start_worker(lanes, threads=2)
        wait_job_done(engine, submitted.job_id, 180)
        # Then the sidecar was part of its photo's unit, and the job ends partial, the failures listed
        assert submitted.items == 3 * len(lanes)
        assert submitted.left_out == [{"path": str(sidecar), "reason": "sidecar of a photo"}]
        assert job_status(engine, submitted.job_id).state == "partial"
        states = {(names[i.photo_id], i.lane): i.state for i in items_of(engine, submitted.job_id)}
        assert {k: v for k, v in states.items() if k[0] == "IMG_2.jpg"} == {
            ("IMG_2.jpg", "analysis"): "failed", ("IMG_2.jpg", "exif"): "failed",
            ("IMG_2.jpg", "rename"): "skipped", ("IMG_2.jpg", "upload"): "succeeded",
            ("IMG_2.jpg", "archive"): "succeeded",
        }  # fmt: skip
        assert {k[1]: v for k, v in states.items() if k[0] == "DSC_3.NEF"} == {
            "analysis": "failed", "exif": "succeeded", "rename": "succeeded", "upload": "succeeded",
            "archive": "succeeded",
        }  # fmt: skip
        assert {v for k, v in states.items() if k[0] == "IMG_1.jpg"} == {"succeeded"}
        # and the refused photo and the raw were uploaded and archived byte-identical
        keys = {o["Key"] for o in s3.list_objects_v2(Bucket="photos", Prefix="backup/")["Contents"]}
        for sha, ext in ((broken_sha, ".jpg"), (raw_sha, ".nef")):
            key = f"backup/{sha[:2]}/{sha}{ext}"
            assert key in keys
            assert hashlib.sha256(s3.get_object(Bucket="photos", Key=key)["Body"].read()).hexdigest() == sha
        kept = [p for p in archive.rglob("*") if p.is_file() and HISTORY not in p.relative_to(archive).parts]
        archived = {p.name: p for p in kept}
        assert sha256_file(archived["IMG_2.jpg"]) == broken_sha
        [raw_name] = [n for n in archived if n.lower().endswith(".nef")]
        assert sha256_file(archived[raw_name]) == raw_sha and f"{raw_name}.xmp" in archived
        # and the JPEG's sidecar moved beside it through rename and archive (the renamed name), was
        # uploaded beside it, and nothing is left behind in the card folder
        [jpeg_name] = [n for n in archived if n.endswith(".jpg") and n != "IMG_2.jpg"]
        stem = jpeg_name[: -len(".jpg")]
        assert f"{stem}.xmp" in archived and archived[f"{stem}.xmp"].parent == archived[jpeg_name].parent
        assert "Red" in archived[f"{stem}.xmp"].read_text()
        assert any(k.endswith(".xmp") and not k.endswith(".nef.xmp") for k in keys)
        left = [p for p in folder.rglob("*") if HISTORY not in p.relative_to(folder).parts]
        assert not good.exists() and not sidecar.exists() and left == []
        client.engine.dispose()
    finally:
        moto.stop()
