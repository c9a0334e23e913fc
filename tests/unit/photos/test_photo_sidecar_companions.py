"""Sidecars of any photo (not only raws) are its companions: ``NAME.EXT.xmp`` and ``NAME.xmp``; a raw
of the stem owns ``NAME.xmp`` before any other photo; a move never changes who owns a sidecar."""

from __future__ import annotations

from pathlib import Path

from photos.sidecar import changes_an_owner, companion_target, companions, owner_of


def touch(folder: Path, *names: str) -> None:
    for name in names:
        (folder / name).write_bytes(b"x")


def test_a_jpegs_sidecars_are_its_companions_and_a_raw_owns_the_stem_one(tmp_path: Path) -> None:
    # Given a JPEG with both sidecar styles, an AVIF with a Lightroom one, and a RAW+JPEG pair
    touch(tmp_path, "IMG_1.jpg", "IMG_1.xmp", "IMG_1.jpg.xmp", "IMG_2.avif", "IMG_2.xmp",
          "IMG_3.CR2", "IMG_3.jpg", "IMG_3.xmp")  # fmt: skip
    names = {p.name.casefold() for p in tmp_path.iterdir()}
    # Then each photo's companions are its own, and the pair's IMG_3.xmp is the raw's
    assert [p.name for p in companions(tmp_path / "IMG_1.jpg")] == ["IMG_1.jpg.xmp", "IMG_1.xmp"]
    assert [p.name for p in companions(tmp_path / "IMG_2.avif")] == ["IMG_2.xmp"]
    assert [p.name for p in companions(tmp_path / "IMG_3.CR2")] == ["IMG_3.xmp"]
    assert companions(tmp_path / "IMG_3.jpg") == []
    assert owner_of(tmp_path / "IMG_1.xmp", names) == "img_1.jpg"
    assert owner_of(tmp_path / "IMG_3.xmp", names) == "img_3.cr2"
    # and a sidecar follows its photo's new name
    new = tmp_path / "2021" / "x.jpg"
    assert companion_target(tmp_path / "IMG_1.xmp", tmp_path / "IMG_1.jpg", new) == new.with_name("x.xmp")


def test_a_move_never_gives_a_sidecar_another_owner(tmp_path: Path) -> None:
    # Given a folder with a raw X.NEF, and a PNG Y.png with its Lightroom sidecar Y.xmp
    touch(tmp_path, "X.NEF", "Y.png", "Y.xmp")
    src = tmp_path / "src"
    src.mkdir()
    # Then a JPEG landing as X.jpg with its X.xmp would hand its sidecar to the raw: refused
    assert changes_an_owner(tmp_path / "X.jpg", [tmp_path / "X.xmp"], [src / "a.jpg", src / "a.xmp"])
    # and a JPEG landing as Y.jpg (sorting before Y.png) would take Y.png's sidecar: refused
    assert changes_an_owner(tmp_path / "Y.jpg", [], [src / "b.jpg"])
    # while landing as Z.jpg with Z.xmp, or as X.jpg without a sidecar, changes nobody's
    assert not changes_an_owner(tmp_path / "Z.jpg", [tmp_path / "Z.xmp"], [src / "c.jpg", src / "c.xmp"])
    assert not changes_an_owner(tmp_path / "X.jpg", [], [src / "d.jpg"])
