"""Which files are photos (the suffixes a folder scan takes, for every lane), which image formats the
exif lane writes, and the checks a file passes before exiftool edits it.

=======  ==========================  ===========================================================
format   recognised by               metadata exiftool writes into it (see :mod:`photos.exif`)
=======  ==========================  ===========================================================
JPEG     ``FF D8 FF``                XMP, IPTC, EXIF (where the file has an EXIF block)
TIFF     ``II*\\0`` / ``MM\\0*``        XMP, IPTC, EXIF (its IFD0 is the file's own)
PNG      ``\\x89PNG``                 XMP (iTXt), EXIF where an ``eXIf`` chunk exists
HEIF     ``ftyp`` heic/heix/mif1/…   XMP, EXIF where present (HEIC, HEIF)
AVIF     ``ftyp`` avif/avis          XMP, EXIF where present
WEBP     ``RIFF....WEBP``            XMP, EXIF where present (ExifTool >= 12.58 writes RIFF)
JXL      codestream ``FF 0A`` or     XMP, EXIF where present; a bare codestream is wrapped in
         the ``JXL `` container      the ISO BMFF container by exiftool (the pixels unchanged)
=======  ==========================  ===========================================================

IPTC goes only into JPEG and TIFF; EXIF only into a file that already has an EXIF block; XMP
always. Before exiftool runs, the whole file is checked: a JPEG's header and its end (EOI) marker,
a PNG's IEND chunk (exiftool would edit the metadata of a cut-off file without noticing), and
every pixel decoded by Pillow (:func:`check_decodes`).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from photos.errors import PhotoError, UnreadableImage, describe_content
from photos.image_open import decoding_errors, open_image
from photos.image_open import register_openers as _register
from photos.raw import RAW_SUFFIXES

#: Formats that carry a standard IPTC block.
IPTC_FORMATS = frozenset({"JPEG", "TIFF"})
#: The images (raws aside) that Pillow decodes (AVIF natively since Pillow 11.3, HEIC/HEIF through
#: pillow-heif, JPEG XL through pillow-jxl-plugin) and the exif lane writes, lower case with the dot:
#: a sidecar ``NAME.xmp`` may be theirs.
IMAGE_SUFFIXES = frozenset(
    {".jpg", ".jpeg", ".jpe", ".png", ".tif", ".tiff", ".heic", ".heif", ".hif", ".avif", ".webp", ".jxl"}
)
#: Every suffix a folder scan takes as a photo (any case): the images and the camera raws.
PHOTO_SUFFIXES = IMAGE_SUFFIXES | RAW_SUFFIXES
#: Every format the exif lane writes (the names :func:`sniff_format` gives).
WRITABLE_FORMATS = ("JPEG", "TIFF", "PNG", "HEIF", "AVIF", "WEBP", "JXL")
_HEIF_BRANDS = {b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1"}
_AVIF_BRANDS = {b"avif", b"avis"}
_JXL_CONTAINER = b"\x00\x00\x00\x0cJXL \r\n\x87\n"
_JXL_CODESTREAM = b"\xff\x0a"


def is_photo_name(path: str | os.PathLike[str]) -> bool:
    """True for a name with a photo suffix (any case): ``IMG_1.JPG``, ``a.avif``, ``DSC_1.nef``."""
    return Path(path).suffix.lower() in PHOTO_SUFFIXES


def sniff_format(head: bytes) -> str | None:
    """``"JPEG"``, ``"PNG"``, ``"TIFF"``, ``"HEIF"``, ``"AVIF"``, ``"WEBP"`` or ``"JXL"`` from a
    file's first bytes (32 suffice: an ISO BMFF file's brands), else None."""
    if head[:3] == b"\xff\xd8\xff":
        return "JPEG"
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return "PNG"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "TIFF"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    if head[:12] == _JXL_CONTAINER or head[:2] == _JXL_CODESTREAM:
        return "JXL"
    if head[4:8] == b"ftyp":
        major = head[8:12]
        if major in _AVIF_BRANDS:
            return "AVIF"
        if major in _HEIF_BRANDS:
            # a generic brand (mif1/msf1) names AVIF among its compatible brands when it is one
            size = int.from_bytes(head[:4], "big")
            compatible = {head[i : i + 4] for i in range(16, min(size, len(head)) - 3, 4)}
            generic = major in (b"mif1", b"msf1")
            if generic and compatible & _AVIF_BRANDS and not compatible & {b"heic", b"heix"}:
                return "AVIF"
            return "HEIF"
    return None


def is_jxl_codestream(head: bytes) -> bool:
    """A bare JPEG XL codestream (no container: it cannot hold metadata until exiftool wraps it)."""
    return head[:2] == _JXL_CODESTREAM


def read_source(src: Path) -> bytes:
    """The file's bytes, or UnreadableImage naming what is wrong (missing, a folder, empty, …)."""
    try:
        data = src.read_bytes()
    except FileNotFoundError as exc:
        raise UnreadableImage(src, "file does not exist") from exc
    except PermissionError as exc:
        raise UnreadableImage(src, "permission denied (file is not readable)") from exc
    except IsADirectoryError as exc:
        raise UnreadableImage(src, "is a directory, not an image file") from exc
    except OSError as exc:
        raise UnreadableImage(src, f"cannot read file: {exc.strerror or exc}") from exc
    if not data:
        raise UnreadableImage(src, "file is empty (0 bytes)")
    return data


def format_of(src: Path, data: bytes) -> str:
    """The writable format of ``data`` (:data:`WRITABLE_FORMATS`), else UnreadableImage."""
    fmt = sniff_format(data[:64])
    if fmt is None:
        looks = describe_content(data[:512], len(data))  # never quote the file's bytes
        raise UnreadableImage(
            src, f"not a JPEG, PNG, TIFF, HEIC/HEIF, AVIF, WebP or JPEG XL file ({looks})"
        )
    return fmt


# -- JPEG structure ------------------------------------------------------------------------------
@dataclass
class _Jpeg:
    segments: list[tuple[int, int, int]]  # (marker, start, end) of each header segment before SOS
    scan_start: int  # offset of the SOS marker: everything from here on is copied unchanged


def _split_jpeg(src: Path, data: bytes) -> _Jpeg:
    """Find the marker segments before the first SOS; raise UnreadableImage on a broken header."""
    if data[:2] != b"\xff\xd8":
        raise UnreadableImage(src, "not a JPEG file (no SOI marker)")
    pos, n = 2, len(data)
    segments: list[tuple[int, int, int]] = []
    while True:
        if pos >= n or data[pos] != 0xFF:
            raise UnreadableImage(src, f"corrupt JPEG header: expected a marker at byte {pos}")
        while pos < n and data[pos] == 0xFF:  # fill bytes
            pos += 1
        if pos >= n:
            raise UnreadableImage(src, "truncated JPEG header (no image data)")
        marker, start = data[pos], pos - 1
        pos += 1
        if marker == 0xD9:
            raise UnreadableImage(src, "JPEG ends before any image data (EOI before SOS)")
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:
            continue  # standalone markers carry no length
        if pos + 2 > n:
            raise UnreadableImage(src, "truncated JPEG header")
        (length,) = struct.unpack(">H", data[pos : pos + 2])
        if length < 2 or pos + length > n:
            raise UnreadableImage(src, f"truncated JPEG header (segment 0xFF{marker:02X} at byte {start})")
        if marker == 0xDA:
            return _Jpeg(segments, start)
        segments.append((marker, start, pos + length))
        pos += length


def jpeg_scan_data(data: bytes, path: str | os.PathLike[str] = "<bytes>") -> bytes:
    """The bytes of a JPEG from its first SOS marker to the end (the compressed image)."""
    return data[_split_jpeg(Path(path), data).scan_start :]


def check_complete(src: Path, fmt: str, data: bytes) -> None:
    """Refuse a JPEG whose header is broken or whose image data was cut off (no EOI marker after
    the scan: inside entropy-coded data 0xFF is always stuffed, so FF D9 only ends the image), or
    a PNG without its IEND chunk. exiftool itself would edit their metadata without noticing."""
    if fmt == "JPEG":
        scan = _split_jpeg(src, data).scan_start
        if data.find(b"\xff\xd9", scan) < 0:
            raise UnreadableImage(src, "truncated JPEG: the image data has no end (EOI) marker")
    elif fmt == "PNG" and data.rfind(b"IEND") < 0:
        raise UnreadableImage(src, "truncated PNG: no IEND chunk")


def register_openers() -> None:
    """Let Pillow open every format written here (:func:`photos.image_open.register_openers`)."""
    _register()


def check_decodes(
    src: str | os.PathLike[str], *, max_pixels: int = 200_000_000, digest: bool = False
) -> str | None:
    """Refuse (UnreadableImage) a file Pillow cannot decode: its structure is verified and every
    pixel row read (a JPEG at its smallest DCT scale, which still decodes all of its scan data).
    Every writing lane calls this, whether or not the job analyses its photos. ``digest``: return
    the digest of the decoded pixels (:func:`photos.verify.pixel_digest`'s), for a format the
    written copy is verified against by decoding; else None."""
    import hashlib

    from PIL import Image

    path = Path(src)
    try:
        with open_image(path) as img:
            if img.width * img.height > max_pixels:
                size = f"{img.width}x{img.height}"
                raise UnreadableImage(path, f"image of {size} pixels is larger than {max_pixels}")
            img.verify()
        with open_image(path) as img:
            if img.format == "JPEG" and not digest:
                img.draft(img.mode, (max(1, img.width // 8), max(1, img.height // 8)))
            img.load()
            if not digest:
                return None
            found = hashlib.sha256(f"{img.mode} {img.size}".encode())
            found.update(img.tobytes())
            return found.hexdigest()
    except (UnreadableImage, PhotoError):
        raise
    except Image.DecompressionBombError as exc:
        raise UnreadableImage(path, f"decompression bomb: {exc}") from None
    except decoding_errors() as exc:
        what = type(exc).__name__
        raise UnreadableImage(path, f"the image does not decode ({what}); nothing was written") from None
