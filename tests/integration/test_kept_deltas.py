"""Kept originals at the cost of what changed (issue 39): the version an edit displaces is kept as a
zstd delta against the version that replaced it, restored byte for byte (content, mode, mtime) and
verified by its SHA-256; a delta that is corrupt, or whose base is gone, refuses, naming the file.
SQLite and PostgreSQL, real files and ExifTool; each lane run item by item in the test's process
(``tests.inline_lanes``), finished through the fenced store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import Engine

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.testing.samples import generate_samples
from photos import history
from photos.errors import PhotoError
from photos.fileops import sha256_file
from photos.rootfs import Roots
from store.history import effects_of

from .test_undo_chain import refusals, submit_and_run, tree, undo

KEYWORDS = {"exif.keywords": "holiday,beach,family"}


def stats(folder: Path) -> dict[str, tuple[int, int]]:
    """{relative path: (mode, mtime_ns)} of every photo under ``folder`` (not the history store)."""
    return {
        str(p.relative_to(folder)): (p.stat().st_mode, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and history.FOLDER not in p.parts
    }


def kept_bytes(folder: Path) -> int:
    """The bytes the history store costs: its files, less those that are a photo's own inode (a
    delta's base link is the photo while the photo is that version: it costs nothing)."""
    photos = {p.stat().st_ino for p in folder.rglob("*") if p.is_file() and history.FOLDER not in p.parts}
    kept = {p.stat().st_ino: p.stat().st_size for p in (folder / history.FOLDER).rglob("*") if p.is_file()}
    return sum(size for ino, size in kept.items() if ino not in photos)


@pytest.fixture
def client(engine: Engine) -> Client:
    c = Client(Settings.from_env({}), engine=engine)
    yield c
    c.engine.dispose()


def test_a_keyword_edit_is_kept_as_a_small_delta_and_its_undo_restores_the_original_byte_for_byte(
    engine: Engine, client: Client, tmp_path: Path
) -> None:
    # Given four photos (one with its own mode and time) given keywords by an exif job
    folder = tmp_path / "photos"
    generate_samples(folder, 4, seed=39, size=(320, 240))
    first = sorted(p for p in folder.rglob("*") if p.is_file())[0]
    first.chmod(0o640)
    os.utime(first, ns=(1_600_000_000_000_000_000, 1_600_000_000_123_456_789))
    originals, original_stats = tree(folder), stats(folder)
    photo_bytes = sum((folder / p).stat().st_size for p in originals)
    job = submit_and_run(client, engine, ["exif"], folder, KEYWORDS)
    after_job = tree(folder)
    # Then each displaced original is kept as a delta against its edited version, a few KB at most
    edits = effects_of(engine, job)
    assert len(edits) == 4 and all(history.is_delta(str(e.kept)) for e in edits), [e.kept for e in edits]
    assert all(Path(str(e.kept)).name == f"{e.before_sha256}.delta-{e.after_sha256}" for e in edits)
    assert kept_bytes(folder) <= photo_bytes * 0.10, (kept_bytes(folder), photo_bytes)
    # When the job is undone
    undo_job, results = undo(client, engine, job)
    # Then every photo is back byte for byte, with its mode and mtime
    assert refusals(results) == []
    assert tree(folder) == originals and stats(folder) == original_stats
    # and the edited version the undo displaced is kept as a delta in turn: the redo gives it back
    assert all(history.is_delta(str(e.kept)) for e in effects_of(engine, undo_job))
    assert kept_bytes(folder) <= photo_bytes * 0.20
    _, redone = undo(client, engine, undo_job)
    assert refusals(redone) == [] and tree(folder) == after_job


def test_a_corrupted_delta_refuses_its_photo_naming_the_file_and_leaves_it_as_it_is(
    engine: Engine, client: Client, tmp_path: Path
) -> None:
    # Given two photos given keywords by one job, and one kept delta corrupted (a byte of its frame)
    folder = tmp_path / "photos"
    generate_samples(folder, 2, seed=7, size=(320, 240))
    originals = tree(folder)
    job = submit_and_run(client, engine, ["exif"], folder, KEYWORDS)
    after_job = tree(folder)
    edit = effects_of(engine, job)[0]
    delta = Path(str(edit.kept))
    data = bytearray(delta.read_bytes())
    data[-6] ^= 0xFF
    delta.write_bytes(bytes(data))
    damaged = next(p for p, sha in after_job.items() if sha == edit.after_sha256)
    # When the job is undone
    _, results = undo(client, engine, job)
    # Then that photo is refused, the delta named with the reason; the photo is as the job left it
    (why,) = refusals(results)
    assert str(delta) in why and "corrupt" in why and "not restored" in why, why
    now = tree(folder)
    assert now[damaged] == after_job[damaged]
    # and the other photo is back byte for byte
    others = {p: s for p, s in originals.items() if p != damaged}
    assert {p: s for p, s in now.items() if p != damaged} == others


def test_a_delta_whose_base_is_gone_refuses_naming_the_delta_and_a_whole_copy_is_kept_where_no_delta_pays(
    tmp_path: Path,
) -> None:
    # Given a photo and the version that replaces it, its original kept as a delta against it
    folder = tmp_path / "photos"
    generate_samples(folder, 1, seed=3, size=(320, 240))
    (photo,) = [p for p in folder.rglob("*") if p.is_file()]
    roots = Roots([folder])
    original, sha = photo.read_bytes(), sha256_file(photo)
    edited = photo.with_name("edited.jpg")
    edited.write_bytes(original[:-2] + b"\x00\x00" + original[-2:])
    kept = history.keep(photo, sha, within=roots, new=edited, new_sha256=sha256_file(edited))
    assert kept is not None and history.is_delta(kept) and kept.stat().st_size < len(original) // 10
    # When it is restored with its base at hand, it is the original, byte for byte
    staged = history.stage_original(str(kept), sha, photo, "t1", within=roots, bases=[edited])
    assert staged.read_bytes() == original
    staged.unlink()
    # When the base has changed (and no version of it is kept), it refuses, naming the delta
    edited.write_bytes(b"something else")
    with pytest.raises(PhotoError) as refused:
        history.kept_file(str(kept), sha, within=roots, bases=[edited])
    assert str(kept) in str(refused.value) and "base" in str(refused.value) and "gone or changed" in str(
        refused.value
    )
    # And where a delta is not smaller (unrelated content), the original is kept whole
    other = folder / "noise.bin"
    other.write_bytes(os.urandom(4096))
    new_sha = sha256_file(edited)
    kept_whole = history.keep(other, sha256_file(other), within=roots, new=edited, new_sha256=new_sha)
    assert kept_whole is not None and not history.is_delta(kept_whole)
    assert kept_whole.name == sha256_file(other) and kept_whole.read_bytes() == other.read_bytes()
