"""Verify before replace: the copy exiftool wrote is checked against the original before it may
replace it (issue 40).

Where the format allows it cheaply the check is structural -- the bytes that make the pixels are
compared, and they must be identical:

=======  ========================================================================================
JPEG     every segment but the metadata ones (APP1-APP13, APP15, COM), and the scan data to the end
PNG      IHDR, PLTE, tRNS and the IDAT stream (concatenated: exiftool never re-chunks it)
JXL      the codestream (``jxlc``, or the ``jxlp`` parts joined), and the written copy decodes
=======  ========================================================================================

Every other format (TIFF, HEIF, AVIF, WebP) is decoded again and its pixels compared with the
original's (:func:`pixel_digest`, taken when the original was checked before the write). A copy
that differs, or does not decode, is refused: :class:`photos.errors.PhotoError` naming the file
and what broke; the caller removes the copy and the original stays as it was.

A JPEG XL carrying JPEG reconstruction data (a ``jbrd`` box: a JPEG recompressed by ``cjxl``)
records the original JPEG's metadata markers byte for byte; once exiftool changes the Exif or XMP
boxes, libjxl refuses to decode the file ("Generic Error"). :func:`drop_jbrd` removes that box
from the written copy: the codestream -- the pixels -- is unchanged; what is lost is only the
ability to rebuild the original JPEG file bit for bit (which the edit ended anyway).
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterator
from pathlib import Path

from photos.errors import PhotoError, UnreadableImage
from photos.image_open import decoding_errors, open_image

#: JPEG markers holding metadata exiftool may rewrite (APP1-APP13, APP15, COM). APP0 (JFIF) and
#: APP14 (Adobe: the colour transform) shape the pixels and must stay as they were.
_JPEG_METADATA = frozenset({*range(0xE1, 0xEE), 0xEF, 0xFE})
#: PNG chunks the pixels are made of.
_PNG_PIXELS = (b"IHDR", b"PLTE", b"tRNS")
_JXL_CONTAINER = b"\x00\x00\x00\x0cJXL \r\n\x87\n"
#: Formats checked by their bytes (the rest are decoded again).
STRUCTURAL = frozenset({"JPEG", "PNG", "JXL"})


class NotVerified(PhotoError):
    """The written copy is not the original's picture (or does not decode): nothing is written."""


def pixel_digest(path: str | os.PathLike[str]) -> str:
    """A digest of the decoded pixels (mode, size and every byte), for formats checked by decoding."""
    path = Path(path)
    try:
        with open_image(path) as img:
            img.load()
            digest = hashlib.sha256(f"{img.mode} {img.size}".encode())
            digest.update(img.tobytes())
            return digest.hexdigest()
    except decoding_errors() as exc:
        raise UnreadableImage(path, f"the image does not decode ({type(exc).__name__})") from None


def verify_written(
    src: str | os.PathLike[str],
    written: str | os.PathLike[str],
    fmt: str,
    *,
    src_data: bytes,
    src_pixels: str | None = None,
) -> None:
    """Raise :class:`NotVerified` (naming ``src``) unless the copy at ``written`` holds the same
    picture as ``src`` (whose bytes are ``src_data``; ``src_pixels`` its :func:`pixel_digest`
    for the formats checked by decoding)."""
    src = Path(src)
    try:
        data = Path(written).read_bytes()
    except OSError as exc:
        raise NotVerified(
            src, f"its written copy cannot be read back ({exc.strerror}); nothing was written"
        ) from None
    if fmt == "JPEG":
        same = _jpeg_pixel_parts(src_data) == _jpeg_pixel_parts(data)
        what = "the image data (JPEG tables or scan data)"
    elif fmt == "PNG":
        same = _png_pixel_parts(src_data) == _png_pixel_parts(data)
        what = "the image data (PNG header, palette or IDAT stream)"
    elif fmt == "JXL":
        same = jxl_codestream(src_data) == jxl_codestream(data)
        what = "the JPEG XL codestream"
        if same:
            _decodes(src, written)
    else:
        try:
            after = pixel_digest(written)
        except UnreadableImage as exc:
            raise NotVerified(
                src, f"its written copy does not decode ({exc.reason}); nothing was written"
            ) from None
        before = src_pixels if src_pixels is not None else pixel_digest(src)
        same = after == before
        what = "the decoded pixels"
    if not same:
        raise NotVerified(src, f"the written copy changed {what}; refused, nothing was written")


def _decodes(src: Path, written: str | os.PathLike[str]) -> None:
    try:
        with open_image(Path(written)) as img:
            img.load()
    except decoding_errors() as exc:
        raise NotVerified(
            src, f"its written copy does not decode ({type(exc).__name__}); refused, nothing was written"
        ) from None


# -- JPEG ----------------------------------------------------------------------------------------
def _jpeg_pixel_parts(data: bytes) -> tuple[bytes, ...] | None:
    """The segments that make a JPEG's pixels (tables, frame, APP0/APP14) and its scan data."""
    if data[:2] != b"\xff\xd8":
        return None
    pos, n, parts = 2, len(data), []
    while pos < n:
        if data[pos] != 0xFF:
            return None
        while pos < n and data[pos] == 0xFF:
            pos += 1
        if pos >= n:
            return None
        marker = data[pos]
        pos += 1
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:
            continue
        if pos + 2 > n:
            return None
        (length,) = struct.unpack(">H", data[pos : pos + 2])
        if marker == 0xDA:
            parts.append(data[pos - 2 :])  # the first scan to the end of the file
            return tuple(parts)
        if marker not in _JPEG_METADATA:
            parts.append(data[pos - 2 : pos + length])
        pos += length
    return None


# -- PNG -----------------------------------------------------------------------------------------
def _png_chunks(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    pos = 8
    while pos + 8 <= len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        yield kind, data[pos + 8 : pos + 8 + length]
        if kind == b"IEND":
            return
        pos += 12 + length


def _png_pixel_parts(data: bytes) -> tuple[tuple[bytes, bytes], ...] | None:
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    kept: list[tuple[bytes, bytes]] = []
    idat = bytearray()
    for kind, body in _png_chunks(data):
        if kind == b"IDAT":
            idat += body
        elif kind in _PNG_PIXELS:
            kept.append((kind, body))
    return (*kept, (b"IDAT", bytes(idat)))


# -- JPEG XL -------------------------------------------------------------------------------------
def _boxes(data: bytes) -> Iterator[tuple[str, int, int, int]]:
    """ISO BMFF top-level boxes: (type, box start, payload start, box end)."""
    pos, n = 0, len(data)
    while pos + 8 <= n:
        size, kind = struct.unpack(">I4s", data[pos : pos + 8])
        head = 8
        if size == 1:
            if pos + 16 > n:
                return
            (size,) = struct.unpack(">Q", data[pos + 8 : pos + 16])
            head = 16
        elif size == 0:
            size = n - pos
        if size < head or pos + size > n:
            return
        yield kind.decode("latin-1"), pos, pos + head, pos + size
        pos += size


def jxl_codestream(data: bytes) -> bytes | None:
    """The JPEG XL codestream of a bare codestream or of the container (``jxlc``, or the ``jxlp``
    parts, each after its 4-byte index, joined)."""
    if data[:2] == b"\xff\x0a":
        return data
    if data[:12] != _JXL_CONTAINER:
        return None
    parts: list[bytes] = []
    for kind, _, payload, end in _boxes(data):
        if kind == "jxlc":
            return data[payload:end]
        if kind == "jxlp":
            parts.append(data[payload + 4 : end])
    return b"".join(parts) if parts else None


def has_jbrd(data: bytes) -> bool:
    """True for a JPEG XL container carrying JPEG reconstruction data (a ``jbrd`` box)."""
    return data[:12] == _JXL_CONTAINER and any(kind == "jbrd" for kind, *_ in _boxes(data))


def drop_jbrd(data: bytes) -> bytes:
    """The JPEG XL container without its ``jbrd`` box (every other box byte for byte)."""
    out = bytearray()
    for kind, start, _, end in _boxes(data):
        if kind != "jbrd":
            out += data[start:end]
    if len(out) + sum(e - s for k, s, _, e in _boxes(data) if k == "jbrd") != len(data):
        raise ValueError("the JPEG XL container has bytes after its last box")
    return bytes(out)
