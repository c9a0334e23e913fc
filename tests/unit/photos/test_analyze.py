"""analyze(): real facts about good photos, UnreadableImage for every kind of bad input."""

from __future__ import annotations

import builtins
import io
import json
import os
import re
import warnings
from datetime import datetime
from pathlib import Path

import piexif
import pytest
from PIL import Image, ImageFilter

from photojobs.testing import samples
from photos import analyze as analyze_module
from photos.analyze import analyze, hamming, near_duplicate_groups
from photos.errors import UnreadableImage
from photos.fileops import sha256_file

HEX16 = re.compile(r"^[0-9a-f]{16}$")
COLOR = re.compile(r"^#[0-9a-f]{6}$")


@pytest.fixture(scope="module")
def sample_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    dest = tmp_path_factory.mktemp("samples")
    paths = samples.generate_samples(dest, 12, seed=7, corrupt=3, near_duplicates=3, size=(640, 480))
    return dest, paths


def _jpeg(path: Path, img: Image.Image, exif: dict | None = None) -> Path:
    kwargs = {"exif": piexif.dump(exif)} if exif else {}
    img.save(path, "JPEG", quality=90, **kwargs)
    return path


def _exif(**zeroth_exif_gps: dict) -> dict:
    return {
        "0th": zeroth_exif_gps.get("zeroth", {}),
        "Exif": zeroth_exif_gps.get("sub", {}),
        "GPS": zeroth_exif_gps.get("gps", {}),
        "1st": {},
        "thumbnail": None,
    }


# -- good photos ---------------------------------------------------------------------------------
def test_analyze_reports_real_facts_for_a_generated_photo(sample_dir: tuple[Path, list[Path]]) -> None:
    # Given a generated camera JPEG
    _, paths = sample_dir
    path = paths[0]
    # When it is analysed
    facts = analyze(path)
    # Then the facts match the file and its EXIF
    assert facts["format"] == "JPEG"
    assert (facts["width"], facts["height"]) == (640, 480)
    assert facts["file_size"] == path.stat().st_size
    assert facts["sha256"] == sha256_file(path)
    assert (facts["make"], facts["model"]) in {(m, mo) for m, mo, _ in samples.CAMERAS}
    assert facts["orientation"] in {1, 3, 6, 8}
    assert datetime.fromisoformat(facts["taken"]).year >= 2015
    assert HEX16.match(facts["phash"]) and HEX16.match(facts["dhash"])
    assert facts["sharpness"] > 0
    assert 0 < facts["exposure"]["mean"] < 1
    assert 1 <= len(facts["colors"]) <= 3 and all(COLOR.match(c) for c in facts["colors"])
    # and the whole result survives a JSON round trip unchanged
    assert json.loads(json.dumps(facts)) == facts


def test_analyze_reads_orientation_camera_lens_date_and_southern_western_gps(tmp_path: Path) -> None:
    # Given a JPEG with orientation 6, camera, lens, capture time and GPS in Rio (S, W)
    exif = _exif(
        zeroth={
            piexif.ImageIFD.Orientation: 6,
            piexif.ImageIFD.Make: b"Canon",
            piexif.ImageIFD.Model: b"EOS R5",
        },
        sub={piexif.ExifIFD.DateTimeOriginal: b"2021:07:04 18:30:05", piexif.ExifIFD.LensModel: b"RF 50mm"},
        gps={
            piexif.GPSIFD.GPSLatitudeRef: b"S",
            piexif.GPSIFD.GPSLatitude: ((22, 1), (54, 1), (2448, 100)),
            piexif.GPSIFD.GPSLongitudeRef: b"W",
            piexif.GPSIFD.GPSLongitude: ((43, 1), (10, 1), (2244, 100)),
        },
    )
    path = _jpeg(tmp_path / "rio.jpg", Image.new("RGB", (200, 100), (90, 120, 200)), exif)
    # When analysed
    facts = analyze(path)
    # Then every EXIF fact is reported, with negative coordinates for S and W
    assert facts["orientation"] == 6
    assert (facts["make"], facts["model"], facts["lens"]) == ("Canon", "EOS R5", "RF 50mm")
    assert facts["taken"] == "2021-07-04T18:30:05"
    assert facts["gps"]["lat"] == pytest.approx(-22.9068, abs=1e-4)
    assert facts["gps"]["lon"] == pytest.approx(-43.1729, abs=1e-4)


def test_analyze_without_exif_gives_nones_and_orientation_1(tmp_path: Path) -> None:
    # Given a JPEG without EXIF / When analysed / Then EXIF facts are empty but present
    facts = analyze(_jpeg(tmp_path / "plain.jpg", Image.new("RGB", (64, 64), (10, 10, 10))))
    assert facts["orientation"] == 1
    assert [facts[k] for k in ("taken", "make", "model", "lens", "gps")] == [None] * 5


def test_analyze_ignores_an_invalid_capture_date(tmp_path: Path) -> None:
    # Given the EXIF "unknown date" convention / When analysed / Then taken is None
    exif = _exif(sub={piexif.ExifIFD.DateTimeOriginal: b"0000:00:00 00:00:00"})
    facts = analyze(_jpeg(tmp_path / "d.jpg", Image.new("RGB", (32, 32)), exif))
    assert facts["taken"] is None


def test_sharpness_is_lower_for_a_blurred_copy(tmp_path: Path) -> None:
    # Given a detailed photo and a blurred copy of it
    sharp = samples._pattern((800, 600))
    a = _jpeg(tmp_path / "sharp.jpg", sharp)
    b = _jpeg(tmp_path / "blurred.jpg", sharp.filter(ImageFilter.GaussianBlur(6)))
    # When both are analysed / Then the blurred one is measured less sharp
    assert analyze(b)["sharpness"] < analyze(a)["sharpness"] / 2


def test_exposure_reports_clipping(tmp_path: Path) -> None:
    # Given a white and a black image
    white = analyze(_jpeg(tmp_path / "w.jpg", Image.new("RGB", (100, 80), (255, 255, 255))))["exposure"]
    black = analyze(_jpeg(tmp_path / "b.jpg", Image.new("RGB", (100, 80), (0, 0, 0))))["exposure"]
    # Then mean luma and clipped shares reflect them
    assert white["mean"] > 0.98 and white["highlights_clipped"] > 0.99 and white["shadows_clipped"] == 0
    assert black["mean"] < 0.02 and black["shadows_clipped"] > 0.99 and black["highlights_clipped"] == 0


def test_dominant_colors_come_most_common_first(tmp_path: Path) -> None:
    # Given an image that is mostly red with a blue stripe
    img = Image.new("RGB", (300, 200), (220, 20, 20))
    img.paste((20, 20, 220), (0, 0, 300, 50))
    colors = analyze(_jpeg(tmp_path / "rb.jpg", img))["colors"]
    # Then red comes first, then blue
    r, g, b = (int(colors[0][i : i + 2], 16) for i in (1, 3, 5))
    assert r > 180 and g < 60 and b < 60
    r, g, b = (int(colors[1][i : i + 2], 16) for i in (1, 3, 5))
    assert b > 180 and r < 60


def test_phash_follows_the_displayed_orientation(tmp_path: Path) -> None:
    # Given the same scene stored rotated with orientation 6, and stored upright
    scene = samples._pattern((400, 300))
    upright = _jpeg(tmp_path / "upright.jpg", scene.transpose(Image.Transpose.ROTATE_270))
    tagged = _jpeg(tmp_path / "tagged.jpg", scene, _exif(zeroth={piexif.ImageIFD.Orientation: 6}))
    # When both are analysed / Then their perceptual hashes are (nearly) the same
    assert hamming(analyze(upright)["phash"], analyze(tagged)["phash"]) <= 4


@pytest.mark.parametrize("maker, fmt", [("png", "PNG"), ("tiff", "TIFF"), ("heic", "HEIF")])
def test_analyze_reads_png_tiff_and_heic(tmp_path: Path, maker: str, fmt: str) -> None:
    # Given a small PNG / TIFF / HEIC with a capture time
    path = getattr(samples, f"make_{maker}")(tmp_path / f"Été à Paris.{maker}")
    # When analysed / Then format, size and capture time are read
    facts = analyze(path)
    assert facts["format"] == fmt
    assert (facts["width"], facts["height"]) == (96, 64)
    assert facts["taken"] == "2020-05-17T10:30:00"


def test_analyze_handles_unicode_and_spaces_in_names(sample_dir: tuple[Path, list[Path]]) -> None:
    # Given the generated photo with accents and spaces in its name
    _, paths = sample_dir
    path = next(p for p in paths if p.name.startswith("Été à Paris"))
    # When analysed / Then it is read like any other
    assert analyze(path)["format"] == "JPEG"


# -- bad input -----------------------------------------------------------------------------------
def _assert_unreadable(path: Path, reason: str, **kwargs: int) -> UnreadableImage:
    with pytest.raises(UnreadableImage) as info:
        analyze(path, **kwargs)
    assert info.value.path == str(path)
    assert str(path) in str(info.value)
    assert reason in info.value.reason
    return info.value


def test_zero_byte_file_is_unreadable(sample_dir: tuple[Path, list[Path]]) -> None:
    # Given the generated zero-byte .jpg / When analysed / Then UnreadableImage says it is empty
    _, paths = sample_dir
    _assert_unreadable(next(p for p in paths if "empty" in p.name), "empty (0 bytes)")


def test_truncated_jpeg_is_unreadable(sample_dir: tuple[Path, list[Path]]) -> None:
    # Given the generated truncated JPEG / When analysed / Then the decode failure is reported
    _, paths = sample_dir
    _assert_unreadable(next(p for p in paths if "truncated" in p.name), "truncated")


def test_text_named_jpg_is_unreadable(sample_dir: tuple[Path, list[Path]]) -> None:
    # Given a text file named .jpg / When analysed / Then it is "not an image"
    _, paths = sample_dir
    _assert_unreadable(next(p for p in paths if "text" in p.name), "not an image file")


def test_missing_file_is_unreadable(tmp_path: Path) -> None:
    # Given no file / When analysed / Then "does not exist"
    _assert_unreadable(tmp_path / "gone.jpg", "does not exist")


def test_directory_is_unreadable(tmp_path: Path) -> None:
    # Given a directory named like a photo / When analysed / Then "is a directory"
    (tmp_path / "album.jpg").mkdir()
    _assert_unreadable(tmp_path / "album.jpg", "is a directory")


def test_unreadable_permissions_are_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a photo the process may not read (chmod 000; as root, which ignores modes, the
    # open() analyze uses is made to fail the way the kernel would)
    path = _jpeg(tmp_path / "secret.jpg", Image.new("RGB", (16, 16)))
    path.chmod(0)
    if os.geteuid() == 0:

        def denied(file, *args, **kwargs):
            if Path(file) == path:
                raise PermissionError(13, "Permission denied", str(file))
            return builtins.open(file, *args, **kwargs)

        monkeypatch.setattr(analyze_module, "open", denied, raising=False)
    try:
        # When analysed / Then UnreadableImage (not a bare PermissionError) says so
        _assert_unreadable(path, "permission denied")
    finally:
        path.chmod(0o644)


def test_other_os_errors_become_unreadable_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a read that fails with an I/O error (a failing disk)
    path = _jpeg(tmp_path / "disk.jpg", Image.new("RGB", (16, 16)))

    class FailingFile(io.BytesIO):
        def read(self, *args: object) -> bytes:
            raise OSError(5, "Input/output error")

    monkeypatch.setattr(analyze_module, "_open", lambda p: FailingFile())
    # When analysed / Then the error is mapped, with the OS reason
    _assert_unreadable(path, "Input/output error")


def test_decompression_bomb_is_refused_by_the_pixel_limit(tmp_path: Path) -> None:
    # Given a 2000x2000 PNG and a 1 MP limit
    path = tmp_path / "bomb.png"
    Image.new("L", (2000, 2000)).save(path)
    # When analysed / Then it is refused before decoding, naming size and limit
    error = _assert_unreadable(path, "decompression bomb", max_pixels=1_000_000)
    assert "2000x2000" in error.reason and "1000000" in error.reason


def test_pillow_decompression_bomb_error_is_mapped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given Pillow's own limit set far below the image (Pillow raises DecompressionBombError)
    path = tmp_path / "bomb.png"
    Image.new("L", (400, 400)).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    # When analysed / Then that error becomes UnreadableImage too
    _assert_unreadable(path, "decompression bomb")


def test_pillow_decompression_bomb_warning_as_error_is_mapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given Pillow warning about a large image and warnings turned into errors
    path = tmp_path / "big.png"
    Image.new("L", (400, 400)).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100_000)  # 160000 px: warning, not error
    # When analysed with bomb warnings turned into errors / Then UnreadableImage
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        _assert_unreadable(path, "decompression bomb")


# -- hashes and near duplicates ------------------------------------------------------------------
def test_hamming_counts_differing_bits() -> None:
    # Given hex hashes / When compared / Then the differing bits are counted
    assert hamming("0000", "0000") == 0
    assert hamming("000f", "0000") == 4
    assert hamming("ffffffffffffffff", "0000000000000000") == 64
    with pytest.raises(ValueError):
        hamming("00", "000")


def test_near_duplicate_groups_finds_the_generated_near_duplicates(
    sample_dir: tuple[Path, list[Path]],
) -> None:
    # Given 12 photos plus 3 altered copies of the first three (and corrupt files)
    _, paths = sample_dir
    hashes = []
    for p in paths:
        try:
            hashes.append((p.name, analyze(p)["phash"]))
        except UnreadableImage:
            hashes.append((p.name, None))
    # When grouped
    groups = near_duplicate_groups(hashes)
    # Then exactly the original/copy pairs are found, in input order
    names = [p.name for p in paths]
    assert groups == [[names[k], names[12 + k]] for k in range(3)]


def test_near_duplicate_groups_is_transitive_and_deterministic() -> None:
    # Given a chain a~b~c (a and c are 8 bits apart) and a far-away d
    items = [
        ("d", "ffffffffffffffff"),
        ("a", "0000000000000000"),
        ("b", "000000000000000f"),
        ("c", "00000000000000ff"),
    ]
    # When grouped twice / Then one group in input order, the same both times
    assert near_duplicate_groups(items, max_distance=4) == [["a", "b", "c"]]
    assert near_duplicate_groups(list(reversed(items)), max_distance=4) == [["c", "b", "a"]]
    assert near_duplicate_groups(items, max_distance=3) == []


def test_near_duplicate_groups_rejects_mixed_hash_lengths() -> None:
    # Given hashes of different lengths / When grouped / Then ValueError
    with pytest.raises(ValueError):
        near_duplicate_groups([("a", "00"), ("b", "0000")])


def test_near_duplicate_groups_handles_long_hashes() -> None:
    # Given 256-bit hashes differing in 2 bits / When grouped / Then they group
    a, b = "0" * 64, "0" * 62 + "03"
    assert near_duplicate_groups([(1, a), (2, b), (3, "f" * 64)]) == [[1, 2]]
