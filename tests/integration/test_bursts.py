"""A burst of shots in one second is named by sub-seconds (``SubSecTimeOriginal``): rename's ``_N``
suffixes follow the order the camera took them, not the order the items ran in. Real store (SQLite
and PostgreSQL), real files, the rename lane's own code run item by item in a chosen order."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from PIL import Image
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from store import jobs as store_jobs
from store.lanes import lane_spec
from store.models import Item, Photo
from tests.inline_lanes import run_item
from tests.support import unavailable

RENAME = lane_spec("rename", env={})
PATTERN = "{taken:%Y-%m-%d_%H%M%S}_{camera}{ext}"


def burst_shot(path: Path, subsec: str) -> Path:
    Image.new("RGB", (48, 32), (40, 90, 160)).save(path, "JPEG")
    subprocess.run(
        ["exiftool", "-q", "-overwrite_original", "-EXIF:Make=Canon", "-EXIF:Model=Canon EOS R5",
         "-EXIF:DateTimeOriginal=2021:07:04 18:30:05", f"-EXIF:SubSecTimeOriginal={subsec}", str(path)],
        check=True,
    )  # fmt: skip
    return path


def test_a_burst_of_three_in_one_second_is_named_by_sub_seconds(engine: Engine, tmp_path: Path) -> None:
    # Given three shots of one second whose names sort against their sub-seconds (.900, .100, .5)
    root = tmp_path / "card"
    root.mkdir()
    shots = [burst_shot(root / "IMG_1.jpg", "900"), burst_shot(root / "IMG_2.jpg", "100"),
             burst_shot(root / "IMG_3.jpg", "5")]  # fmt: skip
    inputs = [store_jobs.PhotoInput(str(p), p.stat().st_size, p.stat().st_mtime) for p in shots]
    job = store_jobs.submit(
        engine, [RENAME], inputs, params={"rename.pattern": PATTERN}, roots=[str(root)]
    ).job_id
    with Session(engine) as s:
        items = {
            Path(path).name: item
            for item, path in s.execute(
                select(Item, Photo.path).join(Photo, Photo.id == Item.photo_id).where(Item.job_id == job)
            )
        }
        for item in items.values():
            s.expunge(item)
    # When the items run one after the other in the order IMG_1, IMG_3, IMG_2 (not the burst's order)
    results = {name: run_item(engine, items[name]) for name in ("IMG_1.jpg", "IMG_3.jpg", "IMG_2.jpg")}
    # Then the shot taken first (.100) has the plain name, then .5 gets _1 and .900 gets _2
    base = "2021-07-04_183005_canon-eos-r5"
    assert {name: Path(str(r["target"])).name for name, r in results.items()} == {
        "IMG_2.jpg": f"{base}.jpg", "IMG_3.jpg": f"{base}_1.jpg", "IMG_1.jpg": f"{base}_2.jpg",
    }  # fmt: skip
    assert {r["taken_from"] for r in results.values()} == {"EXIF DateTimeOriginal"}
    assert sorted(p.name for p in root.iterdir()) == [f"{base}.jpg", f"{base}_1.jpg", f"{base}_2.jpg"]


@pytest.fixture(autouse=True)
def _needs_exiftool() -> None:
    if subprocess.run(["which", "exiftool"], capture_output=True).returncode != 0:
        unavailable("needs exiftool")
