"""The EXIF orientation tag (1-8) as the transpose that turns a decoded picture upright."""

from __future__ import annotations

from PIL import Image

_OPS = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


def upright(img: Image.Image, orientation: int | None) -> Image.Image:
    """``img`` turned as its orientation tag says (unchanged for 1, None or an unknown value)."""
    op = _OPS.get(orientation or 1)
    return img.transpose(op) if op is not None else img
