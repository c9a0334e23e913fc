"""Metadata writing through exiftool (JPEG, PNG, TIFF, HEIC): read-back, pixels kept, errors, exiftool."""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import piexif
import pillow_heif
import pytest
from PIL import Image

from photojobs.testing import samples
from photos import exif as exif_module
from photos.errors import InvalidParameter, NeedsExiftool, PhotoError, UnreadableImage
from photos.exif import (
    ExifEdit,
    jpeg_scan_data,
    parse_shift,
    read_metadata,
    read_metadata_exiftool,
    write_metadata,
)
from photos.exiftool import ExifTool, ExifToolDied
from photos.fileops import staged_path
from tests.fixtures import camera_corpus
from tests.support import unavailable

pillow_heif.register_heif_opener()

EDIT = ExifEdit(
    keywords=["beach", "Été", "2024", "1.50"],
    description="Sunset at the pier\nsecond line with a \\ backslash",
    rating=4,
    artist="Zoë Ångström",
    copyright="© 2024 Zoë",
    shift=timedelta(hours=1, minutes=30),
)


def _pixels(path: Path) -> np.ndarray:
    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def camera_jpeg(tmp_path: Path) -> Path:
    """A generated camera JPEG (EXIF with camera, dates, maybe GPS) with spaces/accents in its name."""
    path = samples.generate_samples(tmp_path / "in", 6, seed=3, size=(320, 240))[5]
    assert path.name.startswith("Été à Paris")
    return path


def _heic_works() -> bool:
    return bool(pillow_heif.libheif_info().get("HEIF"))


# -- parse_shift and ExifEdit --------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ("+1h", timedelta(hours=1)),
        ("-30m", timedelta(minutes=-30)),
        ("+1d2h", timedelta(days=1, hours=2)),
        ("+90s", timedelta(seconds=90)),
        ("2h30m", timedelta(hours=2, minutes=30)),
        (" -1d2h3m4s ", -timedelta(days=1, hours=2, minutes=3, seconds=4)),
    ],
)
def test_parse_shift_accepts_signed_unit_strings(text: str, expected: timedelta) -> None:
    # Given a shift string / When parsed / Then the timedelta it means
    assert parse_shift(text) == expected


@pytest.mark.parametrize("text", ["", "+", "1x", "+1h1h", "+2m1h", "1.5h", "+-1h", "h", "+999999999d"])
def test_parse_shift_rejects_malformed_strings(text: str) -> None:
    # Given a malformed shift / When parsed / Then InvalidParameter with an example of the syntax
    with pytest.raises(InvalidParameter, match=r"shift"):
        parse_shift(text)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rating": 6},
        {"rating": -1},
        {"rating": True},
        {"keywords": "beach"},
        {"keywords": ["a;b"]},
        {"keywords": ["tab\tbed"]},
        {"description": "bell\x07"},
        {"shift": "+1 hour"},
        {"shift": timedelta(milliseconds=5)},
        {"artist": 5},
    ],
)
def test_exif_edit_validates_its_fields(kwargs: dict) -> None:
    # Given an invalid field / When an edit is built / Then InvalidParameter
    with pytest.raises(InvalidParameter):
        ExifEdit(**kwargs)


def test_exif_edit_from_params_parses_and_rejects_unknown_keys() -> None:
    # Given job parameters / When converted / Then shift is parsed, keywords cleaned, unknowns refused
    edit = ExifEdit.from_params({"shift": "-30m", "keywords": [" a ", "b", "a", ""]})
    assert edit.shift == timedelta(minutes=-30)
    assert edit.keywords == ["a", "b"]
    assert not edit.is_empty() and ExifEdit().is_empty() and ExifEdit(shift=timedelta(0)).is_empty()
    with pytest.raises(InvalidParameter, match="titel"):
        ExifEdit.from_params({"titel": "typo"})
    # and analysis results have no way into the photo any more
    with pytest.raises(InvalidParameter, match="facts"):
        ExifEdit.from_params({"facts": {"sharpness": 1.0}})


# -- JPEG ----------------------------------------------------------------------------
def test_jpeg_edit_is_lossless_and_reads_back(camera_jpeg: Path) -> None:
    # Given a camera JPEG and a staged destination
    before = read_metadata(camera_jpeg)
    src_sha = _sha(camera_jpeg)
    dst = staged_path(camera_jpeg, "item1-t1")
    # When metadata is written
    write_metadata(camera_jpeg, dst, EDIT)
    # Then the decoded pixels are identical and so is every byte from the SOS marker on
    assert np.array_equal(_pixels(camera_jpeg), _pixels(dst))
    assert jpeg_scan_data(dst.read_bytes()) == jpeg_scan_data(camera_jpeg.read_bytes())
    assert dst.read_bytes() != camera_jpeg.read_bytes()
    # and the source is untouched
    assert _sha(camera_jpeg) == src_sha
    # and everything written reads back, the capture time shifted by 1h30
    after = read_metadata(dst)
    assert after["keywords"] == ["beach", "Été", "2024", "1.50"]
    assert after["description"] == EDIT.description
    assert (after["rating"], after["artist"], after["copyright"]) == (4, "Zoë Ångström", "© 2024 Zoë")
    assert after["taken"] == _plus(before["taken"], EDIT.shift)
    # and the file keeps its modification time
    assert dst.stat().st_mtime_ns == camera_jpeg.stat().st_mtime_ns


def _plus(iso: str, delta: timedelta) -> str:
    return (datetime.fromisoformat(iso) + delta).isoformat()


def test_jpeg_keywords_are_where_photo_apps_read_them(camera_jpeg: Path) -> None:
    # Given a camera JPEG
    dst = staged_path(camera_jpeg, "item1-t1")
    # When keywords and the other fields are written
    write_metadata(camera_jpeg, dst, EDIT)
    out = ExifTool.shared().execute("-j", "-G1", "-XMP:all", "-IPTC:all", "-EXIF:XPKeywords", str(dst))
    tags = json.loads(out, parse_int=str, parse_float=str)[0]
    # Then exiftool sees them as XMP dc:subject and IPTC Keywords (Lightroom, digiKam, Immich)
    assert tags["XMP-dc:Subject"] == tags["IPTC:Keywords"] == ["beach", "Été", "2024", "1.50"]
    assert tags["IPTC:CodedCharacterSet"] == "UTF8"
    assert tags["IFD0:XPKeywords"] == "beach;Été;2024;1.50"
    assert tags["XMP-dc:Description"] == tags["IPTC:Caption-Abstract"] == EDIT.description
    assert tags["XMP-dc:Creator"] == tags["IPTC:By-line"] == "Zoë Ångström"
    assert tags["XMP-dc:Rights"] == tags["IPTC:CopyrightNotice"] == "© 2024 Zoë"
    assert str(tags["XMP-xmp:Rating"]) == "4"
    assert read_metadata_exiftool is read_metadata


def test_jpeg_edit_keeps_camera_tags_and_shifts_all_three_dates(camera_jpeg: Path) -> None:
    # Given a camera JPEG with Make/Model/Lens and three date tags
    dst = staged_path(camera_jpeg, "t1")
    old = piexif.load(str(camera_jpeg))
    # When shifted back by 1 day and 2 hours
    write_metadata(camera_jpeg, dst, ExifEdit(shift=parse_shift("-1d2h")))
    new = piexif.load(str(dst))
    # Then camera tags are kept and DateTimeOriginal, DateTimeDigitized and DateTime all moved
    for ifd, tag in (("0th", piexif.ImageIFD.Make), ("0th", piexif.ImageIFD.Model), ("0th", 274)):
        assert new[ifd][tag] == old[ifd][tag]
    assert new["GPS"] == old["GPS"]
    for ifd, tag in (("Exif", 36867), ("Exif", 36868), ("0th", 306)):
        was = datetime.strptime(old[ifd][tag].decode(), "%Y:%m:%d %H:%M:%S")
        now = datetime.strptime(new[ifd][tag].decode(), "%Y:%m:%d %H:%M:%S")
        assert was - now == timedelta(days=1, hours=2)


def test_jpeg_without_exif_gets_no_exif_only_xmp_and_iptc(tmp_path: Path) -> None:
    # Given a JPEG with a JFIF APP0 segment and no EXIF
    src = tmp_path / "plain.jpg"
    samples._pattern((120, 80)).save(src, "JPEG", quality=90)
    assert read_metadata(src)["keywords"] == []
    dst = staged_path(src, "t1")
    # When keywords, a rating, a description and an artist are written
    write_metadata(src, dst, ExifEdit(keywords=["new"], rating=5, description="d", artist="Ann"))
    data = dst.read_bytes()
    # Then JFIF stays first, no EXIF block is invented, the image data is unchanged
    assert data[2:4] == b"\xff\xe0" and data[6:11] == b"JFIF\x00"
    assert b"Exif\x00\x00" not in data[: jpeg_scan_data(data) and data.find(jpeg_scan_data(data))]
    assert jpeg_scan_data(data) == jpeg_scan_data(src.read_bytes())
    groups = {key.split(":", 1)[0] for key in _tags(dst)}
    assert not groups & {"IFD0", "ExifIFD", "IFD1"}, groups
    # and the values are in XMP and IPTC, where photo apps read them
    assert (read_metadata(dst)["keywords"], read_metadata(dst)["rating"]) == (["new"], 5)
    assert _tags(dst)["IPTC:Keywords"] == "new" and _tags(dst)["IPTC:By-line"] == "Ann"


def _tags(path: Path) -> dict[str, object]:
    out = ExifTool.shared().execute("-j", "-G1", "-a", os.path.abspath(path))
    return json.loads(out, parse_int=str, parse_float=str)[0]


def test_empty_values_clear_and_none_keeps(camera_jpeg: Path) -> None:
    # Given a JPEG already carrying keywords and a description
    first = staged_path(camera_jpeg, "t1")
    write_metadata(camera_jpeg, first, ExifEdit(keywords=["a", "b"], description="desc", artist="Ann"))
    second = staged_path(camera_jpeg, "t2")
    # When keywords are replaced by none, the description cleared and artist left as None
    write_metadata(first, second, ExifEdit(keywords=[], keywords_mode="replace", description=""))
    meta = read_metadata(second)
    # Then the cleared ones are gone and the untouched one remains
    assert meta["keywords"] == [] and meta["description"] is None
    assert meta["artist"] == "Ann"


def test_jpeg_with_a_makernote_is_edited_by_exiftool_losslessly(tmp_path: Path) -> None:
    # Given a JPEG whose EXIF holds a Canon-style MakerNote (offsets counted from the TIFF header)
    src = camera_corpus.make_corpus(tmp_path / "in")["jpeg-makernote"]
    dump = ["-j", "-G1", "-b", "-MakerNotes:all"]
    maker_before = ExifTool.shared().execute(*dump, str(src)).replace(str(src), "")
    dst = staged_path(src, "t1")
    # When metadata is written
    write_metadata(src, dst, ExifEdit(keywords=["kw"], description="via exiftool"))
    # Then the image data is identical, the edit reads back and the MakerNote still reads the same
    assert jpeg_scan_data(dst.read_bytes()) == jpeg_scan_data(src.read_bytes())
    assert np.array_equal(_pixels(src), _pixels(dst))
    meta = read_metadata(dst)
    assert (meta["keywords"], meta["description"]) == (["kw"], "via exiftool")
    assert "PowerShot" in maker_before
    assert ExifTool.shared().execute(*dump, str(dst)).replace(str(dst), "") == maker_before


def test_a_file_exiftool_warns_about_is_refused_untouched(camera_jpeg: Path, tmp_path: Path) -> None:
    # Given a JPEG whose MakerNote exiftool cannot parse (so it could not fix its offsets)
    exif = piexif.load(str(camera_jpeg))
    exif["Exif"][piexif.ExifIFD.MakerNote] = b"Nikon\x00\x02\x10\x00\x00" + bytes(range(40))
    src = tmp_path / "maker note.jpg"
    piexif.insert(piexif.dump(exif), camera_jpeg.read_bytes(), str(src))
    sha = _sha(src)
    dst = staged_path(src, "t1")
    # When metadata is written / Then a PhotoError names the file and exiftool's warning
    with pytest.raises(PhotoError, match="Maker notes could not be parsed") as info:
        write_metadata(src, dst, ExifEdit(keywords=["kw"]))
    assert info.value.path == str(src)
    # and nothing was written, the photo is untouched
    assert not dst.exists() and _sha(src) == sha


def test_a_corrupt_file_is_refused_untouched(tmp_path: Path) -> None:
    # Given a "JPEG" whose EXIF segment is garbage after a valid header
    src = tmp_path / "Fichier abîmé.jpg"
    samples._pattern((32, 32)).save(src, "JPEG")
    data = src.read_bytes()
    junk = b"Exif\x00\x00II*\x00\xff\xff\xff\x7f" + bytes(60)
    src.write_bytes(data[:2] + b"\xff\xe1" + (len(junk) + 2).to_bytes(2, "big") + junk + data[2:])
    sha = _sha(src)
    dst = staged_path(src, "t1")
    # When metadata is written / Then a PhotoError names the file, nothing is written
    with pytest.raises(PhotoError) as info:
        write_metadata(src, dst, ExifEdit(keywords=["kw"]))
    assert info.value.path == str(src) and "exiftool" in info.value.reason
    assert not dst.exists() and _sha(src) == sha


def test_invalid_date_cannot_be_shifted(tmp_path: Path) -> None:
    # Given a JPEG whose DateTimeOriginal is garbage
    src = tmp_path / "bad date.jpg"
    exif = {"0th": {}, "Exif": {piexif.ExifIFD.DateTimeOriginal: b"yesterday noon"}, "1st": {}, "GPS": {}}
    samples._pattern((32, 32)).save(src, "JPEG", exif=piexif.dump(exif))
    # When shifted / Then PhotoError names the tag and describes the value without quoting the
    # file's bytes (rule 11), and no output is written
    dst = staged_path(src, "t1")
    with pytest.raises(PhotoError, match="DateTimeOriginal.*14 characters are not a date/time") as err:
        write_metadata(src, dst, ExifEdit(shift=timedelta(hours=1)))
    assert "yesterday" not in str(err.value)
    assert not dst.exists()


# -- PNG, TIFF, HEIC through exiftool ------------------------------------------------------------
@pytest.mark.parametrize("maker", ["png", "tiff", "heic"])
def test_exiftool_formats_keep_pixels_and_read_back(tmp_path: Path, maker: str) -> None:
    if maker == "heic" and not _heic_works():
        unavailable("pillow-heif has no HEVC encoder here (make installs the pinned pillow-heif)")
    # Given a PNG / TIFF / HEIC with spaces and accents in its name and a capture time
    src = getattr(samples, f"make_{maker}")(tmp_path / f"Été à Paris.{maker}")
    src_sha = _sha(src)
    dst = staged_path(src, "item7-t1")
    # When metadata is written
    write_metadata(src, dst, EDIT)
    # Then the decoded pixels are identical, the source untouched and every field reads back
    assert np.array_equal(_pixels(src), _pixels(dst))
    assert _sha(src) == src_sha
    meta = read_metadata(dst)
    assert meta["keywords"] == ["beach", "Été", "2024", "1.50"]
    assert meta["description"] == EDIT.description
    assert (meta["rating"], meta["artist"], meta["copyright"]) == (4, "Zoë Ångström", "© 2024 Zoë")
    assert meta["taken"] == "2020-05-17T12:00:00"


def test_keywords_replace_previous_ones_only_when_asked(tmp_path: Path) -> None:
    # Given a PNG that already has keywords
    src = samples.make_png(tmp_path / "a.png")
    first = staged_path(src, "t1")
    write_metadata(src, first, ExifEdit(keywords=["old1", "old2"]))
    # When new keywords are written by default / Then they are added after the old ones
    added = staged_path(src, "t2")
    write_metadata(first, added, ExifEdit(keywords=["new", "old1"]))
    assert read_metadata(added)["keywords"] == ["old1", "old2", "new"]
    # When they are written with keywords_mode=replace / Then only the new ones remain
    replaced = staged_path(src, "t3")
    write_metadata(first, replaced, ExifEdit(keywords=["new"], keywords_mode="replace"))
    assert read_metadata(replaced)["keywords"] == ["new"]


def test_exiftool_output_replaces_a_stale_staged_file(tmp_path: Path) -> None:
    # Given a stale staged file from a crashed attempt
    src = samples.make_png(tmp_path / "a.png")
    dst = staged_path(src, "t1")
    dst.write_bytes(b"garbage from a crashed attempt")
    # When written again / Then dst is a proper edited PNG
    write_metadata(src, dst, ExifEdit(rating=2))
    assert read_metadata(dst)["rating"] == 2
    assert np.array_equal(_pixels(src), _pixels(dst))


def _files_under(top: Path) -> set[Path]:
    return {Path(d, f) for d, _, names in os.walk(top) for f in names}


def test_format_codes_in_the_destination_path_write_only_the_destination(
    tmp_path: Path, camera_jpeg: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a photo named with exiftool format codes in folders a rename pattern could make
    # (`%:9d../` climbs towards the file system's root when exiftool expands it), and a working
    # folder of its own so a relative expansion would land somewhere we look
    folder = tmp_path / "root" / "%:9d.." / "%:9d.." / "%d%f%e%c"
    folder.mkdir(parents=True)
    src = folder / "a%d.jpg"
    shutil.copy2(camera_jpeg, src)
    dst = staged_path(src, "i1-t1")
    monkeypatch.chdir(tmp_path)
    before = _files_under(tmp_path)
    # When its metadata is written
    write_metadata(src, dst, ExifEdit(artist="Format Codes"))
    # Then the destination holds the edit and no other file appeared anywhere
    assert read_metadata(dst)["artist"] == "Format Codes"
    assert _files_under(tmp_path) - before == {dst}
    assert not any(Path("/").glob("escaped*")) and not (tmp_path / "escaped").exists()


@pytest.mark.parametrize("maker", ["png", "jpeg"])
def test_without_exiftool_every_format_needs_exiftool(
    tmp_path: Path, camera_jpeg: Path, monkeypatch: pytest.MonkeyPatch, maker: str
) -> None:
    # Given exiftool is not on PATH
    monkeypatch.setattr(exif_module.exiftool, "available", lambda: False)
    src = samples.make_png(tmp_path / "a.png") if maker == "png" else camera_jpeg
    # When writing / Then NeedsExiftool names the file and how to install it, and writes nothing
    with pytest.raises(NeedsExiftool, match="needs exiftool.*apt-get install libimage-exiftool-perl") as info:
        write_metadata(src, staged_path(src, "t1"), ExifEdit(rating=1))
    assert info.value.path == str(src)
    assert not staged_path(src, "t1").exists()


# -- bad input -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "content, reason",
    [(None, "does not exist"), (b"", r"empty \(0 bytes\)"), (b"just some text\n", "not a JPEG, PNG, TIFF")],
)
def test_bad_input_is_unreadable_and_writes_nothing(
    tmp_path: Path, content: bytes | None, reason: str
) -> None:
    # Given a missing, empty or text file named .jpg
    src = tmp_path / "bad.jpg"
    if content is not None:
        src.write_bytes(content)
    dst = staged_path(src, "t1")
    # When metadata is written / Then UnreadableImage naming the file, and no output
    with pytest.raises(UnreadableImage, match=reason) as info:
        write_metadata(src, dst, EDIT)
    assert info.value.path == str(src)
    assert not dst.exists()


def test_truncated_jpeg_header_is_unreadable(tmp_path: Path, camera_jpeg: Path) -> None:
    # Given a JPEG cut inside its EXIF segment
    src = tmp_path / "cut.jpg"
    src.write_bytes(camera_jpeg.read_bytes()[:300])
    # When written / Then UnreadableImage says the header is truncated
    with pytest.raises(UnreadableImage, match="truncated JPEG header"):
        write_metadata(src, staged_path(src, "t1"), EDIT)


@pytest.mark.parametrize("maker", ["jpeg", "png"])
def test_truncated_image_data_is_unreadable(tmp_path: Path, camera_jpeg: Path, maker: str) -> None:
    # Given a JPEG / PNG whose image data was cut off (its header and metadata are intact)
    whole = camera_jpeg.read_bytes() if maker == "jpeg" else samples.make_png(tmp_path / "w.png").read_bytes()
    src = tmp_path / f"cut.{maker}"
    src.write_bytes(whole[: len(whole) * 4 // 5])
    # When written / Then UnreadableImage says it is truncated, and nothing is written
    with pytest.raises(UnreadableImage, match="truncated"):
        write_metadata(src, staged_path(src, "t1"), ExifEdit(rating=1))
    assert not staged_path(src, "t1").exists()


def test_source_and_destination_must_differ(camera_jpeg: Path) -> None:
    # Given the source as destination / When written / Then refused, source untouched
    sha = _sha(camera_jpeg)
    with pytest.raises(PhotoError, match="separate destination"):
        write_metadata(camera_jpeg, camera_jpeg, EDIT)
    assert _sha(camera_jpeg) == sha


# -- the exiftool process ------------------------------------------------------------------------
def test_exiftool_reports_errors_with_its_stderr(tmp_path: Path) -> None:
    # Given a running exiftool / When asked about a missing file / Then PhotoError with its message
    with ExifTool() as tool:
        with pytest.raises(PhotoError, match="File not found"):
            tool.execute("-j", str(tmp_path / "missing.jpg"))
        # and it keeps working afterwards
        assert tool.execute("-ver").strip()


def test_exiftool_restarts_after_the_process_dies() -> None:
    # Given a running exiftool process that gets killed
    with ExifTool() as tool:
        version = tool.execute("-ver").strip()
        pid = tool.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        tool._proc.wait()  # reap it so the death is visible
        # When the next command runs / Then a new process answers it
        assert tool.execute("-ver").strip() == version
        assert tool.pid not in (None, pid)


def test_exiftool_dies_with_a_killed_worker() -> None:
    # Given a worker process that started exiftool and is then killed with SIGKILL (no cleanup)
    code = (
        "import os, signal\n"
        "from photos.exiftool import ExifTool\n"
        "tool = ExifTool()\n"
        "tool.execute('-ver')\n"
        "print(tool.pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    repo = Path(__file__).resolve().parents[3]
    run = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=60)
    pid = int(run.stdout.strip())
    # When we wait for its exiftool to end
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # already gone
    try:
        ready, _, _ = select.select([fd], [], [], 20)
    finally:
        os.close(fd)
    # Then it ended with its parent instead of lingering as an orphan
    assert ready, f"exiftool {pid} outlived its killed parent"


def test_exiftool_is_thread_safe(tmp_path: Path) -> None:
    # Given several PNGs with different ratings and threads sharing one exiftool
    paths = []
    for i in range(6):
        src = samples.make_png(tmp_path / f"p{i}.png", (8, 8))
        dst = tmp_path / f"out{i}.png"
        write_metadata(src, dst, ExifEdit(rating=i % 6, keywords=[f"k{i}"]))
        paths.append(dst)
    results: dict[int, dict] = {}
    errors: list[BaseException] = []

    def read(i: int) -> None:
        try:
            for _ in range(5):
                results[i] = read_metadata(paths[i])
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(i,)) for i in range(6)]
    # When they all read at once
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then every thread got its own file's answer
    assert errors == []
    assert {i: (r["rating"], r["keywords"]) for i, r in results.items()} == {
        i: (i % 6, [f"k{i}"]) for i in range(6)
    }


def test_exiftool_shared_is_one_instance_per_process() -> None:
    # Given / When shared() is called twice / Then the same instance
    assert ExifTool.shared() is ExifTool.shared()


def test_exiftool_refuses_arguments_with_newlines() -> None:
    # Given an argument with a newline (it would split in the argument file) / Then refused
    with pytest.raises(PhotoError, match="newline"):
        ExifTool.shared().execute("-Comment=a\nb", "/nonexistent")


def test_exiftool_missing_names_the_fix() -> None:
    # Given an exiftool executable that is not installed / When a command runs
    # Then the error says how to install it
    with pytest.raises(PhotoError, match="not installed.*apt-get install libimage-exiftool-perl"):
        ExifTool("no-such-exiftool-here").execute("-ver")


def _dies_once(tmp_path: Path) -> Path:
    """An exiftool stand-in that dies in the middle of its first command, then is the real one."""
    script = tmp_path / "flaky-exiftool"
    mark = tmp_path / "died-once"
    real = shutil.which("exiftool")
    script.write_text(
        f'#!/bin/sh\nif [ ! -e "{mark}" ]; then touch "{mark}"; read line; exit 3; fi\nexec "{real}" "$@"\n'
    )
    script.chmod(0o755)
    return script


def test_exiftool_dying_mid_command_is_restarted_once_for_an_idempotent_command(tmp_path: Path) -> None:
    # Given an exiftool process that dies while running its first command
    with ExifTool(str(_dies_once(tmp_path))) as tool:
        # When an idempotent command runs / Then a fresh process answers it
        assert tool.execute("-ver", retry_if_died=True).strip()
    # and without the retry the death is a clear error
    (tmp_path / "again").mkdir()
    with ExifTool(str(_dies_once(tmp_path / "again"))) as tool:
        with pytest.raises(ExifToolDied, match="exiftool died while running a command"):
            tool.execute("-ver")


# -- IPTC and XMP details ------------------------------------------------------------------------
def _prepared_jpeg(tmp_path: Path, *assignments: str) -> Path:
    """A small JPEG with tags set up by exiftool itself (``-TAG=VALUE`` assignments)."""
    plain = tmp_path / "plain.jpg"
    samples._pattern((48, 32)).save(plain, "JPEG")
    src = tmp_path / "prepared photo.jpg"
    ExifTool.shared().execute("-m", *assignments, "-o", str(src), str(plain))
    return src


def _tags(path: Path, *tags: str) -> dict:
    out = ExifTool.shared().execute("-j", "-G1", "-a", *tags, str(path))
    return json.loads(out, parse_int=str, parse_float=str)[0]


def test_an_older_latin1_iptc_block_is_converted_to_utf8_keeping_its_text(tmp_path: Path) -> None:
    # Given a JPEG whose IPTC block has no character set (Latin-1 text, as older tools wrote it)
    src = _prepared_jpeg(
        tmp_path, "-charset", "iptc=Latin", "-IPTC:Caption-Abstract=Café", "-IPTC:Keywords=Crème"
    )
    assert "IPTC:CodedCharacterSet" not in _tags(src, "-IPTC:all")
    dst = staged_path(src, "t1")
    # When keywords with non-ASCII letters are written
    write_metadata(src, dst, ExifEdit(keywords=["Été", "東京"]))
    # Then the block is UTF-8, the new keywords follow the old one and the caption keeps its text
    iptc = _tags(dst, "-IPTC:all")
    assert iptc["IPTC:CodedCharacterSet"] == "UTF8"
    assert iptc["IPTC:Keywords"] == ["Crème", "Été", "東京"]
    assert iptc["IPTC:Caption-Abstract"] == "Café"


def test_shift_moves_exif_xmp_and_iptc_dates_once_and_leaves_unknown_dates(tmp_path: Path) -> None:
    # Given a JPEG with EXIF, XMP and IPTC capture times (IPTC late in the evening) and an unknown
    # (all-zero) ModifyDate
    src = _prepared_jpeg(
        tmp_path,
        "-EXIF:DateTimeOriginal=2020:05:17 23:30:00",
        "-EXIF:ModifyDate#=0000:00:00 00:00:00",
        "-XMP-exif:DateTimeOriginal=2020:05:17 23:30:00+02:00",
        "-XMP-photoshop:DateCreated=2020:05:17 23:30:00+02:00",
        "-IPTC:DateCreated=2020:05:17",
        "-IPTC:TimeCreated=23:30:00+02:00",
    )
    dst = staged_path(src, "t1")
    # When shifted by one hour
    write_metadata(src, dst, ExifEdit(shift=timedelta(hours=1)))
    tags = _tags(dst, "-time:all", "--System:all")
    # Then each capture time moved by exactly one hour; IPTC's date rolled over with its time
    assert tags["ExifIFD:DateTimeOriginal"] == "2020:05:18 00:30:00"
    assert tags["XMP-exif:DateTimeOriginal"] == "2020:05:18 00:30:00+02:00"
    assert tags["XMP-photoshop:DateCreated"] == "2020:05:18 00:30:00+02:00"
    assert (tags["IPTC:DateCreated"], tags["IPTC:TimeCreated"]) == ("2020:05:18", "00:30:00+02:00")
    # and the unknown date stayed unknown
    assert tags["IFD0:ModifyDate"] == "0000:00:00 00:00:00"


def test_iptc_limits_cut_only_the_iptc_copy(tmp_path: Path) -> None:
    # Given a keyword and an artist longer than IPTC allows (64 and 32 bytes)
    src = samples.make_tiff(tmp_path / "scan.tif")
    long_keyword, long_artist = "é" * 40, "Jean-Baptiste Emmanuel Zorg Photographie"
    dst = staged_path(src, "t1")
    # When written
    write_metadata(src, dst, ExifEdit(keywords=[long_keyword], artist=long_artist))
    tags = _tags(dst, "-XMP-dc:all", "-IPTC:all", "-EXIF:Artist")
    # Then XMP and EXIF hold them whole, IPTC holds them cut at a character boundary
    assert tags["XMP-dc:Subject"] == long_keyword and tags["IFD0:Artist"] == long_artist
    assert tags["XMP-dc:Creator"] == long_artist
    assert tags["IPTC:Keywords"] == "é" * 32
    assert tags["IPTC:By-line"] == long_artist.encode()[:32].decode()
