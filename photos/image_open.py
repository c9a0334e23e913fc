"""Opening an image with Pillow: every format the project reads registered (HEIF through
pillow-heif, JPEG XL through pillow-jxl-plugin; AVIF and WebP are Pillow's own), Pillow's limits
on *metadata* raised, and the exceptions a decoder may raise for a bad file in one tuple.

Pillow refuses a PNG whose text chunks (``tEXt``/``zTXt``/``iTXt``: an XMP packet, a camera's
notes) are larger than ``PngImagePlugin.MAX_TEXT_CHUNK`` (1 MB) or together exceed
``MAX_TEXT_MEMORY`` (64 MB) with "Decompressed data too large" -- a valid picture then "does not
decode". Those limits guard memory spent on text, never pixels: they are raised here to
:data:`TEXT_LIMIT` (the decompression-bomb pixel limit is ``photos.analyze``'s and unchanged).

A module of its own, below everything that decodes (analysis, capture time, verification), so that
none of them imports another to have the openers registered.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import IO

from PIL import Image, PngImagePlugin

#: Pillow's PNG text limits raised to this (a chunk, and all of a file's text together).
TEXT_LIMIT = 256 * 1024 * 1024

_registered = False


def register_openers() -> None:
    """Register the HEIF and JPEG XL openers (once) and raise Pillow's PNG text limits."""
    global _registered
    if _registered:
        return
    try:
        import pillow_heif

        pillow_heif.register_heif_opener()
    except ImportError:  # pragma: no cover - a dependency; without it a HEIC does not decode
        pass
    try:
        import pillow_jxl  # noqa: F401  (registers the JPEG XL opener)
    except ImportError:  # pragma: no cover - a dependency; without it a JXL does not decode
        pass
    PngImagePlugin.MAX_TEXT_CHUNK = max(PngImagePlugin.MAX_TEXT_CHUNK, TEXT_LIMIT)
    PngImagePlugin.MAX_TEXT_MEMORY = max(PngImagePlugin.MAX_TEXT_MEMORY, TEXT_LIMIT)
    _registered = True


def open_image(fp: str | Path | IO[bytes]) -> Image.Image:
    """``Image.open`` with every opener registered (a context manager, as Pillow's)."""
    register_openers()
    return Image.open(fp)


def decoding_errors() -> tuple[type[BaseException], ...]:
    """What Pillow and its plugins raise for a file that does not decode: libjxl and libheif say
    so with a bare ``RuntimeError`` ("Generic Error"), which must never reach an item's error
    without the file's name."""
    return (
        OSError, SyntaxError, ValueError, EOFError, struct.error, IndexError, TypeError,
        RuntimeError, zlib.error, Image.DecompressionBombError,
    )  # fmt: skip
