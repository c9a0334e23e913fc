"""The effect log, undo planning and the history API on SQLite and PostgreSQL (no workers: effects are
logged as a worker's mark would log them, through ``store.history.log_applied``)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, insert, select
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.web import create_app
from store import history
from store.clock import db_now
from store.lanes import lane_spec
from store.models import Intent, Item, Photo
from store.submission import PhotoInput, submit
from tests.support import make_files, photojobs
from tests.web_support import TOKEN

A, B, C = "a" * 64, "b" * 64, "c" * 64


def _job(engine: Engine, lanes: list[str], paths: list[Path]) -> tuple[int, dict[tuple[str, str], int]]:
    done = submit(engine, [lane_spec(n) for n in lanes], [PhotoInput(str(p)) for p in paths], roots=["/r"])
    with Session(engine) as s:
        rows = s.execute(
            select(Item.id, Item.lane, Photo.path).join(Photo).where(Item.job_id == done.job_id)
        ).all()
    return done.job_id, {(lane, Path(path).name): item for item, lane, path in rows}


def _applied(engine: Engine, item_id: int, kind: str, source: str | None, target: str, base: str | None,
             result: str, *, photo: bool = True, detail: dict[str, Any] | None = None) -> int:  # fmt: skip
    """An intent marked applied and its effect row, in one transaction (as ``store.intents`` does)."""
    with Session(engine) as s, s.begin():
        item = s.get(Item, item_id)
        assert item is not None
        intent = s.execute(
            insert(Intent)
            .values(
                item_id=item_id,
                token=1,
                photo_id=item.photo_id if photo else None,
                kind=kind,
                staged=f"{target}.tmp",
                target=target,
                source=source,
                base_sha256=base,
                result_sha256=result,
                state="applied",
                created_at=db_now(),
                detail=detail,
            )  # fmt: skip
            .returning(Intent.id)
        ).scalar_one()
        history.log_applied(
            s, intent, job_id=item.job_id, item_id=item_id, lane=item.lane, photo_id=item.photo_id
        )
        history.log_applied(  # a second mark of the same intent logs nothing more
            s, intent, job_id=item.job_id, item_id=item_id, lane=item.lane, photo_id=item.photo_id
        )
    with Session(engine) as s:
        return s.execute(
            select(history.PhotoEffect.id).where(history.PhotoEffect.intent_id == intent)
        ).scalar_one()


def test_an_effect_row_per_applied_intent_and_an_undo_of_an_undo_is_a_redo(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a photo edited (metadata) and renamed by one job, its raw sidecar moved with it
    old, new = tmp_path / "a.jpg", tmp_path / "2024_a.jpg"
    job, items = _job(engine, ["exif", "rename"], [old])
    changes = {"EXIF:DateTimeOriginal": ["2024:01:01 10:00:00", "2024:01:01 11:00:00"]}
    edit = _applied(engine, items[("exif", "a.jpg")], "replace", str(old), str(old), A, B,
                    detail={"changes": changes, "kept": "/r/.photojobs-history/aa/" + A})  # fmt: skip
    move = _applied(engine, items[("rename", "a.jpg")], "move", str(old), str(new), B, B)
    side = _applied(engine, items[("rename", "a.jpg")], "move", f"{old}.xmp", f"{new}.xmp", C, C, photo=False)
    # Then the history names each effect once, oldest first, the sidecar with its photo
    story = history.photo_history(engine, history.find_photo(engine, str(old)) or 0)
    assert story is not None
    kinds = [(e["kind"], e["sidecar"], e["from_path"], e["to_path"]) for e in story["history"]]
    assert kinds == [
        ("metadata edit", False, str(old), str(old)),
        ("rename", False, str(old), str(new)),
        ("rename", True, f"{old}.xmp", f"{new}.xmp"),
    ]
    assert story["history"][0]["changes"] == changes and story["history"][0]["original_kept"] is True
    # When an undo job reverses the rename and the edit
    undo, undo_items = _job(engine, ["rename", "exif"], [old])
    _applied(engine, undo_items[("rename", "a.jpg")], "move", str(new), str(old), B, B,
             detail={"undoes": move, "kind": "move"})  # fmt: skip
    _applied(engine, undo_items[("rename", "a.jpg")], "move", f"{new}.xmp", f"{old}.xmp", C, C, photo=False,
             detail={"undoes": side, "kind": "move", "sidecar": True})  # fmt: skip
    restore = _applied(engine, undo_items[("exif", "a.jpg")], "replace", str(old), str(old), B, A,
                       detail={"undoes": edit, "kind": "metadata edit"})  # fmt: skip
    # Then the job's effects are undone by it, and a second undo of the job has nothing to do
    assert {e.id: e.undone_by for e in history.effects_of(engine, job)} == {
        edit: undo,
        move: undo,
        side: undo,
    }
    assert history.plan_undo(engine, job).lanes == []
    assert "undone already (by job" in (history.plan_undo(engine, job).note or "")
    # When the undo is undone (a redo)
    redo, redo_items = _job(engine, ["exif", "rename"], [old])
    _applied(
        engine, redo_items[("exif", "a.jpg")], "replace", str(old), str(old), A, B, detail={"undoes": restore}
    )
    # Then the redone edit is in effect again (the job's edit can be undone anew), the undo's is not
    effects = {e.id: e.undone_by for e in history.effects_of(engine, job)}
    assert effects == {edit: None, move: undo, side: undo}
    assert history.effect_by_id(engine, restore).undone_by == redo  # type: ignore[union-attr]
    assert history.plan_undo(engine, job).lanes == ["exif"]


def test_an_undo_plan_reverses_the_lanes_and_leaves_uploads_unless_asked(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a job that edited, renamed and uploaded two photos (and analysed them: nothing to undo)
    paths = [tmp_path / "a.jpg", tmp_path / "b.jpg"]
    job, items = _job(engine, ["analysis", "exif", "rename", "upload"], paths)
    for p in paths:
        _applied(engine, items[("exif", p.name)], "replace", str(p), str(p), A, B)
        _applied(engine, items[("rename", p.name)], "move", str(p), str(p) + ".x", B, B)
        _applied(engine, items[("upload", p.name)], "publish", str(p), f"/up/{p.name}", None, B)
    # Then its undo runs the file lanes in reverse, uploads only with --uploads, the photos' paths now
    plan = history.plan_undo(engine, job)
    assert plan.lanes == ["rename", "exif"] and plan.params["undo.job"] == job
    assert plan.paths == sorted(str(p) for p in paths)  # the store did not follow: no worker ran
    assert history.plan_undo(engine, job, uploads=True).lanes == ["upload", "rename", "exif"]
    assert history.plan_undo(engine, job, lane="exif").lanes == ["exif"]
    with pytest.raises(ValueError, match="has no lane 'archive'"):
        history.plan_undo(engine, job, lane="archive")
    assert "applied no file effect" in (history.plan_undo(engine, job, lane="analysis").note or "")


@pytest.fixture
def http(engine: Engine, redis_url: str, tmp_path: Path) -> Iterator[TestClient]:
    env = {"PHOTOJOBS_DATABASE_URL": str(engine.url), "PHOTOJOBS_REDIS_URL": redis_url}
    client = Client(Settings.from_env(env), engine, migrate=False)
    app = create_app(client, token=TOKEN, photo_roots=[tmp_path / "photos"], env=env)
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c


def test_the_history_api_finds_a_photo_by_path_and_submits_an_undo(
    http: TestClient, engine: Engine, tmp_path: Path
) -> None:
    # Given a job that edited a photo inside the photo roots
    (photo,) = make_files(tmp_path / "photos", 1)
    r = http.post("/api/jobs", json={"lanes": ["exif"], "paths": [str(photo)], "params": {"exif.rating": 3}})
    assert r.status_code == 201, r.text
    job = r.json()["job"]
    with Session(engine) as s:
        item = s.execute(select(Item.id).where(Item.job_id == job)).scalar_one()
    _applied(engine, item, "replace", str(photo), str(photo), A, B)
    # When its photo is looked up by path, then by id
    found = http.get("/api/photos", params={"path": str(photo)})
    assert found.status_code == 200, found.text
    by_id = http.get(f"/api/photos/{found.json()['photo']}/history")
    # Then both give the history, and the undo is a job of its own
    assert by_id.json() == found.json() and found.json()["history"][0]["job"] == job
    undo = http.post(f"/api/jobs/{job}/undo", json={})
    assert undo.status_code == 201 and undo.json()["items"] == 1, undo.text
    # and bad requests are 4xx naming what was wrong
    assert http.get("/api/photos", params={"path": "/etc/passwd"}).status_code == 403
    assert http.get("/api/photos", params={"path": str(tmp_path / "photos" / "nope.jpg")}).status_code == 404
    assert http.get("/api/photos", params={"path": str(photo), "x": "1"}).status_code == 400
    assert http.get("/api/photos/999999/history").status_code == 404
    assert http.get("/api/photos/0/history").status_code in (400, 422)
    assert http.post("/api/jobs/999999/undo").status_code == 404
    bad_lane = http.post(f"/api/jobs/{job}/undo", json={"lane": "archive"})
    assert bad_lane.status_code == 400 and "has no lane 'archive'" in bad_lane.text
    assert http.post(f"/api/jobs/{job}/undo", json={"lanes": "x"}).status_code in (400, 422)


def test_prune_removes_kept_originals_past_the_retention_and_history_says_so(
    engine: Engine, redis_url: str, tmp_path: Path
) -> None:
    from photos import history as kept_files
    from photos.fileops import sha256_file
    from photos.rootfs import Roots

    # Given an edit whose displaced original is kept in the root's history store
    (photo,) = make_files(tmp_path / "photos", 1)
    sha = sha256_file(photo)
    kept = kept_files.keep(photo, sha, within=Roots([tmp_path / "photos"]))
    job, items = _job(engine, ["exif"], [photo])
    _applied(engine, items[("exif", photo.name)], "replace", str(photo), str(photo), sha, B,
             detail={"kept": str(kept)})  # fmt: skip
    env = {"PHOTOJOBS_DATABASE_URL": str(engine.url), "PHOTOJOBS_REDIS_URL": redis_url}
    client = Client(Settings.from_env(env), engine, migrate=False)
    # and one kept for an edit that never landed (no effect, no live intent names it)
    other = tmp_path / "photos" / "other.jpg"
    other.write_bytes(b"another photo")
    stray = kept_files.keep(other, sha256_file(other), within=Roots([tmp_path / "photos"]))
    # When prune runs within the retention, nothing goes; past it (here: none), both go
    assert client.prune_history("30d") == 0 and kept is not None and kept.exists()
    assert client.prune_history(0.0) == 2
    # Then the files are gone, the photos untouched, and the history still names the edit, not kept
    assert not kept.exists() and stray is not None and not stray.exists()
    assert photo.exists() and other.exists()
    (entry,) = client.photo_history(str(photo))["history"]
    assert entry["job"] == job and entry["original_kept"] is False
    with pytest.raises(ValueError):
        client.prune_history("soon")


def test_a_long_history_is_read_in_pages_over_the_api_the_client_and_the_command(
    http: TestClient, engine: Engine, redis_url: str, tmp_path: Path
) -> None:
    # Given a photo with 7 effects in its history
    (photo,) = make_files(tmp_path / "photos", 1)
    job, items = _job(engine, ["exif"], [photo])
    effects = [_applied(engine, items[("exif", photo.name)], "replace", str(photo), str(photo), A, B)]
    for _ in range(6):
        _, more_items = _job(engine, ["exif"], [photo])
        effects.append(
            _applied(engine, more_items[("exif", photo.name)], "replace", str(photo), str(photo), A, B)
        )
    photo_id = http.get("/api/photos", params={"path": str(photo)}).json()["photo"]
    # When the API is read 3 at a time, following each page's next
    seen, after, pages = [], None, 0
    while True:
        params = {"limit": 3, **({"after": after} if after else {})}
        page = http.get(f"/api/photos/{photo_id}/history", params=params)
        assert page.status_code == 200, page.text
        seen += [e["effect"] for e in page.json()["history"]]
        pages, after = pages + 1, page.json()["next"]
        if after is None:
            break
    # Then every effect comes once, oldest first, in pages of 3 at most, the last saying there is no more
    assert seen == effects and pages == 3
    # And limits outside 1..1000 are 4xx; a page's default is 100 entries
    assert http.get(f"/api/photos/{photo_id}/history", params={"limit": 0}).status_code in (400, 422)
    assert http.get(f"/api/photos/{photo_id}/history", params={"limit": 1001}).status_code in (400, 422)
    assert http.get(f"/api/photos/{photo_id}/history").json()["next"] is None
    # And the Client pages the same way
    env = {"PHOTOJOBS_DATABASE_URL": str(engine.url), "PHOTOJOBS_REDIS_URL": redis_url}
    client = Client(Settings.from_env(env), engine, migrate=False)
    first = client.photo_history(photo_id, limit=5)
    assert [e["effect"] for e in first["history"]] == effects[:5] and first["next"] == effects[4]
    rest = client.photo_history(str(photo), limit=5, after=first["next"])
    assert [e["effect"] for e in rest["history"]] == effects[5:] and rest["next"] is None
    # And `photojobs history --limit` prints a page and how to see the next
    shown = photojobs({**os.environ, **env}, "history", str(photo), "--limit", "4")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count(" job ") == 4
    # (each change on one line of its own, its hashes on it: never an escaped "\n" inside a line)
    assert "\\n" not in shown.stdout and shown.stdout.count("  sha256 ") == 4
    assert shown.stdout.strip().endswith(f"more: photojobs history {photo} --after {effects[3]} --limit 4")
    last = photojobs({**os.environ, **env}, "history", str(photo), "--after", str(effects[3]), "--json")
    assert [e["effect"] for e in json.loads(last.stdout)["history"]] == effects[4:]
