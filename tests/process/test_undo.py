"""History and undo through real workers (issue 31), on both stores: one scenario per store.

A shift + rename job on 24 photos, one photo edited by hand afterwards; ``photojobs undo`` with a
worker SIGKILLed in the middle of an undo effect; a second undo; the undo undone (a redo); a raw
with its XMP sidecar archived, then undone, uploaded to a folder and to S3 (moto), then undone
without and with ``--uploads`` (a later job's upload of the same keys refusing the earlier undo).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from sqlalchemy import Engine

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.testing.samples import generate_samples
from photos.exiftool import ExifTool
from photos.fileops import sha256_file
from photos.history import FOLDER as HISTORY
from store.history import effects_of
from store.status import job_status
from tests.raw_support import make_raw, make_xmp_sidecar, preview_jpeg
from tests.support import (
    AWS_TEST_ENV,
    Fleet,
    MotoServer,
    events_of,
    item_states,
    items_of,
    job_done,
    photojobs,
    wait_for,
)

from .test_file_effects import all_files, store_paths_match_disk, temp_files

PARAMS = {"exif.shift": "+1h", "rename.pattern": "{taken:%Y%m%d_%H%M%S}_{stem}{ext}"}


def tree(folder: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under ``folder`` but the history store."""
    return {str(p.relative_to(folder)): sha256_file(p) for p in all_files(folder)}


def cli_json(env: dict[str, str], *args: str) -> dict:
    done = photojobs(env, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def wait_job(engine: Engine, job: int) -> str:
    wait_for(lambda: job_done(engine, job), 240, what=f"job {job} to finish: {item_states(engine, job)}")
    return job_status(engine, job).state


def test_undo_of_a_shift_and_rename_puts_23_photos_back_and_refuses_the_one_edited_since(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given 24 photos shifted by an hour and renamed after their new time by one job
    folder = tmp_path / "photos"
    generate_samples(folder, 24, seed=31, size=(160, 120))
    originals = tree(folder)
    client = Client(Settings.from_env(env))
    fleet.start_sweeper()
    fleet.start_worker(["exif", "rename", "archive"], threads=2)
    job = client.submit(["exif", "rename"], [folder], PARAMS).job_id
    assert wait_job(engine, job) == "succeeded"
    after_job = tree(folder)
    assert set(after_job).isdisjoint(originals)
    # and one renamed photo edited by hand afterwards (outside photojobs)
    edited = folder / sorted(after_job)[5]
    ExifTool.shared().execute("-Rating=3", "-overwrite_original", os.path.abspath(edited))
    edited_sha = sha256_file(edited)
    # When the job is undone and the worker running it is SIGKILLed between moving a photo back and
    # marking it (then a healthy worker takes over)
    doomed = fleet.start_worker(
        ["exif", "rename"], threads=1, env={"PHOTOJOBS_FAILPOINTS": "undo.rename.after_apply"}
    )
    undo = cli_json(env, "undo", str(job))
    assert undo["items"] == 48
    wait_for(lambda: doomed.poll() is not None, 120, what="the undoing worker to be killed mid-effect")
    state = wait_job(engine, undo["job"])
    # Then the 23 others are back at their original paths, byte for byte, and the edited one is
    # untouched, its item failed "changed since … outside photojobs" and the job partial
    now = tree(folder)
    assert state == "partial"
    assert {k: v for k, v in now.items() if k != edited.name} == {
        k: v for k, v in originals.items() if k in now and k != edited.name
    }
    assert len(now) == 24 and now[edited.name] == edited_sha
    failed = [i for i in items_of(engine, undo["job"]) if i.state != "succeeded"]
    # (each lane of the undo refuses it on its own, store.pipeline.NEEDS: the rename's undo for the
    # hand edit, then the edit's undo for the rename it finds not undone)
    assert sorted((i.lane, i.state) for i in failed) == [("exif", "failed"), ("rename", "failed")]
    reasons = {i.lane: i.error or "" for i in failed}
    assert f"changed since job {job} outside photojobs" in reasons["rename"]
    assert edited.name in reasons["rename"]
    assert f"changed since job {job} by job {job}'s rename (undo it first" in reasons["exif"], reasons["exif"]
    assert temp_files(folder) == []
    store_paths_match_disk(engine)
    # and the history of a photo names both effects with hashes, the time before/after and the undo
    name = sorted(originals)[0]
    story = cli_json(env, "history", str(folder / name))
    assert story["path"] == str(folder / name)
    ours = [e for e in story["history"] if e["job"] == job]
    assert [e["kind"] for e in ours] == ["metadata edit", "rename"]
    edit, rename = ours
    assert edit["before_sha256"] == originals[name] and edit["after_sha256"] == rename["before_sha256"]
    assert rename["from_path"] == str(folder / name) and rename["to_path"] != rename["from_path"]
    before, after = edit["changes"]["EXIF:DateTimeOriginal"]
    assert before < after  # "2024:…:10:00:00" -> an hour later
    assert edit["undone_by"] == rename["undone_by"] == undo["job"]
    undos = [e for e in story["history"] if e["job"] == undo["job"]]
    assert [e["kind"] for e in undos] == ["move", "metadata edit"]
    assert undos[1]["after_sha256"] == originals[name] and undos[1]["changes"]["EXIF:DateTimeOriginal"] == [
        after,
        before,
    ]
    # When the job is undone a second time
    again = cli_json(env, "undo", str(job))
    if again["job"] is not None:
        wait_job(engine, again["job"])
    # Then nothing changes (only the edited photo was left, and it is refused again)
    assert tree(folder) == now
    # When the undo is undone (a redo)
    redo = cli_json(env, "undo", str(undo["job"]))
    assert wait_job(engine, redo["job"]) == "succeeded"
    # Then the 23 photos are as the job left them, byte for byte, and the edited one untouched
    assert tree(folder) == {**after_job, edited.name: edited_sha}
    store_paths_match_disk(engine)
    # and the kept originals are hard links (no copy) in the root's history store
    assert (folder / HISTORY).is_dir()
    client.engine.dispose()


def test_a_raw_and_its_sidecar_archived_or_uploaded_then_undone_come_back_together(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    moto = MotoServer(tmp_path)
    try:
        moto.start()
        _raw_and_sidecar_archived_uploaded_and_undone(engine, env, fleet, tmp_path, moto)
    finally:
        moto.stop()


def _raw_and_sidecar_archived_uploaded_and_undone(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path, moto: MotoServer
) -> None:
    # Given a raw with its XMP sidecar, archived (and an S3 target the operator named "backup")
    folder = tmp_path / "photos"
    folder.mkdir()
    raw = make_raw(folder / "IMG_0001.CR2", make="Canon", model="Canon EOS 5D", preview=preview_jpeg())
    make_xmp_sidecar(folder / "IMG_0001.xmp", keywords=("dog",), rating=2)
    before = tree(folder)
    env = {**env, **AWS_TEST_ENV, "PHOTOJOBS_UPLOAD_TARGETS": f"backup=s3://photos/shots@{moto.endpoint}"}
    s3 = moto.s3_client("photos")
    fleet.env = env
    client = Client(Settings.from_env(env))
    fleet.start_sweeper()
    worker = fleet.start_worker(["archive", "upload"], threads=2)
    job = client.submit(["archive"], [folder], {}).job_id
    assert wait_job(engine, job) == "succeeded"
    archive = Path(f"{folder}-archive")
    assert tree(folder) == {} and len(tree(archive)) == 2
    # When the archive is undone
    undo = client.undo(job)
    assert undo["items"] == 1
    assert wait_job(engine, undo["job"]) == "succeeded"
    # Then the raw and its sidecar are back where they were, byte for byte, the archive empty
    assert tree(folder) == before and tree(archive) == {}
    store_paths_match_disk(engine)
    story = client.photo_history(str(raw))
    kinds = [(e["job"], e["kind"], e["sidecar"], e["undone_by"]) for e in story["history"]]
    assert kinds == [
        (job, "archive", False, undo["job"]),
        (job, "archive", True, undo["job"]),
        (undo["job"], "move", False, None),
        (undo["job"], "move", True, None),
    ]
    # When the raw and its sidecar are uploaded to a local folder, then undone with and without --uploads
    uploads = tmp_path / "uploads"
    sent = client.submit(["upload"], [folder], {"upload.target": str(uploads)}).job_id
    assert wait_job(engine, sent) == "succeeded"
    copies = tree(uploads)
    assert len(copies) == 2
    kept = client.undo(sent)
    # Then without --uploads the copies stay (nothing to undo), with it they leave the folder (kept in
    # the history store until retention) and the originals are untouched
    assert kept["job"] is None and "--uploads" in kept["note"] and tree(uploads) == copies
    removed = client.undo(sent, uploads=True)
    assert wait_job(engine, removed["job"]) == "succeeded"
    assert tree(uploads) == {} and tree(folder) == before
    away = sorted(p.name for p in (folder / HISTORY).rglob("*") if p.is_file())
    assert [n.split(".removed-")[0] for n in away if ".removed-" in n] == sorted(copies.values())
    # When the raw and its sidecar are uploaded to the S3 target (job A), then undone without --uploads
    remote = {"upload.target_name": "backup"}
    a = client.submit(["upload"], [folder], remote).job_id
    assert wait_job(engine, a) == "succeeded"

    def objects() -> dict[str, str]:
        listed = s3.list_objects_v2(Bucket="photos").get("Contents", [])
        return {o["Key"]: o["ETag"] for o in listed}

    sent_objects = objects()
    assert len(sent_objects) == 2
    left = client.undo(a)
    # Then the copies stay: nothing to undo without --uploads
    assert left["job"] is None and "--uploads" in left["note"] and objects() == sent_objects
    # and the raw's history lists the upload to the target's name + key with its content hash
    up = [e for e in client.photo_history(str(raw))["history"] if e["job"] == a]
    assert [(e["kind"], e["target"], e["sidecar"]) for e in up] == [("upload", "backup", False),
                                                                  ("upload", "backup", True)]  # fmt: skip
    assert up[0]["after_sha256"] == before["IMG_0001.CR2"] and up[0]["key"] in sent_objects
    # When a later job B uploads them again (the same keys), A's undo with --uploads is refused
    b = client.submit(["upload"], [folder], remote).job_id
    assert wait_job(engine, b) == "succeeded"
    refused = client.undo(a, uploads=True)["job"]
    assert wait_job(engine, refused) == "failed"
    (error,) = [i.error for i in items_of(engine, refused)]
    assert f"changed since job {a} by job {b}'s upload" in error and f"photojobs undo {b} --uploads" in error
    assert objects() == sent_objects
    # When B is undone with --uploads (B found the copies there: they stay), then A with --uploads
    assert wait_job(engine, client.undo(b, uploads=True)["job"]) == "succeeded"
    assert objects() == sent_objects
    # (on a worker SIGKILLed after deleting them, before its finish: a healthy one takes over)
    fleet.kill(worker)
    doomed = fleet.start_worker(
        ["upload"], threads=1, env={"PHOTOJOBS_FAILPOINTS": "undo.upload.after_apply"}
    )
    undo_a = client.undo(a, uploads=True)["job"]
    wait_for(lambda: doomed.poll() is not None, 120, what="the undoing worker to be killed after its deletes")
    assert objects() == {}
    fleet.start_worker(["archive", "upload"], threads=2)
    assert wait_job(engine, undo_a) == "succeeded"
    # Then A's copies are deleted from the target, each removal logged once, the originals untouched
    assert objects() == {} and tree(folder) == before
    removed_rows = [(e.kind, e.undoes) for e in effects_of(engine, undo_a)]
    assert sorted(removed_rows) == sorted(("upload removed", e["effect"]) for e in up)
    # and the command says the same in words, and refuses what it cannot undo with a clear error
    text = photojobs(env, "history", str(raw))
    assert (
        text.returncode == 0 and f"undone by job {undo['job']}" in text.stdout and "(sidecar)" in text.stdout
    )
    assert f"target backup  key {up[0]['key']}" in text.stdout and "upload removed" in text.stdout
    unknown = photojobs(env, "undo", "999999")
    assert unknown.returncode == 1 and "999999" in unknown.stderr
    bad_lane = photojobs(env, "undo", str(job), "--lane", "exif")
    assert bad_lane.returncode == 64 and "has no lane 'exif'" in bad_lane.stderr
    again = photojobs(env, "undo", str(job))
    assert (
        again.returncode == 0
        and "nothing to undo" in again.stdout
        and f"by job {undo['job']}" in again.stdout
    )
    client.engine.dispose()


BOUNDARIES = ["after_stage", "after_record", "after_apply", "after_mark"]


def test_an_undo_effect_killed_at_each_step_boundary_lands_exactly_once(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    client = Client(Settings.from_env(env))
    fleet.start_sweeper()
    combos = [(lane, b) for b in BOUNDARIES for lane in ("rename", "exif")]
    # Given, for each step boundary of an undo effect of each lane, two photos shifted and renamed
    helper = fleet.start_worker(["exif", "rename"], threads=2)
    rounds = []
    for n, combo in enumerate(combos):
        folder = tmp_path / f"photos{n}"
        generate_samples(folder, 2, seed=n, size=(96, 64))
        rounds.append(
            (combo, folder, tree(folder), client.submit(["exif", "rename"], [folder], PARAMS).job_id)
        )
    assert {wait_job(engine, job) for *_, job in rounds} == {"succeeded"}
    fleet.kill(helper)
    # When each job is undone while a worker dies (SIGKILL) at each boundary (of whichever undo it
    # runs): the four rename boundaries' workers together, then the four exif ones (a worker runs
    # other items until it dies at its own: only those of its lane are never finished meanwhile)
    undos = [client.undo(job)["job"] for *_, job in rounds]
    for phase in ("rename", "exif"):
        doomed = {
            point: fleet.start_worker(["exif", "rename"], threads=1, env={"PHOTOJOBS_FAILPOINTS": point})
            for point in (f"undo.{lane}.{boundary}" for (lane, boundary), *_ in rounds if lane == phase)
        }
        for point, p in doomed.items():
            wait_for(lambda p=p: p.poll() is not None, 120, what=f"a worker to die at {point}")
    # and then a healthy worker takes over
    fleet.start_worker(["exif", "rename"], threads=2)
    # Then every photo is back byte for byte, and each effect was undone exactly once
    for ((lane, boundary), folder, originals, job), undo in zip(rounds, undos, strict=True):
        assert wait_job(engine, undo) == "succeeded", [i.error for i in items_of(engine, undo)]
        assert tree(folder) == originals, f"undo.{lane}.{boundary}"
        assert temp_files(folder) == []
        undone = sorted((e.undone_by, e.lane) for e in effects_of(engine, job))
        assert undone == [(undo, "exif")] * 2 + [(undo, "rename")] * 2, f"undo.{lane}.{boundary}"
        assert len(effects_of(engine, undo)) == 4, f"undo.{lane}.{boundary}: one reversal per effect"
    store_paths_match_disk(engine)
    client.engine.dispose()


def test_a_frozen_undo_worker_is_overtaken_and_every_photo_is_restored_exactly_once(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given two photos shifted and renamed by one job
    folder = tmp_path / "photos"
    generate_samples(folder, 2, seed=3, size=(96, 64))
    originals = tree(folder)
    client = Client(Settings.from_env(env))
    fleet.start_sweeper()
    helper = fleet.start_worker(["exif", "rename"], threads=2)
    job = client.submit(["exif", "rename"], [folder], PARAMS).job_id
    assert wait_job(engine, job) == "succeeded"
    fleet.kill(helper)
    # When its undo runs on a worker that freezes (SIGSTOP) with an undo move recorded, not applied
    zombie = fleet.start_worker(
        ["exif", "rename"], threads=1, env={"PHOTOJOBS_FAILPOINTS": "undo.rename.after_record:stop"}
    )
    undo = client.undo(job)["job"]
    frozen = wait_for(
        lambda: next((i for i in items_of(engine, undo) if i.lease_owner and i.state == "running"), None),
        60,
        what="the undo worker to take an item",
    )
    pid = int(frozen.lease_owner.split(":")[1])
    wait_for(
        lambda: Path(f"/proc/{pid}/stat").read_text().split()[2] == "T", 60, what="the undo worker to freeze"
    )
    # and its lease expires, another worker finishes the undo, then the frozen one resumes
    fleet.start_worker(["exif", "rename"], threads=1)
    assert wait_job(engine, undo) == "succeeded", [i.error for i in items_of(engine, undo)]
    os.killpg(zombie.pid, signal.SIGCONT)

    zombie_refused = lambda: events_of(engine, "stale_commit_rejected", worker=frozen.lease_owner)  # noqa: E731
    wait_for(zombie_refused, 60, what="the frozen worker's late commit to be rejected")
    # Then every photo is back at its old path byte for byte, each effect undone exactly once
    assert tree(folder) == originals and temp_files(folder) == []
    undone = sorted((e.undone_by, e.lane) for e in effects_of(engine, job))
    assert undone == [(undo, "exif")] * 2 + [(undo, "rename")] * 2
    assert len(effects_of(engine, undo)) == 4, "one reversal per effect"
    assert {i.state for i in items_of(engine, undo)} == {"succeeded"}
    store_paths_match_disk(engine)
    client.engine.dispose()
