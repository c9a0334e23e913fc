"""Which file names are photos: the suffixes a folder scan takes, and the formats every lane handles
(scans, analysis, rename, upload, archive). Camera raws are listed in ``photos.raw``."""

from __future__ import annotations

import os
from pathlib import Path

from photos.raw import RAW_SUFFIXES

#: Formats Pillow decodes (AVIF natively since Pillow 11.3, HEIC/HEIF through pillow-heif, JPEG XL
#: through pillow-jxl-plugin), lower case with the dot.
IMAGE_SUFFIXES = frozenset(
    {".jpg", ".jpeg", ".jpe", ".png", ".tif", ".tiff", ".heic", ".heif", ".hif", ".avif", ".jxl", ".webp"}
)
#: Every suffix a folder scan takes as a photo (any case).
PHOTO_SUFFIXES = IMAGE_SUFFIXES | RAW_SUFFIXES


def is_photo_name(path: str | os.PathLike[str]) -> bool:
    """True for a name with a photo suffix (any case): ``IMG_1.JPG``, ``a.avif``, ``DSC_1.nef``."""
    return Path(path).suffix.lower() in PHOTO_SUFFIXES
