"""Unit tests for photos.rename: pattern validation, rendering, target resolution and collision plans."""

from __future__ import annotations

import os
import random
from datetime import datetime
from pathlib import Path

import pytest

from photos.errors import OutsideRoot, PatternError, PhotoError
from photos.rename import (
    FIELDS,
    NOTE_FILE_TIME,
    NOTE_UNKNOWN_CAMERA,
    RenderResult,
    camera_slug,
    plan_targets,
    render,
    resolve_target,
    sanitize_value,
    taken_now,
    validate_pattern,
    with_suffix,
)

SHA = "0123456789abcdef" * 4
EXAMPLE = "{taken:%Y/%m/%Y-%m-%d_%H%M%S}_{camera}{ext}"


def facts(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {
        "taken": "2024-03-09T14:05:06",
        "make": "Canon",
        "model": "Canon EOS R5",
        "lens": "RF24-105mm F4 L IS USM",
        "sha256": SHA,
        "width": 8192,
        "height": 5464,
        "format": "JPEG",
    }
    base.update(overrides)
    return base


# ------------------------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("/srv/{stem}{ext}", "absolute"),
        ("~/{stem}{ext}", "'~'"),
        ("../{stem}{ext}", "'..'"),
        ("a/../../{stem}{ext}", "'..'"),
        ("{taken:%Y/../%m}/{stem}{ext}", "'..'"),
        ("./{stem}{ext}", "'.'"),
        ("a//{stem}{ext}", "empty path component"),
        ("{stem}/", "empty path component"),
        ("a\\{stem}{ext}", "backslash"),
        ("a\x00{stem}", "control character"),
        ("{stem", "literal braces"),
        ("{stem!r}{ext}", "conversion"),
        ("{taken:%c}{ext}", "'%c'"),
        ("{taken:%Y-%}{ext}", "unsupported strftime"),
        ("{taken:year}{ext}", "no strftime directive"),
        ("{width:q}{ext}", "bad format spec 'q' for {width}"),
        ("{stem:{width}}", "nested field"),
        ("{}{ext}", "empty field"),
    ],
)
def test_bad_patterns_are_refused_with_a_specific_message(pattern: str, expected: str) -> None:
    # Given a malformed pattern
    # When it is validated
    with pytest.raises(PatternError) as caught:
        validate_pattern(pattern)
    # Then the message says what is wrong
    assert expected in str(caught.value)


def test_unknown_field_lists_the_valid_fields() -> None:
    # Given a pattern with a misspelt field
    # When it is validated
    with pytest.raises(PatternError) as caught:
        validate_pattern("{taken:%Y}/{camrea}{ext}")
    message = str(caught.value)
    # Then the unknown field and every valid field are named
    assert "{camrea}" in message
    for name in FIELDS:
        assert "{" + name + "}" in message


def test_seq_is_not_a_field_and_the_message_explains_collisions() -> None:
    # Given a pattern asking for a sequence number (not deterministic per photo)
    # When it is validated / rendered
    with pytest.raises(PatternError) as caught:
        render("{stem}_{seq}{ext}", facts(), Path("/p/a.jpg"), 0.0)
    # Then it is refused and the message points at automatic collision suffixes
    assert "{seq}" in str(caught.value)
    assert "_1, _2" in str(caught.value)


@pytest.mark.parametrize(
    "pattern",
    [EXAMPLE, "{camera}/{make} {model}/{lens}/{stem}{ext}", "{sha8}{ext}", "{{x}}_{width:05d}x{height}{ext}",
     "{taken}_{name}", "{taken:%H:%M}.{stem:.10}"],
)
def test_good_patterns_validate(pattern: str) -> None:
    # Given a well-formed pattern / When validated / Then nothing is raised
    validate_pattern(pattern)


# ------------------------------------------------------------------------------------------- rendering


def test_render_example_pattern() -> None:
    # Given full analysis facts for a .JPEG file
    # When the example pattern is rendered
    result = render(EXAMPLE, facts(), Path("/photos/IMG_0001.JPEG"), 0.0)
    # Then the capture time makes the folders, the camera is a slug, .jpeg becomes .jpg, no notes
    assert result == RenderResult("2024/03/2024-03-09_140506_canon-eos-r5.jpg", [])


def test_render_all_fields() -> None:
    # Given a pattern using every field
    pattern = "{make}|{model}|{lens}|{stem}|{name}|{ext}|{sha8}|{width:06d}|{height}|{taken}"
    # When rendered
    result = render(pattern, facts(), Path("/p/DSC 12.Jpeg"), 0.0)
    # Then each value is substituted as documented
    assert result.relpath.split("|") == [
        "Canon", "Canon EOS R5", "RF24-105mm F4 L IS USM", "DSC 12", "DSC 12.Jpeg", ".jpg", "01234567",
        "008192", "5464", "2024-03-09_140506",
    ]
    assert result.notes == []


def test_missing_capture_time_and_camera_fall_back_with_notes() -> None:
    # Given facts without capture time nor camera, and a known file time
    mtime = 1_700_000_000.0
    # When rendered
    result = render(EXAMPLE, facts(taken=None, make=None, model=None), Path("/p/a.png"), mtime)
    # Then the file time (local) and unknown-camera are used, each with a note
    expected_time = datetime.fromtimestamp(mtime).strftime("%Y/%m/%Y-%m-%d_%H%M%S")
    assert result.relpath == f"{expected_time}_unknown-camera.png"
    assert result.notes == [NOTE_FILE_TIME, NOTE_UNKNOWN_CAMERA]


def test_unreadable_capture_time_falls_back_and_says_so() -> None:
    # Given a garbage capture time
    result = render("{taken:%Y}/{stem}{ext}", facts(taken="not a date"), Path("/p/a.jpg"), 0.0)
    # Then the file time is used and the note quotes the bad value
    assert result.relpath == f"{datetime.fromtimestamp(0.0):%Y}/a.jpg"
    assert result.notes == ["unreadable capture time 'not a date': used file time"]


def test_exif_style_capture_time_is_accepted() -> None:
    result = render("{taken}", facts(taken="2023:12:31 23:59:58"), Path("/p/a.jpg"), 0.0)
    assert result == RenderResult("2023-12-31_235958", [])


def test_other_missing_fields_get_unknown_values_and_notes() -> None:
    # Given facts without lens and dimensions
    result = render("{lens}_{width}x{height}{ext}", facts(lens=None, width=None, height=None),
                    Path("/p/a.jpg"), 0.0)
    # Then each falls back and is noted
    assert result.relpath == "unknown-lens_unknown-widthxunknown-height.jpg"
    assert result.notes == ["no lens: used unknown-lens", "no width: used unknown-width",
                            "no height: used unknown-height"]


def test_only_make_or_only_model_is_used_without_a_note() -> None:
    assert render("{camera}", facts(model=None), Path("/p/a"), 0.0) == RenderResult("canon", [])
    assert render("{camera}", facts(make=None, model="X100V"), Path("/p/a"), 0.0) == RenderResult("x100v", [])


def test_unicode_and_spaces_are_kept() -> None:
    # Given a unicode file name and a lens with spaces
    original = Path("/p/Été à Zürich – 東京.HEIC")
    # When rendered
    result = render("{lens}/{stem}{ext}", facts(lens="Ｆ 50mm  ƒ/1.8"), original, 0.0)
    # Then letters and single spaces survive, the slash becomes '-', the extension is lower-cased
    assert result.relpath == "Ｆ 50mm ƒ-1.8/Été à Zürich – 東京.heic"


def test_separators_in_values_cannot_escape_or_add_folders() -> None:
    # Given hostile EXIF strings with separators, dots, NUL and control characters
    hostile = facts(make="../../etc", model="/passwd\x00\n", lens="..\\..\\win")
    # When rendered into a one-folder pattern
    result = render("{camera}/{make}_{model}_{lens}{ext}", hostile, Path("/p/..jpg"), 0.0)
    # Then the result still has exactly two components and no '..' component
    parts = result.relpath.split("/")
    assert len(parts) == 2
    assert ".." not in parts
    assert parts[0] == "etc-passwd"
    assert "\x00" not in result.relpath and "\n" not in result.relpath
    assert not any(part.startswith(".") for part in parts)


def test_leading_dots_in_names_are_stripped() -> None:
    result = render("{stem}{ext}", facts(), Path("/p/.hidden.jpg"), 0.0)
    assert result.relpath == "hidden.jpg"


def test_sanitize_value_rules() -> None:
    assert sanitize_value("  a/b\\c  ") == "a-b-c"
    assert sanitize_value("...x") == "x"
    assert sanitize_value("a\u202eb") == "ab"  # bidi override dropped
    assert sanitize_value("a\tb\nc") == "a b c"
    assert sanitize_value("e\u0301") == "\u00e9"  # NFC
    assert sanitize_value("x" * 100) == "x" * 64


def test_camera_slug_drops_repeated_make() -> None:
    assert camera_slug("NIKON CORPORATION", "NIKON Z 6_2") == "nikon-z-6-2"
    assert camera_slug("Apple", "iPhone 15 Pro") == "apple-iphone-15-pro"
    assert camera_slug("../", "//") is None


def test_missing_sha_for_sha8_is_a_photo_error_naming_the_file() -> None:
    with pytest.raises(PhotoError) as caught:
        render("{sha8}{ext}", facts(sha256=None), Path("/p/a.jpg"), 0.0)
    assert "/p/a.jpg" in str(caught.value) and "sha256" in str(caught.value)


def test_over_long_component_is_refused_naming_the_file() -> None:
    # Given a pattern that repeats long values into one component beyond 255 bytes
    with pytest.raises(PhotoError) as caught:
        render("{stem}{stem}{stem}", facts(), Path("/p/" + "é" * 150 + ".jpg"), 0.0)
    assert "255 bytes" in str(caught.value)


def test_file_without_extension_uses_format() -> None:
    assert render("{stem}{ext}", facts(), Path("/p/noext"), 0.0).relpath == "noext.jpg"
    assert render("{stem}{ext}", facts(format=None), Path("/p/noext"), 0.0).relpath == "noext"


# -------------------------------------------------------------------------------------- resolve_target


def test_resolve_target_inside_root(tmp_path: Path) -> None:
    target = resolve_target(tmp_path, "2024/03/a.jpg")
    assert target == tmp_path.resolve() / "2024" / "03" / "a.jpg"


@pytest.mark.parametrize("relpath", ["../x.jpg", "a/../../x.jpg", "/etc/passwd", "", "a//b"])
def test_resolve_target_refuses_unsafe_relpaths(tmp_path: Path, relpath: str) -> None:
    with pytest.raises(OutsideRoot):
        resolve_target(tmp_path, relpath)


def test_resolve_target_refuses_escape_through_a_symlinked_folder(tmp_path: Path) -> None:
    # Given a folder inside the root that is a symlink to somewhere outside it
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    os.symlink(outside, root / "2024")
    # When a target under that folder is resolved
    with pytest.raises(OutsideRoot) as caught:
        resolve_target(root, "2024/03/a.jpg")
    # Then it is refused, saying what is wrong without saying where the symlink leads
    assert "outside the root" in str(caught.value)
    assert str(outside) not in str(caught.value) and str(tmp_path) not in str(caught.value)


def test_resolve_target_refuses_a_final_symlink_pointing_outside(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(tmp_path / "victim.jpg", root / "a.jpg")
    with pytest.raises(OutsideRoot):
        resolve_target(root, "a.jpg")


def test_resolve_target_allows_symlinks_that_stay_inside(tmp_path: Path) -> None:
    # Given a symlinked root and an internal symlinked folder
    real = tmp_path / "real"
    (real / "y").mkdir(parents=True)
    os.symlink(real, tmp_path / "link")
    os.symlink(real / "y", real / "alias")
    # When resolving through them / Then the target is under the real root
    assert resolve_target(tmp_path / "link", "alias/a.jpg") == real.resolve() / "y" / "a.jpg"


# ----------------------------------------------------------------------------------- suffix and plans


@pytest.mark.parametrize(
    ("relpath", "n", "expected"),
    [
        ("a/b/2024-01-01_120000_canon.jpg", 0, "a/b/2024-01-01_120000_canon.jpg"),
        ("a/b/2024-01-01_120000_canon.jpg", 1, "a/b/2024-01-01_120000_canon_1.jpg"),
        ("x.tar.gz", 2, "x.tar_2.gz"),
        ("dir/noext", 3, "dir/noext_3"),
        ("2024.01.01 party", 1, "2024.01.01 party_1"),
    ],
)
def test_with_suffix(relpath: str, n: int, expected: str) -> None:
    assert with_suffix(relpath, n) == expected


def test_with_suffix_refuses_negative() -> None:
    with pytest.raises(ValueError):
        with_suffix("a.jpg", -1)


def test_many_photos_in_the_same_second_get_deterministic_suffixes_independent_of_order() -> None:
    # Given 30 photos from the same camera in the same second (same rendered name) plus two others
    same = "2024/03/2024-03-09_140506_canon-eos-r5.jpg"
    entries = [(f"/src/IMG_{i:04d}.jpg", same) for i in range(30)]
    entries += [("/src/other.jpg", "2024/03/other.jpg"), ("/src/z.jpg", same.replace(".jpg", "_3.jpg"))]
    # When planned in several different input orders
    plans = []
    for seed in range(5):
        shuffled = entries[:]
        random.Random(seed).shuffle(shuffled)
        plans.append(plan_targets(shuffled, taken=set()))
    # Then every plan is identical, names are unique, and suffixes follow key order
    assert all(plan == plans[0] for plan in plans)
    plan = plans[0]
    assert len(set(plan.values())) == len(entries)
    assert plan["/src/IMG_0000.jpg"] == same
    assert plan["/src/IMG_0001.jpg"] == same.replace(".jpg", "_1.jpg")
    assert plan["/src/IMG_0002.jpg"] == same.replace(".jpg", "_2.jpg")
    assert plan["/src/IMG_0003.jpg"] == same.replace(".jpg", "_3.jpg")
    assert plan["/src/other.jpg"] == "2024/03/other.jpg"
    # and the photo whose own name was '_3' gets the next free suffix of that name
    assert plan["/src/z.jpg"] == same.replace(".jpg", "_3_1.jpg")


def test_plan_never_uses_taken_names() -> None:
    # Given names that already exist at the target
    taken = {"a.jpg", "a_1.jpg"}
    # When two photos want a.jpg
    plan = plan_targets([(2, "a.jpg"), (1, "a.jpg")], taken)
    # Then they skip the taken names, lowest key first
    assert plan == {1: "a_2.jpg", 2: "a_3.jpg"}


def test_plan_case_insensitive_collisions() -> None:
    entries = [("k1", "Photo.JPG"), ("k2", "photo.jpg")]
    folded = plan_targets(entries, {"PHOTO.jpg"}, case_insensitive=True)
    assert folded == {"k1": "Photo_1.JPG", "k2": "photo_2.jpg"}
    assert plan_targets(entries, {"PHOTO.jpg"}) == {"k1": "Photo.JPG", "k2": "photo.jpg"}


def test_plan_treats_nfc_and_nfd_names_as_the_same() -> None:
    plan = plan_targets([("k", "e\u0301.jpg")], {"\u00e9.jpg"})
    assert plan == {"k": "e\u0301_1.jpg"}


def test_plan_refuses_duplicate_keys() -> None:
    with pytest.raises(ValueError):
        plan_targets([("k", "a.jpg"), ("k", "b.jpg")], set())


def test_taken_now_reads_the_capture_time_the_file_has_now(tmp_path: Path) -> None:
    # Given a camera file, a copy of it shifted across midnight, a PNG without EXIF and a text file
    from datetime import timedelta

    from PIL import Image

    from photos.exif import ExifEdit, write_metadata
    from tests import clock_photos

    photo = clock_photos.camera_jpeg(tmp_path / "p.jpg", "pentax", "2004:10:02 23:29:52")
    shifted = tmp_path / "shifted.jpg"
    write_metadata(photo, shifted, ExifEdit(shift=timedelta(hours=1)))
    png = tmp_path / "plain.png"
    Image.new("RGB", (8, 8)).save(png)
    text = tmp_path / "notes.txt"
    text.write_text("not a photo")
    # When the capture time is read from each / Then it is the file's own, after the shift
    assert taken_now(photo) == "2004-10-02T23:29:52"
    assert taken_now(shifted, default="2004-10-02T23:29:52") == "2004-10-03T00:29:52"
    # and a file without one (in any source: a PNG, a text file) has none, while a file whose
    # metadata cannot be read at all (gone) keeps what the caller knew
    assert taken_now(png, default="2001-01-01T00:00:00") is None
    assert taken_now(text, default="2001-01-01T00:00:00") is None
    assert taken_now(tmp_path / "gone.jpg", default="2001-01-01T00:00:00") == "2001-01-01T00:00:00"


@pytest.mark.parametrize(
    "pattern",
    ["%:9d../%:9d../escaped/{stem}{ext}", "a%d{ext}", "{stem}%f{ext}", "{taken:%Y%%d}/{stem}", "%%{ext}"],
)
def test_a_percent_that_is_not_a_strftime_directive_is_refused(pattern: str) -> None:
    # Given a pattern with a '%' outside {taken:...}'s directives (exiftool's format codes, '%%')
    # When it is validated / Then it is refused with a message saying where '%' may appear
    with pytest.raises(PatternError, match="%"):
        validate_pattern(pattern)
