"""Camera RAW files: which names are raws, and what is read from one (camera facts, pixels).

A raw is never written (docs/design.md rule 10; its metadata goes to an XMP sidecar, ``photos.sidecar``).
Reading one: the camera's facts (make, model, lens, capture time, orientation, size, GPS) come from
its metadata through exiftool; the pixels the analysis looks at come from the largest embedded JPEG
preview that decodes (``JpgFromRaw``, ``PreviewImage``, ``OtherImage``, ``ThumbnailImage`` — the
camera's own rendering, cheap to read) or, where the file carries none, from LibRaw through
``rawpy`` (half-size demosaic). A raw that neither carries a usable preview nor decodes is
refused with :class:`UnreadableImage` saying so, and nothing touches it.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from PIL import Image

from photos import exiftool
from photos.errors import NeedsExiftool, PhotoError, UnreadableImage
from photos.orientation import upright

#: Every common camera raw extension (lower case, with the dot): Canon, Nikon, Sony, Adobe DNG,
#: Olympus/OM, Panasonic, Fujifilm, Pentax, Samsung, Sigma, Phase One, Hasselblad, Minolta, Epson,
#: Kodak, Leaf, Mamiya, Leica, Sinar and others LibRaw reads.
RAW_SUFFIXES = frozenset(
    {
        ".3fr", ".ari", ".arw", ".bay", ".braw", ".cap", ".cr2", ".cr3", ".crw", ".cs1", ".dcr",
        ".dcs", ".dng", ".drf", ".eip", ".erf", ".fff", ".gpr", ".iiq", ".k25", ".kdc", ".mdc",
        ".mef", ".mos", ".mrw", ".nef", ".nrw", ".orf", ".ori", ".pef", ".ptx", ".pxn", ".r3d",
        ".raf", ".raw", ".rw2", ".rwl", ".rwz", ".sr2", ".srf", ".srw", ".sti", ".x3f",
    }
)  # fmt: skip

#: Embedded previews, best first (exiftool tag names).
PREVIEW_TAGS = ("JpgFromRaw", "PreviewImage", "OtherImage", "ThumbnailImage")

_FACT_TAGS = (
    "-FileType",
    "-Make",
    "-Model",
    "-LensModel",
    "-Lens",
    "-DateTimeOriginal",
    "-Orientation",
    "-ImageSize",
    "-Composite:GPSLatitude",
    "-Composite:GPSLongitude",
)


def is_raw(path: str | os.PathLike[str]) -> bool:
    """True for a name with a camera raw extension (any case): ``IMG_0001.CR2``, ``a.nef``."""
    return Path(path).suffix.lower() in RAW_SUFFIXES


@dataclass
class RawPixels:
    """What the analysis looks at: an RGB image already turned upright, and where it came from."""

    image: Image.Image
    source: str  # "JpgFromRaw" | "PreviewImage" | … | "libraw"


def raw_facts(path: Path) -> dict[str, Any]:
    """The camera's facts from the raw's metadata (exiftool): ``format`` (exiftool's file type,
    e.g. ``NEF``), ``width``/``height`` (the sensor image), ``orientation``, ``taken`` (ISO, its
    EXIF DateTimeOriginal; a raw's capture time as photo apps read it, its sidecar's first, is
    ``photos.capture_time``'s),
    ``make``, ``model``, ``lens``, ``gps``. Missing values are None."""
    try:
        record = _read_tags(path, *_FACT_TAGS)
    except NeedsExiftool:
        raise
    except PhotoError:  # exiftool cannot read it: the pixels decide whether it is a raw at all
        record = {}
    width = height = None
    size = str(record.get("ImageSize") or "")
    parts = size.replace("x", " ").split()
    if len(parts) == 2 and all(p.isdigit() for p in parts):
        width, height = int(parts[0]), int(parts[1])
    orientation = record.get("Orientation")
    lat, lon = record.get("GPSLatitude"), record.get("GPSLongitude")
    gps = None
    if (
        isinstance(lat, int | float)
        and isinstance(lon, int | float)
        and -90 <= lat <= 90
        and -180 <= lon <= 180
    ):
        gps = {"lat": round(float(lat), 7), "lon": round(float(lon), 7)}
    return {
        "format": str(record.get("FileType") or path.suffix.lstrip(".").upper()),
        "width": width,
        "height": height,
        "orientation": orientation if isinstance(orientation, int) and 1 <= orientation <= 8 else 1,
        "taken": iso_time(record.get("DateTimeOriginal")),
        "make": _text(record.get("Make")),
        "model": _text(record.get("Model")),
        "lens": _text(record.get("LensModel")) or _text(record.get("Lens")),
        "gps": gps,
    }


def raw_pixels(path: Path, orientation: int) -> RawPixels:
    """The raw's picture, upright: its largest embedded preview that decodes, else LibRaw's
    demosaic. ``UnreadableImage`` when there is neither (the reason names both)."""
    preview = _best_preview(path)
    if preview is not None:
        tag, img = preview
        return RawPixels(upright(img, orientation), tag)
    try:
        return RawPixels(_libraw(path), "libraw")
    except UnreadableImage as exc:
        raise UnreadableImage(
            path,
            f"camera raw with no usable embedded preview that LibRaw cannot decode either ({exc.reason})",
        ) from None


def _best_preview(path: Path) -> tuple[str, Image.Image] | None:
    tool = _tool(path)
    with exiftool.private_folder("pj-raw-") as tmp:
        pattern = os.path.join(tmp, "%t%c.%s")
        try:
            tool.execute(
                "-a", "-b", "-W", pattern, *(f"-{t}" for t in PREVIEW_TAGS), os.path.abspath(path),
                retry_if_died=True,
            )  # fmt: skip
        except PhotoError:
            return None  # nothing extracted (or exiftool cannot read the file): LibRaw decides
        best: tuple[int, int, str, Image.Image] | None = None
        for name in sorted(os.listdir(tmp)):
            tag = next((t for t in PREVIEW_TAGS if name.startswith(t)), None)
            if tag is None:
                continue
            try:
                data = Path(tmp, name).read_bytes()
                img = Image.open(io.BytesIO(data))
                img.load()
            except Exception:  # noqa: S112 - a preview that does not decode is not a preview: try the next
                continue
            area = img.size[0] * img.size[1]
            rank = (area, -PREVIEW_TAGS.index(tag))
            if best is None or rank > best[:2]:
                best = (*rank, tag, img.convert("RGB"))
        return (best[2], best[3]) if best is not None else None


def _libraw(path: Path) -> Image.Image:
    try:
        import rawpy
    except ImportError as exc:  # pragma: no cover - a pinned dependency
        raise UnreadableImage(path, "rawpy (LibRaw) is not installed: pip install rawpy") from exc
    try:
        with rawpy.imread(str(path)) as raw:
            rgb = raw.postprocess(half_size=True, use_camera_wb=True, output_bps=8)
    except (rawpy.LibRawError, OSError, ValueError, MemoryError) as exc:
        raise UnreadableImage(path, f"LibRaw: {type(exc).__name__}: {_short(exc)}") from None
    return Image.fromarray(rgb, "RGB")  # LibRaw applies the camera's orientation itself


def _tool(path: Path) -> exiftool.ExifTool:
    if not exiftool.available():
        raise NeedsExiftool(path, f"reading a camera raw needs exiftool ({exiftool.INSTALL_HINT})")
    return exiftool.ExifTool.shared()


def _read_tags(path: Path, *tags: str) -> dict[str, Any]:
    """``exiftool -j -n`` of ``tags`` (group names dropped); PhotoError naming the file on failure."""
    out = _tool(path).execute("-j", "-n", *tags, os.path.abspath(path), retry_if_died=True)
    try:
        record = json.loads(out)[0] if out.strip() else {}
    except (ValueError, IndexError) as exc:
        raise PhotoError(path, "exiftool gave unreadable output for the file") from exc
    record.pop("SourceFile", None)
    return dict(record)


def iso_time(value: object) -> str | None:
    """``"2021:07:04 18:30:05"`` (optionally with sub-seconds or a zone) -> ``"2021-07-04T18:30:05"``."""
    text = str(value).replace("\x00", "").strip() if value not in (None, "") else ""
    try:
        return datetime.strptime(text[:19], "%Y:%m:%d %H:%M:%S").isoformat() if text else None
    except ValueError:
        return None


def _text(value: object) -> str | None:
    text = str(value).strip() if value not in (None, "") else ""
    return text or None


def _short(exc: BaseException) -> str:
    text = str(exc.args[0] if exc.args else exc)
    if text.startswith(("b'", 'b"')):
        text = text[2:-1]
    return text[:120]
