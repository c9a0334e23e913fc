"""Undo as a chain of states (issue 39): two steps back, undo after a redo, and advice that never
circles. SQLite and PostgreSQL, real files and ExifTool; each lane's own code (and its undo) run item
by item in the test's process (``tests.inline_lanes``), finished through the fenced store."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.testing.samples import generate_samples
from photos.errors import PhotoError
from photos.fileops import sha256_file
from store.history import effects_of, forget_kept
from store.models import Item, Job
from tests.inline_lanes import run_item
from tests.support import unavailable

RENAME = {"rename.pattern": "{taken:%Y%m%d_%H%M%S}_{stem}{ext}"}


def tree(folder: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under ``folder`` but the history store."""
    return {
        str(p.relative_to(folder)): sha256_file(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and ".photojobs-history" not in p.parts
    }


def run_job(engine: Engine, job: int) -> list[dict[str, Any] | PhotoError]:
    """Every item of the job, lane after lane in the job's order (each lane's items in id order):
    its result, or the PhotoError that refused it."""
    with Session(engine) as s:
        lanes = list(s.get(Job, job).lanes or [])  # type: ignore[union-attr]
        items = list(s.execute(select(Item).where(Item.job_id == job).order_by(Item.id)).scalars())
        for item in items:
            s.expunge(item)
    out: list[dict[str, Any] | PhotoError] = []
    for lane in lanes:
        for item in (i for i in items if i.lane == lane):
            with Session(engine) as s:
                if s.get(Item, item.id).state == "skipped":  # type: ignore[union-attr]
                    continue  # skipped: an earlier lane of its photo was refused
            try:
                out.append(run_item(engine, item, fail_refused=True))
            except PhotoError as exc:
                out.append(exc)
    return out


def submit_and_run(client: Client, engine: Engine, lanes: list[str], folder: Path, params: dict) -> int:
    job = client.submit(lanes, [folder], params).job_id
    assert all(isinstance(r, dict) for r in run_job(engine, job))
    return job


def undo(client: Client, engine: Engine, job: int) -> tuple[int, list[dict[str, Any] | PhotoError]]:
    out = client.undo(job)
    assert out["job"] is not None, out
    return out["job"], run_job(engine, out["job"])


def refusals(results: list[dict[str, Any] | PhotoError]) -> list[str]:
    return [str(r) for r in results if isinstance(r, PhotoError)]


@pytest.fixture
def client(engine: Engine) -> Client:
    c = Client(Settings.from_env({}), engine=engine)
    yield c
    c.engine.dispose()


def test_two_exif_jobs_undone_in_reverse_order_give_back_the_original_bytes(
    engine: Engine, client: Client, tmp_path: Path
) -> None:
    # Given three photos edited by exif job A (a shift) and then by exif job B (a keyword)
    folder = tmp_path / "photos"
    generate_samples(folder, 3, seed=39, size=(96, 64))
    originals = tree(folder)
    a = submit_and_run(client, engine, ["exif"], folder, {"exif.shift": "+1h"})
    after_a = tree(folder)
    b = submit_and_run(client, engine, ["exif"], folder, {"exif.shift": "+2h"})
    assert len({*after_a.values(), *originals.values(), *tree(folder).values()}) == 9
    # When B is undone, then A
    undo_b, results_b = undo(client, engine, b)
    assert refusals(results_b) == [] and tree(folder) == after_a
    undo_a, results_a = undo(client, engine, a)
    # Then every photo is back to its original bytes: the undo of B is no change in A's way
    assert refusals(results_a) == []
    assert tree(folder) == originals
    assert {e.undone_by for e in effects_of(engine, a)} == {undo_a}
    assert {e.undone_by for e in effects_of(engine, b)} == {undo_b}
    # and the chain goes on: undo of the undo of A (a redo) then undo of that redo (A undone again)
    redo_a, redone = undo(client, engine, undo_a)
    assert refusals(redone) == [] and tree(folder) == after_a
    again, undone = undo(client, engine, redo_a)
    assert refusals(undone) == [] and tree(folder) == originals
    assert {e.undone_by for e in effects_of(engine, a)} == {undo_a}, "A is out of effect again"
    assert {e.undone_by for e in effects_of(engine, undo_a)} == {None}
    assert {e.undone_by for e in effects_of(engine, redo_a)} == {again}


def test_exif_then_rename_undone_rename_first_then_exif_restores_every_photo(
    engine: Engine, client: Client, tmp_path: Path
) -> None:
    # Given six photos shifted by exif job 3, then renamed after their new time by job 4
    folder = tmp_path / "photos"
    generate_samples(folder, 6, seed=4, size=(96, 64))
    originals = tree(folder)
    three = submit_and_run(client, engine, ["exif"], folder, {"exif.shift": "+1h"})
    shifted = tree(folder)
    four = submit_and_run(client, engine, ["rename"], folder, RENAME)
    assert set(tree(folder)).isdisjoint(shifted)
    # When job 4 is undone, then job 3
    _, results = undo(client, engine, four)
    assert refusals(results) == [] and tree(folder) == shifted
    _, results = undo(client, engine, three)
    # Then all six photos are back, byte for byte, at their old names
    assert refusals(results) == [], refusals(results)
    assert tree(folder) == originals


def test_the_advice_to_undo_a_later_job_never_circles(
    engine: Engine, client: Client, tmp_path: Path
) -> None:
    # Given two photos shifted by job A, then renamed by job R
    folder = tmp_path / "photos"
    generate_samples(folder, 2, seed=7, size=(96, 64))
    originals = tree(folder)
    a = submit_and_run(client, engine, ["exif"], folder, {"exif.shift": "+1h"})
    r = submit_and_run(client, engine, ["rename"], folder, RENAME)
    renamed = tree(folder)
    # When A is undone first, it is refused naming R, and nothing changes
    _, results = undo(client, engine, a)
    why = refusals(results)
    assert len(why) == 2, why
    assert all(f"by job {r}'s rename" in w and w.endswith(f"photojobs undo {r}") for w in why), why
    assert tree(folder) == renamed
    # When the advice is followed (undo R) and A is undone again
    undo_r, results = undo(client, engine, r)
    assert refusals(results) == []
    _, results = undo(client, engine, a)
    # Then it is not refused "by job <undo of R>" (which would re-apply R): the photos are back
    assert not any(f"job {undo_r}" in w for w in refusals(results)), refusals(results)
    assert refusals(results) == [] and tree(folder) == originals


def test_a_real_later_change_is_still_in_the_way_after_a_redo(
    engine: Engine, client: Client, tmp_path: Path
) -> None:
    # Given a photo shifted by A, then by B; B undone and redone (the undo of its undo)
    folder = tmp_path / "photos"
    generate_samples(folder, 1, seed=11, size=(96, 64))
    a = submit_and_run(client, engine, ["exif"], folder, {"exif.shift": "+1h"})
    b = submit_and_run(client, engine, ["exif"], folder, {"exif.shift": "+2h"})
    after_b = tree(folder)
    undo_b, _ = undo(client, engine, b)
    undo(client, engine, undo_b)
    assert tree(folder) == after_b
    # When A is undone
    _, results = undo(client, engine, a)
    # Then it is refused naming B (in effect again), and the photo is as B left it
    (why,) = refusals(results)
    assert f"by job {b}'s exif" in why and f"photojobs undo {b}" in why, why
    assert tree(folder) == after_b


@pytest.fixture(autouse=True)
def _needs_exiftool() -> None:
    if subprocess.run(["which", "exiftool"], capture_output=True).returncode != 0:
        unavailable("needs exiftool")


def test_the_undo_of_an_undone_local_upload_puts_the_copies_back_and_can_be_undone_again(
    engine: Engine, client: Client, tmp_path: Path
) -> None:
    # Given two photos uploaded to a local folder, then undone with --uploads (the copies moved
    # into the history store)
    folder = tmp_path / "photos"
    generate_samples(folder, 2, seed=17, size=(96, 64))
    photos = tree(folder)
    uploads = tmp_path / "uploads"
    sent = submit_and_run(client, engine, ["upload"], folder, {"upload.target": str(uploads)})
    copies = tree(uploads)
    assert len(copies) == 2

    def undo_uploads(job: int) -> int:
        out = client.undo(job, uploads=True)
        assert out["job"] is not None, out
        assert refusals(run_job(engine, out["job"])) == []
        return out["job"]

    removed = undo_uploads(sent)
    assert tree(uploads) == {} and tree(folder) == photos
    # When that undo is undone with --uploads (a redo)
    redo = undo_uploads(removed)
    # Then the copies are back in the upload folder, byte for byte, the photos untouched
    assert tree(uploads) == copies and tree(folder) == photos
    assert {e.undone_by for e in effects_of(engine, sent)} == {None}, "the upload is in effect again"
    assert {e.kind for e in effects_of(engine, redo)} == {"upload restored"}
    # and the redo is undone in turn: the copies leave again, the photos stay where they are
    undo_uploads(redo)
    assert tree(uploads) == {} and tree(folder) == photos
    assert {e.undone_by for e in effects_of(engine, sent)} == {removed}


def test_a_photo_whose_kept_original_was_pruned_is_refused_whole_not_half_undone(
    engine: Engine, client: Client, tmp_path: Path
) -> None:
    # Given three photos shifted and renamed by one job, and the kept original of one pruned
    folder = tmp_path / "photos"
    generate_samples(folder, 3, seed=23, size=(96, 64))
    originals = tree(folder)
    job = submit_and_run(client, engine, ["exif", "rename"], folder, {"exif.shift": "+1h", **RENAME})
    after_job = tree(folder)
    edit = next(e for e in effects_of(engine, job) if e.lane == "exif" and not e.sidecar)
    Path(str(edit.kept)).unlink()
    forget_kept(engine, [edit.id])
    pruned = next(p for p in after_job if sha256_file(folder / p) == edit.after_sha256)
    # When the job is undone
    _, results = undo(client, engine, job)
    # Then that photo is refused whole, named with the reason, and left exactly as the job left it
    # (not renamed back with its edit in place); the two others are back byte for byte
    # (the rename's undo refuses it for the original; the edit's undo, which needs no rename undone
    # first in this pipeline, then finds the rename still in effect)
    why = refusals(results)
    assert why and all(pruned in w for w in why), why
    assert "not undone, left as it is" in why[0] and "was not kept" in why[0], why
    now = tree(folder)
    assert now[pruned] == after_job[pruned]
    assert {k: v for k, v in now.items() if k != pruned} == {
        k: v for k, v in originals.items() if v != originals.get(Path(edit.to_path).name)
    }
