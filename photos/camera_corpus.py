"""Camera files with the odd EXIF layouts real cameras write, assembled byte by byte.

Each file reproduces a pattern that a re-serialising EXIF writer (piexif) damages:

* ``kodak``: ASCII tags (Make, Model, DateTimeOriginal, CreateDate) whose count has no NUL
  terminator.
* ``pentax``: EXIF tags (WhiteBalance, ExposureMode, Contrast, Saturation, Sharpness...) stored in
  IFD0 instead of the Exif IFD.
* ``interop``: an Interoperability IFD (InteropIndex ``R98``, InteropVersion ``0100``).
* ``jpeg_thumb``: a compressed (JPEG) IFD1 thumbnail.
* ``tiff_thumb``: an uncompressed (RGB strip) IFD1 thumbnail.
* ``makernote``: a Canon-style MakerNote (an IFD whose value offsets count from the TIFF header,
  so it breaks if moved without fixing them) plus a UserComment owned by the photographer.
* ``everything``: all of the above in one EXIF block.

:func:`make_corpus` writes each pattern as a JPEG, plus the ``everything`` block inside a TIFF,
a PNG and (when pillow-heif can encode) a HEIC file. File names contain spaces and non-ASCII
letters. Nothing here uses piexif: the point is layouts piexif would not write.
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

# TIFF field types
BYTE, ASCII, SHORT, LONG, RATIONAL, UNDEFINED, SLONG, SRATIONAL = 1, 2, 3, 4, 5, 7, 9, 10
_TYPE_SIZE = {BYTE: 1, ASCII: 1, SHORT: 2, LONG: 4, RATIONAL: 8, UNDEFINED: 1, SLONG: 4, SRATIONAL: 8}

TAKEN = "2005:08:13 09:47:23"
USER_COMMENT = b"ASCII\x00\x00\x00" + b"Owner's note: keep this comment"
PATTERNS = ("kodak", "pentax", "interop", "jpeg_thumb", "tiff_thumb", "makernote", "everything")


@dataclass
class Entry:
    """One IFD entry. ``value`` is the raw value bytes (little-endian) or, for pointer tags, a
    callable given the finished layout (name -> absolute offset) that returns them."""

    tag: int
    type: int
    count: int
    value: bytes | Callable[[dict[str, int]], bytes]
    blob: str | None = None  # the value lives in this blob (out of line) instead of after the IFD


@dataclass
class Ifd:
    name: str
    entries: list[Entry] = field(default_factory=list)
    next_ifd: str | None = None  # name of the IFD linked as "next" (IFD0 -> IFD1)


def ascii_entry(tag: int, text: str, *, terminated: bool = True) -> Entry:
    raw = text.encode("ascii") + (b"\x00" if terminated else b"")
    return Entry(tag, ASCII, len(raw), raw)


def short_entry(tag: int, *values: int) -> Entry:
    return Entry(tag, SHORT, len(values), struct.pack(f"<{len(values)}H", *values))


def long_entry(tag: int, *values: int) -> Entry:
    return Entry(tag, LONG, len(values), struct.pack(f"<{len(values)}I", *values))


def rational_entry(tag: int, num: int, den: int) -> Entry:
    return Entry(tag, RATIONAL, 1, struct.pack("<II", num, den))


def undefined_entry(tag: int, raw: bytes) -> Entry:
    return Entry(tag, UNDEFINED, len(raw), raw)


def pointer_entry(tag: int, target: str) -> Entry:
    """A LONG holding the absolute offset of IFD or blob ``target``."""
    return Entry(tag, LONG, 1, lambda layout: struct.pack("<I", layout[target]))


def build_tiff(ifds: list[Ifd], blobs: dict[str, bytes | Callable[[dict[str, int]], bytes]]) -> bytes:
    """A little-endian TIFF structure: header, the IFDs in order (each followed by its out-of-line
    values), then the blobs (thumbnail, strips, maker notes). ``layout`` maps IFD and blob names to
    their absolute offsets, so pointer entries and offset-dependent blobs can be filled in."""
    layout: dict[str, int] = {}
    sizes: dict[str, int] = {}
    pos = 8
    for ifd in ifds:
        layout[ifd.name] = pos
        size = 2 + 12 * len(ifd.entries) + 4
        for e in ifd.entries:
            n = _TYPE_SIZE[e.type] * e.count
            if n > 4 and e.blob is None:
                size += n + (n & 1)
        sizes[ifd.name] = size
        pos += size
    blob_bytes: dict[str, bytes] = {}
    for name, blob in blobs.items():
        layout[name] = pos
        # an offset-dependent blob must have a fixed size: render once with this layout
        data = blob(layout) if callable(blob) else blob
        blob_bytes[name] = data
        pos += len(data) + (len(data) & 1)
    out = bytearray(b"II*\x00" + struct.pack("<I", 8))
    for ifd in ifds:
        start = layout[ifd.name]
        if len(out) != start:
            raise RuntimeError('internal error: expected len(out) == start')
        entries = sorted(ifd.entries, key=lambda e: e.tag)
        data_pos = start + 2 + 12 * len(entries) + 4
        head = bytearray(struct.pack("<H", len(entries)))
        extra = bytearray()
        for e in entries:
            n = _TYPE_SIZE[e.type] * e.count
            if e.blob is not None:
                if len(blob_bytes[e.blob]) != n:
                    raise RuntimeError('internal error: expected len(blob_bytes[e.blob]) == n')
                head += struct.pack("<HHII", e.tag, e.type, e.count, layout[e.blob])
                continue
            raw = e.value(layout) if callable(e.value) else e.value
            if len(raw) != n:
                raise RuntimeError(f"tag {hex(e.tag)}: {len(raw)} bytes, expected {n}")
            if n <= 4:
                field_bytes = raw.ljust(4, b"\x00")
            else:
                field_bytes = struct.pack("<I", data_pos + len(extra))
                extra += raw + (b"\x00" if n & 1 else b"")
            head += struct.pack("<HHI", e.tag, e.type, e.count) + field_bytes
        head += struct.pack("<I", layout[ifd.next_ifd] if ifd.next_ifd else 0)
        out += head + extra
    for name, data in blob_bytes.items():
        if len(out) != layout[name]:
            raise RuntimeError('internal error: expected len(out) == layout[name]')
        out += data + (b"\x00" if len(data) & 1 else b"")
    return bytes(out)


# -- the patterns ---------------------------------------------------------------------------------
def _pattern_image(size: tuple[int, int], seed: int = 0) -> Image.Image:
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    arr = np.stack(
        [(xx * 255 // max(1, w - 1)), (yy * 255 // max(1, h - 1)), ((xx ^ yy) * 7 + seed) % 256], -1
    )
    return Image.fromarray(arr.astype(np.uint8), "RGB")


def _thumbnail_jpeg() -> bytes:
    buf = io.BytesIO()
    _pattern_image((32, 24), 40).save(buf, "JPEG", quality=70)
    return buf.getvalue()


def _canon_makernote(offset_of: str) -> Callable[[dict[str, int]], bytes]:
    """A Canon MakerNote: an IFD (no header) whose out-of-line values are addressed from the TIFF
    header, so the block only reads right at the offset it was written for."""

    def render(layout: dict[str, int]) -> bytes:
        base = layout[offset_of]
        image_type = b"IMG:PowerShot S1 IS JPEG\x00"
        firmware = b"Firmware Version 1.00\x00\x00\x00"  # 24 bytes
        owner = b"Lens Owner Name\x00"
        values = [(0x0006, ASCII, image_type), (0x0007, ASCII, firmware), (0x0009, ASCII, owner)]
        n = len(values) + 1
        data_pos = base + 2 + 12 * n + 4
        head = bytearray(struct.pack("<H", n))
        extra = bytearray()
        for tag, typ, raw in values:
            head += struct.pack("<HHII", tag, typ, len(raw), data_pos + len(extra))
            extra += raw + (b"\x00" if len(raw) & 1 else b"")
        head += struct.pack("<HHI", 0x0010, LONG, 1) + struct.pack("<I", 0x01140000)  # ModelID
        head += struct.pack("<I", 0)
        return bytes(head + extra)

    return render


def exif_layout(pattern: str, *, image: tuple[int, int] | None = None, strip: bytes | None = None) -> bytes:
    """The TIFF structure (no ``Exif\\0\\0`` header) for one pattern. With ``image``/``strip`` it is a
    whole TIFF file: IFD0 describes an uncompressed RGB image whose single strip is ``strip``."""
    every = pattern == "everything"
    kodak = pattern == "kodak" or every
    ifd0 = Ifd("ifd0")
    exif = Ifd("exif")
    ifds = [ifd0, exif]
    blobs: dict[str, bytes | Callable[[dict[str, int]], bytes]] = {}
    make = "EASTMAN KODAK COMPANY" if kodak else ("Canon" if pattern == "makernote" else "PENTAX Corporation")
    model = "KODAK EASYSHARE C340 ZOOM DIGITAL CAMERA" if kodak else "Camera Model 1"
    ifd0.entries += [
        ascii_entry(0x010F, make, terminated=not kodak),
        ascii_entry(0x0110, model, terminated=not kodak),
        short_entry(0x0112, 1),
        rational_entry(0x011A, 72, 1),
        rational_entry(0x011B, 72, 1),
        short_entry(0x0128, 2),
        ascii_entry(0x0131, "Firmware 1.0.3"),
        ascii_entry(0x0132, TAKEN),
        short_entry(0x0213, 2),
        pointer_entry(0x8769, "exif"),
    ]
    if image is not None:
        w, h = image
        if strip is None:
            raise RuntimeError('internal error: expected strip is not None')
        blobs["strip"] = strip
        ifd0.entries += [
            long_entry(0x0100, w),
            long_entry(0x0101, h),
            short_entry(0x0102, 8, 8, 8),
            short_entry(0x0103, 1),
            short_entry(0x0106, 2),
            pointer_entry(0x0111, "strip"),
            short_entry(0x0115, 3),
            long_entry(0x0116, h),
            long_entry(0x0117, len(strip)),
            short_entry(0x011C, 1),
        ]
    if pattern == "pentax" or every:
        # EXIF-only tags stored in IFD0 (as some Pentax and Sanyo firmwares do)
        ifd0.entries += [
            short_entry(0xA403, 1),  # WhiteBalance
            short_entry(0xA402, 0),  # ExposureMode
            short_entry(0xA408, 2),  # Contrast
            short_entry(0xA409, 1),  # Saturation
            short_entry(0xA40A, 2),  # Sharpness
            short_entry(0xA406, 0),  # SceneCaptureType
            short_entry(0x9207, 5),  # MeteringMode
            rational_entry(0x829D, 28, 10),  # FNumber
        ]
    exif.entries += [
        rational_entry(0x829A, 1, 125),
        rational_entry(0x829D, 40, 10),
        short_entry(0x8827, 200),
        undefined_entry(0x9000, b"0221"),
        ascii_entry(0x9003, TAKEN, terminated=not kodak),
        ascii_entry(0x9004, TAKEN, terminated=not kodak),
        undefined_entry(0x9101, b"\x01\x02\x03\x00"),
        short_entry(0x9209, 16),
        rational_entry(0x920A, 63, 10),
        undefined_entry(0x9286, USER_COMMENT),
        undefined_entry(0xA000, b"0100"),
        short_entry(0xA001, 1),
        long_entry(0xA002, 640),
        long_entry(0xA003, 480),
    ]
    if pattern == "interop" or every:
        interop = Ifd("interop", [ascii_entry(0x0001, "R98"), undefined_entry(0x0002, b"0100")])
        ifds.append(interop)
        exif.entries.append(pointer_entry(0xA005, "interop"))
    if pattern == "makernote" or every:
        maker = _canon_makernote("makernote")
        blobs["makernote"] = maker
        size = len(maker({"makernote": 0}))
        exif.entries.append(Entry(0x927C, UNDEFINED, size, b"", blob="makernote"))
    if pattern == "jpeg_thumb" or (every and image is None):
        thumb = _thumbnail_jpeg()
        blobs["thumb"] = thumb
        ifd0.next_ifd = "ifd1"
        ifds.append(
            Ifd(
                "ifd1",
                [
                    short_entry(0x0103, 6),
                    rational_entry(0x011A, 72, 1),
                    rational_entry(0x011B, 72, 1),
                    short_entry(0x0128, 2),
                    pointer_entry(0x0201, "thumb"),
                    long_entry(0x0202, len(thumb)),
                ],
            )
        )
    elif pattern == "tiff_thumb" or every:
        tw, th = 16, 12
        pixels = _pattern_image((tw, th), 90).tobytes()
        blobs["thumb"] = pixels
        ifd0.next_ifd = "ifd1"
        ifds.append(
            Ifd(
                "ifd1",
                [
                    long_entry(0x0100, tw),
                    long_entry(0x0101, th),
                    short_entry(0x0102, 8, 8, 8),
                    short_entry(0x0103, 1),
                    short_entry(0x0106, 2),
                    pointer_entry(0x0111, "thumb"),
                    short_entry(0x0115, 3),
                    long_entry(0x0116, th),
                    long_entry(0x0117, len(pixels)),
                    short_entry(0x011C, 1),
                ],
            )
        )
    # the makernote must be the last blob so the IFD sizes above it are final
    if "makernote" in blobs:
        blobs["makernote"] = blobs.pop("makernote")
    return build_tiff(ifds, blobs)


def _jpeg_with_exif(tiff: bytes, size: tuple[int, int], seed: int) -> bytes:
    buf = io.BytesIO()
    _pattern_image(size, seed).save(buf, "JPEG", quality=88)
    data = buf.getvalue()
    payload = b"Exif\x00\x00" + tiff
    app1 = b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload
    # JFIF APP0 first, EXIF after it (as cameras+editors leave it)
    if data[2:4] != b"\xff\xe0":
        raise RuntimeError('internal error: expected data[2:4] == b"\\xff\\xe0"')
    app0_end = 4 + int.from_bytes(data[4:6], "big")
    return data[:app0_end] + app1 + data[app0_end:]


def heic_available() -> bool:
    try:
        import pillow_heif
    except ImportError:  # pragma: no cover - a pinned dependency
        return False
    return bool(pillow_heif.libheif_info().get("HEIF"))


def make_corpus(folder: str | os.PathLike[str], *, size: tuple[int, int] = (160, 120)) -> dict[str, Path]:
    """Write one file per pattern (JPEG) plus TIFF, PNG and HEIC with every pattern; return
    ``{label: path}`` (labels ``jpeg-kodak`` ... ``tiff-everything``, ``png-everything``,
    ``heic-everything``; HEIC only when pillow-heif can encode here). Files get a fixed mtime."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    made: dict[str, Path] = {}
    for i, pattern in enumerate(PATTERNS):
        path = folder / f"Caméra {pattern} {i}.jpg"
        path.write_bytes(_jpeg_with_exif(exif_layout(pattern), size, i))
        made[f"jpeg-{pattern}"] = path
    w, h = size
    strip = _pattern_image(size, 7).tobytes()
    tif = folder / "Scanné everything.tif"
    tif.write_bytes(exif_layout("everything", image=size, strip=strip))
    made["tiff-everything"] = tif
    png = folder / "Écran everything.png"
    _pattern_image(size, 8).save(png, "PNG", exif=exif_layout("everything"))
    made["png-everything"] = png
    if heic_available():
        import pillow_heif

        pillow_heif.register_heif_opener()
        heic = folder / "Téléphone everything.heic"
        _pattern_image((w, h), 9).save(
            heic, "HEIF", quality=90, exif=b"Exif\x00\x00" + exif_layout("everything")
        )
        made["heic-everything"] = heic
    for n, path in enumerate(made.values()):
        stamp = 1_200_000_000 + 3600 * n
        os.utime(path, (stamp, stamp))
    return made


# -- reading the raw structure back (for tests: what exiftool does not show) ------------------------
def exif_block(path: str | os.PathLike[str]) -> bytes:
    """The TIFF structure holding a file's EXIF: a JPEG's APP1 ``Exif`` payload, or a whole TIFF."""
    data = Path(path).read_bytes()
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return data
    pos = 2
    while pos + 4 <= len(data) and data[pos] == 0xFF and data[pos + 1] not in (0xDA, 0xD9):
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        if data[pos + 1] == 0xE1 and data[pos + 4 : pos + 10] == b"Exif\x00\x00":
            return data[pos + 10 : pos + 2 + length]
        pos += 2 + length
    raise ValueError(f"{path}: no EXIF APP1 segment")


def _ifd_entries(tiff: bytes, offset: int) -> tuple[dict[int, tuple[int, int, bytes]], int]:
    bo = "<" if tiff[:2] == b"II" else ">"
    (n,) = struct.unpack_from(bo + "H", tiff, offset)
    entries: dict[int, tuple[int, int, bytes]] = {}
    for i in range(n):
        tag, typ, count = struct.unpack_from(bo + "HHI", tiff, offset + 2 + 12 * i)
        size = _TYPE_SIZE.get(typ, 1) * count
        field_at = offset + 2 + 12 * i + 8
        if size <= 4:
            raw = tiff[field_at : field_at + size]
        else:
            (at,) = struct.unpack_from(bo + "I", tiff, field_at)
            raw = tiff[at : at + size]
        entries[tag] = (typ, count, raw)
    (next_ifd,) = struct.unpack_from(bo + "I", tiff, offset + 2 + 12 * n)
    return entries, next_ifd


def ifd1_strip(path: str | os.PathLike[str]) -> bytes | None:
    """The bytes of an uncompressed IFD1 thumbnail (its StripOffsets/StripByteCounts), or None."""
    tiff = exif_block(path)
    bo = "<" if tiff[:2] == b"II" else ">"
    (first,) = struct.unpack_from(bo + "I", tiff, 4)
    _, ifd1 = _ifd_entries(tiff, first)
    if not ifd1:
        return None
    entries, _ = _ifd_entries(tiff, ifd1)
    if 0x0111 not in entries or 0x0117 not in entries:
        return None

    def number(raw: bytes, typ: int) -> int:
        return struct.unpack(bo + ("H" if typ == SHORT else "I"), raw[: 2 if typ == SHORT else 4])[0]

    start = number(entries[0x0111][2], entries[0x0111][0])
    length = number(entries[0x0117][2], entries[0x0117][0])
    return tiff[start : start + length]
