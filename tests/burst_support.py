"""Bursts for the tests: shots sharing a capture second and a camera, whose rendered names collide
(issue 39), and a job's lanes run photo by photo in the test's process so that a name one shot's
archive freed is taken again by the next shot's rename."""

from __future__ import annotations

import subprocess
from pathlib import Path

from PIL import Image
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from photos.fileops import sha256_file
from store.models import Item, Photo
from tests.inline_lanes import run_item

PARAMS = {
    "exif.shift": "+1h",
    "rename.pattern": "{taken:%Y-%m-%d_%H%M%S}_{camera}{ext}",
}


def shot(path: Path, shade: int, second: str = "05") -> Path:
    """A JPEG of a burst: Canon EOS R5, 2021-07-04 18:30:SECOND, no sub-seconds."""
    Image.new("RGB", (48, 32), (shade % 256, 90, 160)).save(path, "JPEG")
    subprocess.run(
        ["exiftool", "-q", "-overwrite_original", "-EXIF:Make=Canon", "-EXIF:Model=Canon EOS R5",
         f"-EXIF:DateTimeOriginal=2021:07:04 18:30:{second}", str(path)],
        check=True,
    )  # fmt: skip
    return path


def bursts(folder: Path, count: int, size: int = 3) -> list[Path]:
    """``count`` shots in bursts of ``size`` (one second each), named IMG_0.jpg, IMG_1.jpg, …"""
    folder.mkdir(parents=True, exist_ok=True)
    return [shot(folder / f"IMG_{n}.jpg", 20 + 30 * n, second=f"{n // size:02d}") for n in range(count)]


def tree(folder: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under ``folder`` but the history store."""
    return {
        str(p.relative_to(folder)): sha256_file(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and ".photojobs-history" not in p.parts
    }


def items_by_photo(engine: Engine, job: int) -> dict[tuple[str, str], Item]:
    """{(lane, the photo's file name now): item} of a job."""
    with Session(engine) as s:
        rows = s.execute(
            select(Item, Photo.path).join(Photo, Photo.id == Item.photo_id).where(Item.job_id == job)
        ).all()
        for item, _ in rows:
            s.expunge(item)
    return {(item.lane, Path(path).name): item for item, path in rows}


def fresh(engine: Engine, item: Item) -> Item:
    """The item as the store has it now (detached)."""
    with Session(engine) as s:
        found = s.get(Item, item.id)
        s.expunge(found)
    return found  # type: ignore[return-value]


def run_photo_by_photo(engine: Engine, job: int, names: list[str], lanes: list[str]) -> list[str]:
    """Run each photo's ``lanes`` to the end before the next photo's (in ``names`` order); the
    names the rename lane gave."""
    items = items_by_photo(engine, job)
    renamed = []
    for name in names:
        for lane in lanes:
            out = run_item(engine, fresh(engine, items[lane, name]))
            if lane == "rename":
                renamed.append(Path(str(out["target"])).name)
    return renamed
