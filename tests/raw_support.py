"""Small, real camera raw files for the tests: TIFF-structured raws written byte by byte.

:func:`make_raw` writes what a TIFF-based raw (DNG, NEF, CR2, ARW, PEF, …) is: IFD0 with the
camera's tags and a 16-bit Bayer (CFA) sensor image, an EXIF IFD (DateTimeOriginal), a GPS IFD, and
optionally an embedded JPEG preview in IFD1 (exiftool's ``ThumbnailImage``). With ``dng=True`` it
carries the DNG tags LibRaw needs to demosaic it (``rawpy`` decodes it); without, LibRaw refuses it
and only the preview can be looked at — like a raw of a camera LibRaw does not know.
"""

from __future__ import annotations

import calendar
import datetime
import io
import struct
from pathlib import Path

from PIL import Image

BYTE, ASCII, SHORT, LONG, RATIONAL, UNDEFINED, SRATIONAL = 1, 2, 3, 4, 5, 7, 10
_SIZES = {BYTE: 1, ASCII: 1, SHORT: 2, LONG: 4, RATIONAL: 8, UNDEFINED: 1, SRATIONAL: 8}


def preview_jpeg(size: tuple[int, int] = (320, 240), color: tuple[int, int, int] = (200, 80, 30)) -> bytes:
    """A real JPEG: a coloured picture with a bright square (so its pixel measures are not flat)."""
    img = Image.new("RGB", size, color)
    w, h = size
    img.paste((250, 250, 250), (w // 4, h // 4, w // 2, h // 2))
    out = io.BytesIO()
    img.save(out, "JPEG", quality=90)
    return out.getvalue()


def _encode(typ: int, values: object) -> bytes:
    if typ == ASCII:
        return str(values).encode() + b"\0"
    vals = list(values)  # type: ignore[call-overload]
    if typ in (BYTE, UNDEFINED):
        return bytes(vals)
    if typ == SHORT:
        return struct.pack(f"<{len(vals)}H", *vals)
    if typ == LONG:
        return struct.pack(f"<{len(vals)}I", *vals)
    if typ == RATIONAL:
        return b"".join(struct.pack("<II", n, d) for n, d in vals)
    if typ == SRATIONAL:
        return b"".join(struct.pack("<ii", n, d) for n, d in vals)
    raise ValueError(typ)


class _Tiff:
    def __init__(self) -> None:
        self.buf = bytearray(b"II*\0\0\0\0\0")

    def blob(self, data: bytes) -> int:
        if len(self.buf) % 2:
            self.buf += b"\0"
        at = len(self.buf)
        self.buf += data
        return at

    def ifd(self, entries: list[tuple[int, int, object]], next_ifd: int = 0) -> tuple[int, int]:
        """Write an IFD; returns (its offset, the offset of its next-IFD pointer)."""
        entries = sorted(entries, key=lambda e: e[0])
        payloads = []
        for tag, typ, values in entries:
            data = _encode(typ, values)
            count = len(data) // _SIZES[typ]
            if len(data) <= 4:
                payloads.append((tag, typ, count, data.ljust(4, b"\0")))
            else:
                payloads.append((tag, typ, count, struct.pack("<I", self.blob(data))))
        if len(self.buf) % 2:
            self.buf += b"\0"
        at = len(self.buf)
        self.buf += struct.pack("<H", len(payloads))
        for tag, typ, count, inline in payloads:
            self.buf += struct.pack("<HHI", tag, typ, count) + inline
        pointer = len(self.buf)
        self.buf += struct.pack("<I", next_ifd)
        return at, pointer

    def patch(self, at: int, value: int) -> None:
        self.buf[at : at + 4] = struct.pack("<I", value)


def make_raw(
    path: Path,
    *,
    make: str = "NIKON CORPORATION",
    model: str = "NIKON D750",
    taken: str | None = "2021:07:04 18:30:05",
    gps: tuple[float, float] | None = (48.8584, 2.2945),
    preview: bytes | None = None,
    dng: bool = False,
    size: tuple[int, int] = (64, 48),
    orientation: int = 1,
    compression: int = 1,
) -> Path:
    """Write a TIFF-based raw to ``path`` (see the module docstring); returns ``path``."""
    w, h = size
    t = _Tiff()
    # a Bayer RGGB mosaic of a warm scene with a bright block, 12-bit values in 16 bits
    rows = []
    for y in range(h):
        row = []
        for x in range(w):
            bright = w // 4 <= x < w // 2 and h // 4 <= y < h // 2
            r, g, b = (3800, 3800, 3800) if bright else (3000, 1200, 500)
            row.append(r if (y % 2, x % 2) == (0, 0) else b if (y % 2, x % 2) == (1, 1) else g)
        rows.append(struct.pack(f"<{w}H", *row))
    strip = t.blob(b"".join(rows))
    exif_at, _ = t.ifd([(36864, UNDEFINED, b"0231")] if taken is None else
                       [(36867, ASCII, taken), (36864, UNDEFINED, b"0231")])  # fmt: skip
    gps_at = None
    if gps is not None:
        lat, lon = gps

        def dms(v: float) -> list[tuple[int, int]]:
            v = abs(v)
            d = int(v)
            m = int((v - d) * 60)
            s = round(((v - d) * 60 - m) * 60 * 1000)
            return [(d, 1), (m, 1), (s, 1000)]

        gps_at, _ = t.ifd(
            [
                (0, BYTE, [2, 3, 0, 0]),
                (1, ASCII, "N" if lat >= 0 else "S"),
                (2, RATIONAL, dms(lat)),
                (3, ASCII, "E" if lon >= 0 else "W"),
                (4, RATIONAL, dms(lon)),
            ]
        )
    entries: list[tuple[int, int, object]] = [
        (254, LONG, [0]),
        (256, LONG, [w]),
        (257, LONG, [h]),
        (258, SHORT, [16]),
        (259, SHORT, [compression]),  # 1: uncompressed; another (a newer camera's codec): LibRaw refuses it
        (262, SHORT, [32803]),
        (271, ASCII, make),
        (272, ASCII, model),
        (273, LONG, [strip]),
        (274, SHORT, [orientation]),
        (277, SHORT, [1]),
        (278, LONG, [h]),
        (279, LONG, [w * h * 2]),
        (284, SHORT, [1]),
        (33421, SHORT, [2, 2]),
        (33422, BYTE, [0, 1, 1, 2]),
        (34665, LONG, [exif_at]),
    ]
    if gps_at is not None:
        entries.append((34853, LONG, [gps_at]))
    if dng:
        entries += [
            (50706, BYTE, [1, 4, 0, 0]),
            (50707, BYTE, [1, 1, 0, 0]),
            (50708, ASCII, f"{make} {model}"),
            (50717, LONG, [4095]),
            (50721, SRATIONAL, [(1, 1), (0, 1), (0, 1), (0, 1), (1, 1), (0, 1), (0, 1), (0, 1), (1, 1)]),
            (50728, RATIONAL, [(1, 2), (1, 1), (1, 3)]),
            (50778, SHORT, [21]),
        ]
    ifd0, next_ptr = t.ifd(entries)
    if preview is not None:
        jpeg = t.blob(preview)
        ifd1, _ = t.ifd(
            [(254, LONG, [1]), (259, SHORT, [6]), (513, LONG, [jpeg]), (514, LONG, [len(preview)])]
        )
        t.patch(next_ptr, ifd1)
    t.patch(4, ifd0)
    path.write_bytes(bytes(t.buf))
    return path


def make_xmp_sidecar(
    path: Path,
    *,
    keywords: tuple[str, ...] = (),
    rating: int | None = None,
    description: str | None = None,
    label: str | None = None,
) -> Path:
    """Write an XMP sidecar as a raw editor leaves one (rating, description, colour label, keywords in
    ``dc:subject``) to ``path``; returns ``path``."""
    props = []
    if rating is not None:
        props.append(f"  <xmp:Rating>{rating}</xmp:Rating>")
    if label is not None:
        props.append(f"  <xmp:Label>{label}</xmp:Label>")
    if description is not None:
        props.append(
            "  <dc:description><rdf:Alt><rdf:li xml:lang='x-default'>"
            f"{description}</rdf:li></rdf:Alt></dc:description>"
        )
    if keywords:
        items = "".join(f"<rdf:li>{k}</rdf:li>" for k in keywords)
        props.append(f"  <dc:subject><rdf:Bag>{items}</rdf:Bag></dc:subject>")
    body = "\n".join(props)
    path.write_text(
        "<?xpacket begin='\ufeff' id='W5M0MpCehiHzreSzNTczkc9d'?>\n"
        "<x:xmpmeta xmlns:x='adobe:ns:meta/'>\n"
        "<rdf:RDF xmlns:rdf='http://www.w3.org/1999/02/22-rdf-syntax-ns#'>\n"
        " <rdf:Description rdf:about='' xmlns:dc='http://purl.org/dc/elements/1.1/'"
        " xmlns:xmp='http://ns.adobe.com/xap/1.0/'>\n"
        f"{body}\n"
        " </rdf:Description>\n"
        "</rdf:RDF>\n"
        "</x:xmpmeta>\n"
        "<?xpacket end='w'?>\n",
        encoding="utf-8",
    )
    return path


def make_crw(path: Path, taken: datetime.datetime, model: str = "Canon PowerShot G5") -> Path:
    """Write a Canon CRW (CIFF: ``II``, header length 26, ``HEAPCCDR``, one heap) whose only clock is
    the ``TimeStamp`` record exiftool reads as ``CanonRaw:DateTimeOriginal`` (Unix time; no EXIF at
    all, as every CRW), with its make and model and a ``JpgFromRaw`` preview; returns ``path``."""
    stamp = struct.pack("<Iii", calendar.timegm(taken.timetuple()), 0, 0)
    make_model = b"Canon\x00" + model.encode() + b"\x00"
    heap = bytearray()
    entries = []
    for tag, body in ((0x180E, stamp), (0x080A, make_model), (0x2007, preview_jpeg())):
        entries.append((tag, len(body), len(heap)))
        heap += body
    if len(heap) % 2:
        heap += b"\x00"
    directory = len(heap)
    heap += struct.pack("<H", len(entries))
    for tag, size, offset in entries:
        heap += struct.pack("<HII", tag, size, offset)
    heap += struct.pack("<I", directory)
    header = b"II" + struct.pack("<I", 26) + b"HEAPCCDR" + struct.pack("<I", 0x00010002) + bytes(8)
    path.write_bytes(header + heap)
    return path
