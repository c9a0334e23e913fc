"""Every argument sent to the ``exiftool -stay_open`` process is read as exactly that argument:
no newline, blank or ``#`` line the argument-file reader would reinterpret, no file name read as an
option, no format code in an output name (issue 29)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from PIL import Image

from photos import exiftool
from photos.containment import pin_inside, private_name
from photos.exiftool import UnsafeArgument, encode_arguments
from tests.support import IN_CI

# Under CI=true a missing exiftool is a failure (.ci/run installs it), never a skip.
needs_exiftool = pytest.mark.skipif(
    not exiftool.available() and not IN_CI, reason="exiftool is not installed"
)


def make_jpeg() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(buf, "JPEG")
    return buf.getvalue()


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (("-XMP-dc:Description=a\nb", "/p.jpg"), "newline"),
        (("-j", "/p\r.jpg"), "newline"),
        (("-j", ""), "empty"),
        (("-j", " /p.jpg"), "blank"),
        (("-j", "#[CSTR]/p.jpg"), "'#'"),
        (("-j", "p.jpg"), "absolute"),
        (("-j", "-execute"), "reserved"),
        (("-j", "-@", "/args"), "reserved"),
        (("-j", "-stay_open", "False"), "reserved"),
        (("-o", "/out/%d.jpg", "/p.jpg"), "'%'"),
        (("-o", "/out%:9d../x.jpg", "/p.jpg"), "'%'"),
        (("-o", "out.jpg", "/p.jpg"), "absolute"),
        (("-W", "/tmp/a%d/%t.%s", "/p.jpg"), "'%'"),
        (("-tagsFromFile", "/other%f.jpg", "/p.jpg"), "'@'"),
        (("-srcfile", "/x/%f.jpg", "/p.jpg"), "'%'"),
        (("-o",), "missing"),
    ],
)
def test_an_argument_exiftool_would_reinterpret_is_refused(args: tuple[str, ...], why: str) -> None:
    # Given arguments exiftool's argument-file reader or its output options would read otherwise
    # When they are encoded for the -stay_open stream / Then they are refused, saying why
    with pytest.raises(UnsafeArgument, match=why) as caught:
        encode_arguments(args)
    # And the message names no path
    assert "/p" not in str(caught.value) and "/out" not in str(caught.value)


def test_safe_arguments_pass_unchanged_including_our_own_preview_pattern() -> None:
    # Given our own commands: options, tag assignments whose values hold '%', '#' or '-execute',
    # absolute names holding '%' to read, a -W pattern in a %-free folder, -tagsFromFile @
    args = (
        "-charset", "filename=utf8", "-ec", "-XMP-dc:Description=100% #1 -execute",
        "-W", "/tmp/pj-raw-x/%t%c.%s", "-tagsFromFile", "@", "-IPTC:all", "/photos/a%d.jpg",
        Path("/photos/bad\udcffname.jpg"),
    )  # fmt: skip
    # When they are encoded / Then every one is sent as given (a non-UTF-8 name as its bytes)
    encoded = encode_arguments(args)
    assert encoded[3] == b"-XMP-dc:Description=100% #1 -execute"
    assert encoded[-2] == b"/photos/a%d.jpg" and encoded[-1] == b"/photos/bad\xffname.jpg"


@needs_exiftool
def test_a_percent_output_name_writes_nothing_anywhere(tmp_path: Path) -> None:
    # Given a photo and an output name with exiftool's format codes (%d: the source's folder)
    src = tmp_path / "in" / "a.jpg"
    src.parent.mkdir()
    src.write_bytes(make_jpeg())
    out = tmp_path / "out"
    out.mkdir()
    # When exiftool is asked to write it
    with pytest.raises(UnsafeArgument):
        exiftool.ExifTool.shared().execute("-XMP-dc:Description=x", "-o", f"{out}/%d/x.jpg", str(src))
    # Then nothing was written, here or under the expanded folder
    assert list(out.rglob("*")) == []
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a.jpg", "in", "out"]


def test_the_private_folder_holds_no_percent_even_when_tmpdir_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a TMPDIR whose path holds '%'
    odd = tmp_path / "t%d"
    odd.mkdir()
    monkeypatch.setenv("TMPDIR", str(odd))
    monkeypatch.setattr("tempfile.tempdir", None)
    # When exiftool's private output folder is made / Then its path holds no '%'
    with exiftool.private_folder("pj-x%-") as folder:
        assert "%" not in folder and os.path.isdir(folder)


def test_a_pin_gives_exiftool_a_plain_name_whatever_the_photo_is_called(tmp_path: Path) -> None:
    # Given photos named with a format code, a newline, a non-UTF-8 byte and a leading dash
    names = ["a%d.jpg", "new\nline.jpg", os.fsdecode(b"bad\xffname.jpg"), "-x.jpg"]
    for name in names:
        (tmp_path / name).write_bytes(make_jpeg())
    # When each is pinned / Then the private name keeps the extension and holds none of them
    for name in names:
        with pin_inside(tmp_path / name, [tmp_path]) as pinned:
            shown = pinned.name.name
            assert shown == private_name(name) and shown.endswith(".jpg")
            assert not any(c in shown for c in "%\n\udcff") and not shown.startswith("-")
            assert encode_arguments(("-j", str(pinned.name)))  # a name exiftool reads as given
