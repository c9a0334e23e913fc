"""Camera files that carry many clocks (EXIF IFD0/ExifIFD/IFD1, XMP, IPTC, maker notes), for the
time-shift and one-clock tests: built byte by byte (Pentax and Nikon maker notes) and by exiftool."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from photos.exiftool import ExifTool
from tests.fixtures import camera_corpus as cc

#: Every clock a built file carries, by exiftool's family-1 name, and its value.
TAKEN = "2004:10:02 23:29:52"


def _pentax_makernote(date: str, shutter_count: int | None = None) -> bytes:
    """A Pentax (AOC) maker note with its Date (big-endian year) and Time tags, values inline, and
    its ShutterCount (encrypted with that Date and Time) when given."""
    y, mo, d = (int(x) for x in date[:10].split(":"))
    h, mi, s = (int(x) for x in date[11:19].split(":"))
    entries = [
        struct.pack("<HHI", 0x0006, cc.UNDEFINED, 4) + struct.pack(">HBB", y, mo, d),
        struct.pack("<HHI", 0x0007, cc.UNDEFINED, 3) + bytes([h, mi, s, 0]),
    ]
    if shutter_count is not None:  # big-endian, encrypted with the Date and Time (as exiftool decrypts it)
        key = struct.unpack(">I", struct.pack(">HBB", y, mo, d))[0] ^ (
            0xFFFFFFFF - ((h << 24) | (mi << 16) | (s << 8))
        )
        entries.append(struct.pack("<HHI", 0x005D, cc.UNDEFINED, 4) + struct.pack(">I", shutter_count ^ key))
    return b"AOC\x00II" + struct.pack("<H", len(entries)) + b"".join(entries) + struct.pack("<I", 0)


def _nikon_makernote(date: str) -> bytes:
    """A Nikon type-3 maker note (its own TIFF header, offsets from it) with PowerUpTime."""
    y, mo, d = (int(x) for x in date[:10].split(":"))
    h, mi, s = (int(x) for x in date[11:19].split(":"))
    value = struct.pack("<HBBBBBB", y, mo, d, h, mi, s, 0)
    entries = [
        struct.pack("<HHI", 0x0001, cc.UNDEFINED, 4) + b"0210",  # MakerNoteVersion
        struct.pack("<HHII", 0x00B6, cc.UNDEFINED, len(value), 8 + 2 + 2 * 12 + 4),
    ]
    ifd = struct.pack("<H", len(entries)) + b"".join(entries) + struct.pack("<I", 0)
    return b"Nikon\x00\x02\x10\x00\x00" + b"II*\x00" + struct.pack("<I", 8) + ifd + value


MAKERS = {
    "pentax": ("PENTAX Corporation", "PENTAX K10D", _pentax_makernote),
    "nikon": ("NIKON CORPORATION", "NIKON D70", _nikon_makernote),
}


def camera_jpeg(
    path: Path, maker: str, taken: str = TAKEN, *, seed: int = 0, shutter_count: int | None = None
) -> Path:
    """A JPEG from ``maker`` (pentax or nikon) whose every clock says ``taken``: IFD0 ModifyDate,
    ExifIFD DateTimeOriginal/CreateDate, IFD1 ModifyDate (beside a JPEG thumbnail) and the maker
    note's own date."""
    make, model, makernote = MAKERS[maker]
    note = makernote(taken, shutter_count) if shutter_count is not None else makernote(taken)
    thumb = cc._thumbnail_jpeg()
    ifd0 = cc.Ifd(
        "ifd0",
        [
            cc.ascii_entry(0x010F, make),
            cc.ascii_entry(0x0110, model),
            cc.rational_entry(0x011A, 72, 1),
            cc.rational_entry(0x011B, 72, 1),
            cc.short_entry(0x0128, 2),
            cc.ascii_entry(0x0132, taken),
            cc.pointer_entry(0x8769, "exif"),
        ],
        next_ifd="ifd1",
    )
    exif = cc.Ifd(
        "exif",
        [
            cc.undefined_entry(0x9000, b"0230"),
            cc.ascii_entry(0x9003, taken),
            cc.ascii_entry(0x9004, taken),
            cc.Entry(0x927C, cc.UNDEFINED, len(note), b"", blob="makernote"),
        ],
    )
    ifd1 = cc.Ifd(
        "ifd1",
        [
            cc.short_entry(0x0103, 6),
            cc.rational_entry(0x011A, 72, 1),
            cc.rational_entry(0x011B, 72, 1),
            cc.short_entry(0x0128, 2),
            cc.ascii_entry(0x0132, taken),
            cc.pointer_entry(0x0201, "thumb"),
            cc.long_entry(0x0202, len(thumb)),
        ],
    )
    tiff = cc.build_tiff([ifd0, exif, ifd1], {"thumb": thumb, "makernote": note})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(cc._jpeg_with_exif(tiff, (96, 64), seed))
    return path


def add_xmp_and_iptc(path: Path, taken: str = TAKEN, *, zone: str = "+02:00") -> None:
    """Give ``path`` the XMP and IPTC clocks photo apps write: XMP CreateDate/ModifyDate/
    DateTimeOriginal (no zone), photoshop:DateCreated (with ``zone``), IPTC DateCreated/TimeCreated
    and DigitalCreationDate/Time (no zone), and an IPTCDigest; plus the time tags that are no
    clocks to shift: EXIF OffsetTimeOriginal (``zone``), SubSecTimeOriginal and GPS (UTC) time."""
    date, time = taken[:10], taken[11:19]
    ExifTool.shared().execute(
        "-overwrite_original",
        f"-XMP-xmp:CreateDate={taken}",
        f"-XMP-xmp:ModifyDate={taken}",
        f"-XMP-exif:DateTimeOriginal={taken}",
        f"-XMP-photoshop:DateCreated={taken}{zone}",
        f"-IPTC:DateCreated={date}",
        f"-IPTC:TimeCreated={time}",
        f"-IPTC:DigitalCreationDate={date}",
        f"-IPTC:DigitalCreationTime={time}",
        "-Photoshop:IPTCDigest=new",
        f"-ExifIFD:OffsetTimeOriginal={zone}",
        "-ExifIFD:SubSecTimeOriginal=123",
        "-GPS:GPSDateStamp=2004:10:02",
        "-GPS:GPSTimeStamp=21:29:52",
        os.path.abspath(path),
    )
