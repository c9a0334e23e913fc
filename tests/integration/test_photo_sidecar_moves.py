"""A photo's sidecars move with it as one unit, and never with another photo: while a raw's unit is
half moved (the raw landed, its Lightroom ``NAME.xmp`` not yet), the JPEG of its RAW+JPEG pair does
not take that sidecar along. Real store (SQLite and PostgreSQL), real files, the rename lane's own
code run item by item, the second in the middle of the first."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from middleware import failpoints
from photojobs.api import Client
from photojobs.config import Settings
from store.models import Item, Photo
from tests.inline_lanes import run_item
from tests.process.test_raw_files import jpeg_with_time, sidecar_with
from tests.raw_support import make_raw, preview_jpeg


def test_a_half_moved_raw_keeps_its_sidecar_from_its_jpeg(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a RAW+JPEG pair of one capture time, the raw with a Lightroom IMG_0001.xmp
    folder = tmp_path / "shoot"
    folder.mkdir()
    make_raw(folder / "IMG_0001.CR2", make="Canon", model="Canon EOS 5D", preview=preview_jpeg())
    jpeg_with_time(folder / "IMG_0001.JPG")
    sidecar_with(folder / "IMG_0001.xmp", "-XMP-dc:Subject=lightroom")
    client = Client(Settings.from_env({}), engine=engine)
    client.submit(["rename"], [folder], {"rename.pattern": "{taken:%Y%m%d_%H%M%S}{ext}"})
    with Session(engine) as s:
        items = {
            Path(path).suffix: item
            for item, path in s.execute(select(Item, Photo.path).join(Photo, Photo.id == Item.photo_id))
        }
        for item in items.values():
            s.expunge(item)
    # When the JPEG's rename runs while the raw's unit is half moved (its photo landed, not its sidecar)
    during: dict[str, object] = {}
    real_hit = failpoints.hit

    def hit(name: str) -> None:
        if name == "rename.between_unit_moves" and not during:
            try:
                during["jpeg"] = run_item(engine, items[".JPG"])
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                during["jpeg"] = exc
        real_hit(name)

    monkeypatch.setattr(failpoints, "hit", hit)
    raw = run_item(engine, items[".CR2"])
    # Then the JPEG moved alone, and the raw's sidecar followed the raw
    assert isinstance(during["jpeg"], dict) and "sidecars" not in during["jpeg"], during
    assert raw["sidecars"] == [str(folder / "20210704_183005.xmp")]
    assert sorted(p.name for p in folder.iterdir()) == [
        "20210704_183005.cr2", "20210704_183005.jpg", "20210704_183005.xmp",
    ]  # fmt: skip
