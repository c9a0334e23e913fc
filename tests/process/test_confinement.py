"""What a web job names is confined (issue 20): destinations, remote targets, diagnostics, and the
photo itself at the moment a worker uses it — against a real ``photojobs serve`` and real workers."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from photojobs.testing.samples import generate_samples
from photos.history import FOLDER as HISTORY  # kept originals (issue 31), not photos
from tests.support import AWS_TEST_ENV, Fleet, MotoServer, make_files, photojobs
from tests.web_support import wait_job

SECRET = b"TOPSECRET-PASSWORD=hunter2\n" * 4


@pytest.fixture
def out(tmp_path: Path) -> Path:
    folder = tmp_path / "out"
    folder.mkdir()
    return folder




def job_ids(http: httpx.Client) -> list[int]:
    return [j["job"] for j in http.get("/api/jobs").json()["jobs"]]


def files_under(folder: Path) -> list[Path]:
    found = (p for p in folder.rglob("*") if HISTORY not in p.parts)
    return sorted(p for p in found if p.is_file() or p.is_symlink()) if folder.exists() else []


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_destination_outside_the_roots_is_403_and_nothing_is_written_or_moved(
    serve: Any, fleet: Fleet, photos: Path, out: Path, tmp_path: Path
) -> None:
    # Given a server with a photo root and an output root, real upload and archive workers, a photo
    srv = serve(PHOTOJOBS_OUTPUT_ROOTS=str(out))
    fleet.start_sweeper()
    fleet.start_worker(["upload", "archive"])
    generate_samples(photos / "trip", 1, seed=3, size=(64, 48))
    photo = next((photos / "trip").iterdir())
    before = sha(photo)
    elsewhere = tmp_path / "elsewhere"
    (out / "escape").symlink_to(elsewhere, target_is_directory=True)
    http = srv.client()
    # When jobs name an upload target or an archive root outside every root: directly, through a
    # symlink inside the output root, or by the defaults (siblings of the photo folder)
    # (the root itself submitted: its defaults photos-uploads / photos-archive are outside it)
    asks = [
        (["upload"], "trip", {"upload.target": str(elsewhere)}),
        (["archive"], "trip", {"archive.root": str(elsewhere)}),
        (["upload"], "trip", {"upload.target": str(out / "escape" / "up")}),
        (["upload"], str(photos), {}),
        (["archive"], str(photos), {}),
    ]
    answers = [
        http.post("/api/jobs", json={"lanes": lanes, "paths": [path], "params": p}) for lanes, path, p in asks
    ]
    # Then each is a 403 "outside_roots" that says what to configure, and no job exists
    for answer in answers:
        assert answer.status_code == 403, [a.text for a in answers]
        assert answer.json()["error"] == "outside_roots"
        assert "PHOTOJOBS_OUTPUT_ROOTS" in answer.json()["message"]
    assert "(its default)" in answers[3].json()["message"]
    assert job_ids(http) == []
    # And a job inside the output root runs: the copy lands there and the original stays in place
    ok = http.post(
        "/api/jobs",
        json={"lanes": ["upload"], "paths": ["trip"], "params": {"upload.target": str(out / "up")}},
    )
    assert ok.status_code == 201, ok.text
    assert wait_job(http, ok.json()["job"])["state"] == "succeeded"
    assert [sha(p) for p in files_under(out / "up")] == [before]
    # And nothing was written outside, and the photo was never moved
    assert not elsewhere.exists()
    assert photo.exists() and sha(photo) == before


def test_an_s3_endpoint_or_raw_s3_target_from_a_request_is_400_and_no_connection_is_made(
    serve: Any, fleet: Fleet, photos: Path
) -> None:
    # Given a listener on loopback standing in for an internal service, a server and an upload
    # worker holding credentials
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    srv = serve()
    fleet.start_sweeper()
    fleet.start_worker(["upload"], env=AWS_TEST_ENV)
    generate_samples(photos / "p", 2, seed=2, size=(64, 48))
    http = srv.client()
    # (the worker is up and taking upload work: a local upload inside the root went through)
    canary = http.post("/api/jobs", json={"lanes": ["upload"], "paths": ["p"]}).json()["job"]
    assert wait_job(http, canary)["state"] == "succeeded"
    try:
        # When requests name an S3 endpoint, or a raw s3:// target
        with_endpoint = http.post(
            "/api/jobs",
            json={
                "lanes": ["upload"],
                "paths": ["p"],
                "params": {"upload.target": "s3://bucket/p", "upload.endpoint": f"http://127.0.0.1:{port}/"},
            },
        )
        raw = http.post(
            "/api/jobs",
            json={"lanes": ["upload"], "paths": ["p"], "params": {"upload.target": "s3://bucket/p"}},
        )
        # Then the listener stays silent: nobody connects (a signed request would arrive here)
        listener.settimeout(5)
        with pytest.raises(TimeoutError):
            conn, _ = listener.accept()
            conn.close()
        # And both are 400s that point at the named targets, and no job exists
        for answer in (with_endpoint, raw):
            assert answer.status_code == 400, answer.text
            assert "PHOTOJOBS_UPLOAD_TARGETS" in answer.json()["message"]
        assert job_ids(http) == [canary]
    finally:
        listener.close()


def test_a_named_upload_target_from_configuration_uploads_to_s3(
    serve: Any, fleet: Fleet, photos: Path, tmp_path: Path
) -> None:
    # Given a real S3-compatible server (moto) with a bucket, named as "backup" in the server's
    # PHOTOJOBS_UPLOAD_TARGETS, and an upload worker with credentials
    moto = MotoServer(tmp_path)
    endpoint = moto.start()
    try:
        s3 = moto.s3_client("photos")
        made = generate_samples(photos / "set", 3, seed=5, size=(64, 48))
        srv = serve(PHOTOJOBS_UPLOAD_TARGETS=f"other=s3://nothere/x, backup=s3://photos/backup@{endpoint}")
        fleet.start_sweeper()
        fleet.start_worker(["upload"], env=AWS_TEST_ENV)
        http = srv.client()
        # When a request picks the target by name (and another names one that is not configured)
        created = http.post(
            "/api/jobs",
            json={"lanes": ["upload"], "paths": ["set"], "params": {"upload.target_name": "backup"}},
        )
        unknown = http.post(
            "/api/jobs",
            json={"lanes": ["upload"], "paths": ["set"], "params": {"upload.target_name": "nope"}},
        )
        # Then the named one runs and every photo is in the bucket with the same bytes
        assert created.status_code == 201, created.text
        assert wait_job(http, created.json()["job"])["state"] == "succeeded"
        objects = s3.list_objects_v2(Bucket="photos", Prefix="backup/")["Contents"]
        got = {
            hashlib.sha256(s3.get_object(Bucket="photos", Key=o["Key"])["Body"].read()).hexdigest()
            for o in objects
        }
        assert got == {sha(p) for p in made}
        # And the unknown name is a 400 listing the configured names
        assert unknown.status_code == 400 and "backup, other" in unknown.json()["message"]
    finally:
        moto.stop()


@pytest.mark.parametrize(
    "param", [("noop.crash_if", "f0"), ("noop.fail_if", "f0"), ("noop.sleep", 30), ("noop.spin", 30)]
)
def test_diagnostic_parameters_are_refused_unless_the_server_enables_diagnostics(
    serve: Any, photos: Path, param: tuple[str, Any]
) -> None:
    # Given a server without PHOTOJOBS_DIAGNOSTICS and one with it
    make_files(photos / "n", 2)
    plain, diagnostics = serve(PHOTOJOBS_DIAGNOSTICS="0"), serve(PHOTOJOBS_DIAGNOSTICS="1")
    body = {"lanes": ["noop"], "paths": ["n"], "params": dict([param])}
    # When a noop job with a fault parameter is submitted to each
    refused = plain.client().post("/api/jobs", json=body)
    accepted = diagnostics.client().post("/api/jobs", json=body)
    # Then the first is a 400 naming the switch (and no job exists), the second is accepted
    assert refused.status_code == 400, refused.text
    assert param[0] in refused.json()["message"] and "PHOTOJOBS_DIAGNOSTICS=1" in refused.json()["message"]
    assert accepted.status_code == 201, accepted.text
    assert job_ids(plain.client()) == [accepted.json()["job"]]  # the same store: only the accepted job
    diagnostics.client().post(f"/api/jobs/{accepted.json()['job']}/cancel")


LANES_THAT_TOUCH_FILES = {
    "analysis": {},
    "exif": {"exif.rating": 5},
    "upload": {"upload.target": "{out}/uploads"},
    "rename": {},
    "archive": {"archive.root": "{out}/archive"},
}


def test_a_photo_swapped_for_a_symlink_after_submission_is_refused_by_every_lane(
    serve: Any, fleet: Fleet, photos: Path, out: Path, tmp_path: Path
) -> None:
    # Given outside the roots a secret text file and a JPEG, and a server with no worker running yet
    outside = tmp_path / "outside"
    generate_samples(outside, 1, seed=9, size=(64, 48))
    outside_jpeg = next(outside.iterdir())
    secret = outside / "secret.jpg"
    secret.write_bytes(SECRET)
    before = {p: sha(p) for p in (outside_jpeg, secret)}
    srv = serve(PHOTOJOBS_OUTPUT_ROOTS=str(out))
    http = srv.client()
    jobs: dict[str, int] = {}
    for lane, params in LANES_THAT_TOUCH_FILES.items():
        generate_samples(photos / lane, 1, seed=1, size=(64, 48))
        p = {k: v.format(out=out) if isinstance(v, str) else v for k, v in params.items()}
        created = http.post("/api/jobs", json={"lanes": [lane], "paths": [lane], "params": p})
        assert created.status_code == 201, created.text
        jobs[lane] = created.json()["job"]
    # And an analysis job of a photo in a folder of its own
    generate_samples(photos / "folder", 1, seed=2, size=(64, 48))
    created = http.post("/api/jobs", json={"lanes": ["analysis"], "paths": ["folder"]})
    assert created.status_code == 201, created.text
    jobs["analysis of a folder"] = created.json()["job"]
    # When, between submission and claim, each photo is replaced by a symlink to an outside file
    # (the text file for analysis, the JPEG for the lanes that copy, write or move), and the folder
    # by a symlink to an outside folder holding a regular file of the photo's name (the photo's
    # path is a regular file then: only its folder leads out), and only then the workers start
    for lane in LANES_THAT_TOUCH_FILES:
        photo = next((photos / lane).iterdir())
        photo.unlink()
        photo.symlink_to(secret if lane == "analysis" else outside_jpeg)
    (in_folder,) = (photos / "folder").iterdir()
    (outside / "folder").mkdir()
    (outside / "folder" / in_folder.name).write_bytes(SECRET)
    before[outside / "folder" / in_folder.name] = sha(outside / "folder" / in_folder.name)
    (photos / "folder").rename(tmp_path / "moved-away")
    (photos / "folder").symlink_to(outside / "folder")
    fleet.start_sweeper()
    fleet.start_worker(list(LANES_THAT_TOUCH_FILES))
    # Then every item fails "outside the photo roots", quoting none of the outside file
    errors: dict[str, Any] = {}
    for lane, job in jobs.items():
        wait_job(http, job)
        items = http.get(f"/api/jobs/{job}/items").json()["items"]
        errors[lane] = [(i["state"], i["error"]) for i in items]
    assert {lane: [state for state, _ in e] for lane, e in errors.items()} == {
        lane: ["failed"] for lane in jobs
    }, errors
    assert all("outside the photo roots" in e[0][1] for e in errors.values()), errors
    assert not any(b"TOPSECRET" in e[0][1].encode() or "hunter2" in e[0][1] for e in errors.values())
    # And nothing was uploaded, archived, renamed or written: each folder holds only its symlink
    assert files_under(out) == []
    for lane in LANES_THAT_TOUCH_FILES:
        (link,) = files_under(photos / lane)
        assert link.is_symlink(), lane
    # And the outside files are byte-identical
    assert {p: sha(p) for p in before} == before


def test_a_destination_swapped_for_a_symlink_after_submission_is_refused_at_use(
    serve: Any, fleet: Fleet, photos: Path, out: Path, tmp_path: Path
) -> None:
    # Given jobs accepted with destinations inside the roots: an upload folder and an archive root
    # in the output root, and a rename into a sub-folder of the photo's root; no worker yet
    srv = serve(PHOTOJOBS_OUTPUT_ROOTS=str(out))
    http = srv.client()
    asks = {
        "upload": {"upload.target": str(out / "uploads")},
        "archive": {"archive.root": str(out / "archive")},
        "rename": {"rename.pattern": "sub/x{ext}"},
    }
    jobs, originals = {}, {}
    for lane, params in asks.items():
        (photo,) = generate_samples(photos / lane, 1, seed=6, size=(64, 48))
        originals[lane] = (photo, sha(photo))
        created = http.post("/api/jobs", json={"lanes": [lane], "paths": [lane], "params": params})
        assert created.status_code == 201, created.text
        jobs[lane] = created.json()["job"]
    # When, before a worker claims them, each destination becomes a symlink to a folder elsewhere
    elsewhere = {lane: tmp_path / f"elsewhere-{lane}" for lane in asks}
    for folder in elsewhere.values():
        folder.mkdir()
    (out / "uploads").symlink_to(elsewhere["upload"], target_is_directory=True)
    (out / "archive").symlink_to(elsewhere["archive"], target_is_directory=True)
    (photos / "rename" / "sub").symlink_to(elsewhere["rename"], target_is_directory=True)
    fleet.start_sweeper()
    fleet.start_worker(list(asks))
    # Then every item fails, saying its destination is outside the roots
    errors = {}
    for lane, job in jobs.items():
        wait_job(http, job)
        items = http.get(f"/api/jobs/{job}/items").json()["items"]
        errors[lane] = [(i["state"], i["error"]) for i in items]
    assert {lane: [st for st, _ in e] for lane, e in errors.items()} == {lane: ["failed"] for lane in asks}, (
        errors
    )
    assert "outside the photo roots and output roots" in errors["upload"][0][1], errors
    assert "outside the photo roots and output roots" in errors["archive"][0][1], errors
    assert "outside the root" in errors["rename"][0][1], errors
    # And nothing was written elsewhere, and every photo is where it was with the same bytes
    assert {lane: files_under(folder) for lane, folder in elsewhere.items()} == {lane: [] for lane in asks}
    for photo, digest in originals.values():
        assert photo.is_file() and not photo.is_symlink() and sha(photo) == digest



def test_the_cli_with_roots_configured_refuses_an_outside_destination_with_one_line_and_64(
    env: dict[str, str], photos: Path, out: Path, tmp_path: Path
) -> None:
    # Given photos, and an operator environment with photo and output roots
    generate_samples(photos / "trip", 1, seed=4, size=(64, 48))
    elsewhere = tmp_path / "elsewhere"
    confined = {**env, "PHOTOJOBS_PHOTO_ROOTS": str(photos), "PHOTOJOBS_OUTPUT_ROOTS": str(out)}
    # When the CLI submits an upload or an archive outside them
    runs = [
        photojobs(
            confined, "submit", "--lanes", "upload", "--param", f"upload.target={elsewhere}", str(photos)
        ),
        photojobs(
            confined, "submit", "--lanes", "archive", "--param", f"archive.root={elsewhere}", str(photos)
        ),
    ]
    # Then each exits 64 with one line naming the parameter and the setting, and no job exists
    for run in runs:
        assert run.returncode == 64, run.stderr
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("photojobs: "), run.stderr
        assert (
            "outside the photo roots and the output roots" in lines[0]
            and "PHOTOJOBS_OUTPUT_ROOTS" in lines[0]
        )
    assert photojobs(confined, "status").returncode != 0  # no job at all
    assert not elsewhere.exists()
    # And inside the output root it is accepted
    inside = photojobs(
        confined, "submit", "--lanes", "upload", "--param", f"upload.target={out}/up", str(photos)
    )
    assert inside.returncode == 0, inside.stderr
    # And without roots in its environment the operator's CLI keeps its freedom: anywhere, raw S3
    # with an endpoint
    free = photojobs(env, "submit", "--lanes", "upload", "--param", f"upload.target={elsewhere}", str(photos))
    s3 = photojobs(
        confined,
        "submit",
        "--lanes",
        "upload",
        "--param",
        "upload.target=s3://bucket/p",
        "--param",
        "upload.endpoint=http://127.0.0.1:1/",
        str(photos),
    )
    assert free.returncode == 0 and s3.returncode == 0, (free.stderr, s3.stderr)
