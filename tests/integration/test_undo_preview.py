"""Undo previewed and undo of a selection (issue 39): ``undo --dry-run`` gives each photo's plan
(restore, or refuse and why) by the checks the undo's items make, changing nothing and submitting no
job; ``undo --photo PATH`` undoes only the photos named. SQLite and PostgreSQL, real files and
ExifTool; the lanes run item by item in the test's process (``tests.inline_lanes``)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.testing.samples import generate_samples
from photos.exiftool import ExifTool
from photos.fileops import sha256_file
from store import history as log
from store.history import effects_of, forget_kept
from store.models import Job
from tests.integration.test_undo_chain import RENAME, refusals, run_job, submit_and_run, tree
from tests.support import unavailable


@pytest.fixture(autouse=True)
def _needs_exiftool() -> None:
    if subprocess.run(["which", "exiftool"], capture_output=True).returncode != 0:
        unavailable("needs exiftool")


@pytest.fixture
def client(engine: Engine) -> Iterator[Client]:
    c = Client(Settings.from_env({}), engine=engine)
    yield c
    c.engine.dispose()


def jobs(engine: Engine) -> int:
    with Session(engine) as s:
        return int(s.execute(select(func.count()).select_from(Job)).scalar_one())


def test_a_dry_run_plans_each_photo_and_changes_nothing(
    engine: Engine, client: Client, tmp_path: Path
) -> None:
    # Given four photos shifted and renamed by one job; one edited by hand since, one whose kept
    # original was pruned
    folder = tmp_path / "photos"
    generate_samples(folder, 4, seed=391, size=(96, 64))
    job = submit_and_run(client, engine, ["exif", "rename"], folder, {"exif.shift": "+1h", **RENAME})
    names = sorted(tree(folder))
    edited = folder / names[0]
    ExifTool.shared().execute("-Rating=3", "-overwrite_original", os.path.abspath(edited))
    edit = next(
        e for e in effects_of(engine, job)
        if e.lane == "exif" and not e.sidecar and sha256_file(folder / names[1]) == e.after_sha256
    )  # fmt: skip
    Path(str(edit.kept)).unlink()
    forget_kept(engine, [edit.id])
    before, submitted = tree(folder), jobs(engine)
    # When the undo is dry run
    out = client.undo(job, dry_run=True)
    # Then every photo has its plan: the edited one and the pruned one refused with what changed,
    # the two others restored; nothing on disk changed and no job was submitted
    assert out["dry_run"] is True and out["job"] is None
    plan = {Path(p["path"]).name: p for p in out["plan"]}
    assert set(plan) == set(names)
    assert plan[names[0]]["action"] == "refuse"
    assert "outside photojobs" in plan[names[0]]["reason"] and "holds sha256" in plan[names[0]]["reason"]
    assert plan[names[1]]["action"] == "refuse" and "was not kept" in plan[names[1]]["reason"]
    assert [plan[n]["action"] for n in names[2:]] == ["restore", "restore"], plan
    assert tree(folder) == before and jobs(engine) == submitted
    # and the real undo does what the dry run said, photo for photo
    undo = client.undo(job)
    refused = refusals(run_job(engine, undo["job"]))
    assert {Path(r.split(":")[0]).name for r in refused} >= {names[0], names[1]}, refused
    assert not any(names[2] in r or names[3] in r for r in refused), refused


def test_a_dry_run_after_an_undo_of_the_later_job_plans_every_photo_restored(
    engine: Engine, client: Client, tmp_path: Path
) -> None:
    # Given two photos shifted by job A, renamed by job R, and R undone
    folder = tmp_path / "photos"
    generate_samples(folder, 2, seed=392, size=(96, 64))
    a = submit_and_run(client, engine, ["exif"], folder, {"exif.shift": "+1h"})
    r = submit_and_run(client, engine, ["rename"], folder, RENAME)
    # When A is dry run while R is in effect, then after R is undone
    while_r = client.undo(a, dry_run=True)["plan"]
    undo_r = client.undo(r)
    assert refusals(run_job(engine, undo_r["job"])) == []
    after = client.undo(a, dry_run=True)["plan"]
    # Then the first refuses each photo naming R (the change in the way), the second restores both
    assert [p["action"] for p in while_r] == ["refuse", "refuse"]
    assert all(f"by job {r}'s rename" in p["reason"] for p in while_r), while_r
    assert [p["action"] for p in after] == ["restore", "restore"], after


def test_undo_of_one_photo_puts_back_only_that_photo(engine: Engine, client: Client, tmp_path: Path) -> None:
    # Given three photos shifted and renamed by one job
    folder = tmp_path / "photos"
    generate_samples(folder, 3, seed=393, size=(96, 64))
    originals = tree(folder)
    job = submit_and_run(client, engine, ["exif", "rename"], folder, {"exif.shift": "+1h", **RENAME})
    after = tree(folder)
    chosen = sorted(after)[1]
    # When only that photo is undone (by its current path)
    out = client.undo(job, photos=[str(folder / chosen)])
    assert out["items"] == 2, out  # its two lanes
    assert refusals(run_job(engine, out["job"])) == []
    # Then it is back, byte for byte at its old name; the two others are as the job left them
    now = tree(folder)
    assert chosen not in now
    assert {k: v for k, v in now.items() if k in after} == {k: v for k, v in after.items() if k != chosen}
    back = set(now) - set(after)
    assert len(back) == 1 and now[next(iter(back))] == originals[next(iter(back))]
    # and the rest is undone by a second undo of the job
    rest = client.undo(job)
    assert rest["items"] == 4 and refusals(run_job(engine, rest["job"])) == []
    assert tree(folder) == originals


def test_undo_of_a_path_not_in_the_job_names_it(engine: Engine, client: Client, tmp_path: Path) -> None:
    # Given a photo shifted by a job, and a photo it never touched
    folder, other = tmp_path / "photos", tmp_path / "other"
    generate_samples(folder, 1, seed=394, size=(96, 64))
    generate_samples(other, 1, seed=395, size=(96, 64))
    job = submit_and_run(client, engine, ["exif"], folder, {"exif.shift": "+1h"})
    stranger = str(next(other.iterdir()))
    mine = str(next(p for p in folder.iterdir() if p.is_file()))
    submitted = jobs(engine)
    # When an undo (or its dry run) names it along with the job's own photo
    for dry in (False, True):
        with pytest.raises(log.NotInJob) as refused:
            client.undo(job, photos=[mine, stranger], dry_run=dry)
        # Then it is refused naming that path (and only it), and nothing is submitted
        assert refused.value.paths == [stranger] and stranger in str(refused.value)
        assert f"job {job}" in str(refused.value)
    assert jobs(engine) == submitted


def test_the_cli_prints_the_dry_run_plan_as_json(
    engine: Engine, client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a photo shifted by a job
    folder = tmp_path / "photos"
    generate_samples(folder, 1, seed=396, size=(96, 64))
    job = submit_and_run(client, engine, ["exif"], folder, {"exif.shift": "+1h"})
    (photo,) = [str(p) for p in folder.iterdir() if p.is_file()]
    from photojobs import cli_history

    monkeypatch.setattr(cli_history, "_client", lambda: client)
    # When `photojobs undo J --dry-run --json` and `--photo` of a stranger run
    done = CliRunner().invoke(cli_history.undo, [str(job), "--dry-run", "--json", "--photo", photo])
    elsewhere = str(tmp_path / "x.jpg")
    stranger = CliRunner().invoke(cli_history.undo, [str(job), "--dry-run", "--photo", elsewhere])
    # Then the plan is printed as promised; the stranger is named, with a usage error
    assert done.exit_code == 0, done.output
    assert json.loads(done.output) == {
        "dry_run": True, "job": None,
        "plan": [{"path": photo, "action": "restore",
                  "reason": "exif: metadata edit reverted from the kept original"}],
    }  # fmt: skip
    assert stranger.exit_code == 64 and elsewhere in stranger.output


def test_history_prints_one_line_per_entry_and_says_which_job_an_undo_undid(
    engine: Engine, client: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a photo shifted by a job, then that job undone
    folder = tmp_path / "photos"
    generate_samples(folder, 1, seed=397, size=(96, 64))
    job = submit_and_run(client, engine, ["exif"], folder, {"exif.shift": "+1h"})
    (photo,) = [str(p) for p in folder.iterdir() if p.is_file()]
    undo = client.undo(job)
    assert refusals(run_job(engine, undo["job"])) == []
    from photojobs import cli_history

    monkeypatch.setattr(cli_history, "_client", lambda: client)
    # When its history is printed
    shown = CliRunner().invoke(cli_history.history, [photo])
    # Then a header and one line per entry (the edit, its undo), the undo saying which job it undid
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert len(lines) == 3, lines
    edit, reverted = lines[1:]
    assert f"job {job} " in edit and f"undone by job {undo['job']}" in edit and "undo of job" not in edit
    assert f"job {undo['job']} " in reverted and reverted.rstrip().count(f"undo of job {job}") == 1
    assert "\\n" not in shown.output


def test_restore_brings_back_the_version_before_a_job_over_an_edit_by_hand_and_can_be_undone(
    engine: Engine, client: Client, tmp_path: Path
) -> None:
    # Given a photo shifted by job A, then edited by hand (outside photojobs)
    folder = tmp_path / "photos"
    generate_samples(folder, 1, seed=398, size=(96, 64))
    (photo,) = [p for p in folder.iterdir() if p.is_file()]
    original = sha256_file(photo)
    a = submit_and_run(client, engine, ["exif"], folder, {"exif.shift": "+1h"})
    ExifTool.shared().execute("-Rating=4", "-overwrite_original", os.path.abspath(photo))
    by_hand = sha256_file(photo)
    assert len({original, by_hand}) == 2
    # When the version before A is restored, on purpose
    out = client.restore(str(photo), before_job=a)
    assert out["sha256"] == original and out["items"] == 1, out
    assert refusals(run_job(engine, out["job"])) == []
    # Then the photo holds its original bytes, its history says "restored", and the version by
    # hand is kept: the undo of the restore puts it back, byte for byte
    assert sha256_file(photo) == original
    (entry,) = [e for e in client.photo_history(str(photo))["history"] if e["job"] == out["job"]]
    assert entry["kind"] == "restored" and entry["before_sha256"] == by_hand
    undo = client.undo(out["job"])
    assert refusals(run_job(engine, undo["job"])) == []
    assert sha256_file(photo) == by_hand
    # and a restore of the version it holds already (the one that undo left) submits nothing
    (undone,) = effects_of(engine, undo["job"])
    assert client.restore(str(photo), to_effect=undone.id)["job"] is None


def test_restore_of_a_version_not_kept_or_of_another_photo_is_refused_naming_why(
    engine: Engine, client: Client, tmp_path: Path
) -> None:
    # Given two photos shifted by job A, one kept original pruned, and a job B that changed neither
    folder = tmp_path / "photos"
    generate_samples(folder, 2, seed=399, size=(96, 64))
    a = submit_and_run(client, engine, ["exif"], folder, {"exif.shift": "+1h"})
    first, second = sorted(p for p in folder.iterdir() if p.is_file())
    edits = {e.to_path: e for e in effects_of(engine, a) if not e.sidecar}
    Path(str(edits[str(first)].kept)).unlink()
    forget_kept(engine, [edits[str(first)].id])
    submitted = jobs(engine)
    # When a restore asks for the pruned version, a change of the other photo, or no version at all
    cases = {
        "is not kept in the history": lambda: client.restore(str(first), before_job=a),
        f"effect {edits[str(second)].id} is no change of photo": lambda: client.restore(
            str(first), to_effect=edits[str(second)].id
        ),
        f"job {a + 99} did not change photo": lambda: client.restore(str(first), before_job=a + 99),
        "exactly one of --to EFFECT and --before JOB": lambda: client.restore(str(first)),
    }
    # Then each is refused naming why, and nothing is submitted
    for why, ask in cases.items():
        with pytest.raises(ValueError, match=why):
            ask()
    assert jobs(engine) == submitted


def folders(root: Path) -> set[str]:
    return {
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_dir() and ".photojobs-history" not in p.parts
    }


def test_undo_removes_the_empty_folders_its_job_made_and_keeps_those_that_were_there(
    engine: Engine, client: Client, tmp_path: Path
) -> None:
    # Given three photos archived into dated folders the archive job made, then that job undone
    folder, archive = tmp_path / "photos", tmp_path / "archive"
    generate_samples(folder, 3, seed=400, size=(96, 64))
    originals = tree(folder)
    params = {"archive.root": str(archive)}
    first = submit_and_run(client, engine, ["archive"], folder, params)
    made = folders(archive)
    assert made and tree(folder) == {}
    undo = client.undo(first)
    assert refusals(run_job(engine, undo["job"])) == []
    # Then the folders it made are gone (the archive root, a destination, stays)
    assert tree(folder) == originals and archive.is_dir() and folders(archive) == set()
    # Given the same dated folders made by hand beforehand (and one more, empty), then archived again
    for name in made:
        (archive / name).mkdir(parents=True, exist_ok=True)
    (archive / "mine").mkdir()
    second = submit_and_run(client, engine, ["archive"], folder, params)
    assert tree(folder) == {}
    # When that job is undone
    undo = client.undo(second)
    assert refusals(run_job(engine, undo["job"])) == []
    # Then the photos are back and every folder that was there before the job stays, empty
    assert tree(folder) == originals
    assert folders(archive) == made | {"mine"}


def test_the_api_previews_an_undo_and_undoes_one_photo(
    engine: Engine, redis_url: str, tmp_path: Path
) -> None:
    # Given two photos shifted by a job submitted over the API, run
    from fastapi.testclient import TestClient

    from photojobs.web import create_app
    from tests.web_support import TOKEN

    folder = tmp_path / "photos"
    generate_samples(folder, 2, seed=401, size=(96, 64))
    originals = tree(folder)
    env = {"PHOTOJOBS_DATABASE_URL": str(engine.url), "PHOTOJOBS_REDIS_URL": redis_url}
    client = Client(Settings.from_env(env), engine, migrate=False)
    app = create_app(client, token=TOKEN, photo_roots=[folder], env=env)
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        r = http.post(
            "/api/jobs", json={"lanes": ["exif"], "paths": [str(folder)], "params": {"exif.shift": "+1h"}}
        )
        assert r.status_code == 201, r.text
        job = r.json()["job"]
        assert refusals(run_job(engine, job)) == []
        shifted = tree(folder)
        first, second = sorted(str(p) for p in folder.iterdir() if p.is_file())
        submitted = jobs(engine)
        # When the undo is previewed, then undone for one photo
        preview = http.post(f"/api/jobs/{job}/undo", json={"dry_run": True})
        # Then the preview is the plan (200, nothing created), every photo restored, nothing changed
        assert preview.status_code == 200, preview.text
        assert preview.json()["dry_run"] is True
        assert sorted((p["path"], p["action"]) for p in preview.json()["plan"]) == [
            (first, "restore"), (second, "restore")
        ]  # fmt: skip
        assert tree(folder) == shifted and jobs(engine) == submitted
        one = http.post(f"/api/jobs/{job}/undo", json={"photos": [second]})
        assert one.status_code == 201 and one.json()["items"] == 1, one.text
        assert refusals(run_job(engine, one.json()["job"])) == []
        name = Path(second).name
        assert tree(folder) == {**shifted, name: originals[name]}
        # and a path outside the roots, or none of the job's, is refused naming it
        outside = http.post(f"/api/jobs/{job}/undo", json={"photos": ["/etc/passwd"]})
        assert outside.status_code == 403 and "/etc/passwd" in outside.text
        (folder / "new.jpg").write_bytes(b"x")
        stranger = http.post(
            f"/api/jobs/{job}/undo", json={"photos": [str(folder / "new.jpg")], "dry_run": True}
        )
        assert stranger.status_code == 400 and stranger.json()["error"] == "not_in_job", stranger.text
