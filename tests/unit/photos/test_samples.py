"""generate_samples(): deterministic, varied, realistic sample photos (and broken ones)."""

from __future__ import annotations

import hashlib
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
from PIL import Image

from photojobs.testing import samples
from photos.analyze import analyze, hamming
from photos.errors import UnreadableImage


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], list[dict | None]]:
    dest = tmp_path_factory.mktemp("gen")
    paths = samples.generate_samples(dest, 30, seed=11, corrupt=3, near_duplicates=4, size=(400, 300))
    facts: list[dict | None] = []
    for p in paths:
        try:
            facts.append(analyze(p))
        except UnreadableImage:
            facts.append(None)
    return paths, facts


def _digest(paths: list[Path]) -> list[tuple[str, str]]:
    return [(p.name, hashlib.sha256(p.read_bytes()).hexdigest()) for p in paths]


def test_same_seed_gives_the_same_files_and_another_seed_different_ones(tmp_path: Path) -> None:
    # Given two runs with seed 5 and one with seed 6
    a = samples.generate_samples(tmp_path / "a", 5, seed=5, corrupt=3, near_duplicates=1, size=(200, 150))
    b = samples.generate_samples(tmp_path / "b", 5, seed=5, corrupt=3, near_duplicates=1, size=(200, 150))
    c = samples.generate_samples(tmp_path / "c", 5, seed=6, size=(200, 150))
    # Then the same seed gives byte-identical files, another seed different photos
    assert _digest(a) == _digest(b)
    assert {h for _, h in _digest(c)}.isdisjoint({h for _, h in _digest(a)[:5]})


def test_counts_order_and_names(generated: tuple[list[Path], list[dict | None]]) -> None:
    # Given 30 photos, 4 near-duplicates and 3 corrupt files
    paths, _ = generated
    # Then all 37 exist, originals first, then copies named after their original, then corrupt files
    assert len(paths) == 37 and len(set(paths)) == 37 and all(p.exists() for p in paths)
    for k in range(4):
        assert paths[30 + k].name == f"{paths[k].stem} (edit {k + 1}).jpg"
    assert [p.name for p in paths[34:]] == [
        "corrupt_empty_01.jpg",
        "corrupt_truncated_02.jpg",
        "corrupt_text_03.jpg",
    ]
    names = [p.name for p in paths[:30]]
    # and some names have spaces and non-ASCII characters, and extensions vary in case
    assert "Été à Paris 06.jpg" in names
    assert any(" " in n and not n.isascii() for n in names)
    assert {Path(n).suffix for n in names} >= {".jpg", ".JPG", ".jpeg"}


def test_corrupt_files_are_empty_truncated_and_text(generated: tuple[list[Path], list[dict | None]]) -> None:
    # Given the three corrupt files
    paths, facts = generated
    empty, truncated, text = paths[34:]
    # Then they are what they claim and none can be analysed
    assert empty.stat().st_size == 0
    assert truncated.read_bytes()[:3] == b"\xff\xd8\xff" and not truncated.read_bytes().endswith(b"\xff\xd9")
    assert text.read_bytes().startswith(b"This is not a photo")
    assert facts[34:] == [None, None, None]
    assert all(f is not None for f in facts[:34])


def test_photos_vary_in_camera_orientation_gps_and_date(
    generated: tuple[list[Path], list[dict | None]],
) -> None:
    # Given the 30 originals' facts
    _, facts = generated
    originals = [f for f in facts[:30] if f]
    # Then cameras, orientations and GPS vary, dates span years, and some share a second
    assert len({(f["make"], f["model"]) for f in originals}) >= 4
    assert {f["orientation"] for f in originals} <= {1, 3, 6, 8}
    assert len({f["orientation"] for f in originals}) >= 2
    with_gps = [f for f in originals if f["gps"]]
    assert 0 < len(with_gps) < len(originals)
    assert all(-90 <= f["gps"]["lat"] <= 90 and -180 <= f["gps"]["lon"] <= 180 for f in with_gps)
    years = {datetime.fromisoformat(f["taken"]).year for f in originals}
    assert max(years) - min(years) >= 3
    assert max(Counter(f["taken"] for f in originals).values()) >= 2
    lens_of = {(make, model): lens for make, model, lens in samples.CAMERAS}
    assert all(f["lens"] == lens_of[(f["make"], f["model"])] for f in originals)


def test_originals_have_distinct_perceptual_hashes(generated: tuple[list[Path], list[dict | None]]) -> None:
    # Given the 30 originals' perceptual hashes
    _, facts = generated
    hashes = [f["phash"] for f in facts[:30] if f]
    # Then no two are near each other
    closest = min(hamming(a, b) for i, a in enumerate(hashes) for b in hashes[i + 1 :])
    assert closest > 6


def test_near_duplicates_are_close_to_their_original(generated: tuple[list[Path], list[dict | None]]) -> None:
    # Given the 4 near-duplicates
    paths, facts = generated
    for k in range(4):
        original, copy = facts[k], facts[30 + k]
        # Then each is smaller, a different file, but within a few bits of its original's phash
        assert copy["sha256"] != original["sha256"]
        assert copy["width"] < original["width"]
        assert hamming(copy["phash"], original["phash"]) <= 6
        # and keeps its original's EXIF
        assert (copy["taken"], copy["model"]) == (original["taken"], original["model"])


def test_jpeg_quality_and_size_are_realistic(generated: tuple[list[Path], list[dict | None]]) -> None:
    # Given an original / Then it is a 400x300 JPEG of a plausible size for quality ~85
    paths, facts = generated
    assert (facts[0]["width"], facts[0]["height"]) == (400, 300)
    assert 10_000 < paths[0].stat().st_size < 200_000


def test_the_demos_two_hundred_photos_are_all_generated_at_full_size(tmp_path: Path) -> None:
    # Given the demo's workload: 200 photos at 1600x1200
    # When generated
    paths = samples.generate_samples(tmp_path, 200)
    # Then they are all there, distinct files, at full size (how long it takes is not asserted: no
    # timing assertions in tests)
    assert len(paths) == 200 and len(set(paths)) == 200 and all(p.is_file() for p in paths)
    with Image.open(paths[-1]) as img:
        assert img.size == (1600, 1200)


@pytest.mark.parametrize("maker, fmt", [("png", "PNG"), ("tiff", "TIFF"), ("heic", "HEIF")])
def test_small_format_helpers(tmp_path: Path, maker: str, fmt: str) -> None:
    # Given / When a helper writes its format / Then Pillow reads that format back at that size
    path = getattr(samples, f"make_{maker}")(tmp_path / f"x.{maker}", (40, 30))
    with Image.open(path) as img:
        assert (img.format, img.size) == (fmt, (40, 30))


def test_invalid_arguments_are_refused(tmp_path: Path) -> None:
    # Given negative counts, or near-duplicates without originals / Then ValueError
    with pytest.raises(ValueError):
        samples.generate_samples(tmp_path, -1)
    with pytest.raises(ValueError):
        samples.generate_samples(tmp_path, 0, near_duplicates=1)
