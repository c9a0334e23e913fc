"""Facts about one photo: format, size, EXIF, hashes, sharpness, exposure, colours.

:func:`analyze` returns a JSON-serialisable dict; bad input (missing, empty, truncated, not an
image, unreadable, decompression bomb) raises :class:`UnreadableImage` naming the file and the
reason. Pixels are looked at on a reduced copy (JPEGs are decoded at reduced scale with
``Image.draft``), turned to the display orientation, so the numbers are comparable between
photos of different sizes and cheap to compute.

:func:`near_duplicate_groups` groups photos whose perceptual hashes are within a Hamming
distance of each other.
"""

from __future__ import annotations

import errno
import hashlib
import math
import os
import zlib
from collections.abc import Hashable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from PIL import Image, UnidentifiedImageError

from photos.capture_time import read_capture_time
from photos.errors import PhotoError, UnreadableImage, describe_content
from photos.image_open import register_openers
from photos.orientation import upright
from photos.raw import is_raw, raw_facts, raw_pixels

register_openers()  # HEIF, JPEG XL; Pillow's PNG text limits raised (metadata only)

#: Default pixel limit (width x height) above which a file is refused as a decompression bomb.
DEFAULT_MAX_PIXELS = 200_000_000
#: Long side of the reduced image on which sharpness, exposure and hashes are computed.
WORK_SIZE = 512
#: Luma at or below / at or above which a pixel counts as clipped (0..255).
SHADOW_CLIP, HIGHLIGHT_CLIP = 5, 250

# Pillow's own bomb check (a warning above MAX_IMAGE_PIXELS, an error above twice that) would
# fire for ordinary 100 MP photos; our explicit ``max_pixels`` check replaces it, so Pillow's
# global limit is raised to our default (never lowered, never re-enabled if someone disabled it).
if Image.MAX_IMAGE_PIXELS is not None and Image.MAX_IMAGE_PIXELS < DEFAULT_MAX_PIXELS:
    Image.MAX_IMAGE_PIXELS = DEFAULT_MAX_PIXELS

_CHUNK = 1024 * 1024
_EXIF_IFD, _GPS_IFD = 0x8769, 0x8825
_ORIENTATION, _MAKE, _MODEL = 0x0112, 0x010F, 0x0110
_DATETIME_ORIGINAL, _LENS_MAKE, _LENS_MODEL = 0x9003, 0xA433, 0xA434


def analyze(
    path: str | os.PathLike[str],
    *,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    located: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Return real facts about the image at ``path`` (all JSON-serialisable).

    Keys: ``format``, ``width``, ``height`` (stored pixels), ``display_width``,
    ``display_height`` (as shown: swapped for orientations 5-8), ``orientation`` (EXIF, 1-8),
    ``taken`` (ISO ``YYYY-MM-DDTHH:MM:SS``, from the first source of ``photos.capture_time``'s
    priority, or None), ``taken_subsec`` and ``taken_from`` (that source), ``make``, ``model``,
    ``lens``, ``gps`` (``{"lat", "lon"}`` floats, or None), ``file_size``, ``sha256``,
    ``phash``, ``dhash`` (hex), ``sharpness`` (variance of the Laplacian at 512 px long side),
    ``exposure`` (``mean`` luma 0..1, ``shadows_clipped`` and ``highlights_clipped`` shares),
    ``colors`` (up to 3 dominant colours, ``#rrggbb``, most common first).

    A camera raw (``photos.raw``) is never opened by Pillow: its facts come from its metadata
    (exiftool), its pixel measures from its largest embedded preview or LibRaw's demosaic; it adds
    ``raw`` (True) and ``pixels_from`` (the preview's tag, or ``libraw``).

    Raises UnreadableImage for anything that is not a whole, readable image of at most
    ``max_pixels`` pixels (a raw: neither a usable preview nor decodable by LibRaw). ``located``:
    the photo's real path when ``path`` is a pinned name (where its sidecars are found).
    """
    path = Path(path)
    try:
        with _open(path) as fh:
            size, sha256 = _hash_stream(fh)
            if size == 0:
                raise UnreadableImage(path, "file is empty (0 bytes)")
            if is_raw(path):
                facts = _analyze_raw(path, size, sha256, max_pixels)
            else:
                fh.seek(0)
                facts = _analyze_open(path, fh, size, sha256, max_pixels)
    except UnreadableImage:
        raise
    except OSError as exc:
        raise _os_error(path, exc) from exc
    return _finish(path, facts, located)


def header_facts(
    path: str | os.PathLike[str], *, located: str | os.PathLike[str] | None = None, hashed: bool = True
) -> dict[str, Any]:
    """The facts a move needs, from the file's bytes and headers only: no pixel is decoded (rename,
    upload and archive of a photo nothing can decode, such as a raw newer than LibRaw). The keys
    of :func:`analyze` but the pixel measures; ``width``/``height`` None where no header says.
    ``hashed=False``: without ``sha256`` (not a byte beyond the headers is read)."""
    path = Path(path)
    try:
        with _open(path) as fh:
            size, sha256 = _hash_stream(fh) if hashed else (os.fstat(fh.fileno()).st_size, None)
            facts: dict[str, Any] = {"format": None, "width": None, "height": None, "orientation": 1,
                                     "make": None, "model": None, "lens": None, "gps": None}  # fmt: skip
            if is_raw(path):
                try:
                    facts.update(raw_facts(path))
                except PhotoError:
                    pass  # exiftool cannot read it: a move needs none of it
            else:
                fh.seek(0)
                try:
                    with Image.open(fh) as img:  # the header only: Image.open decodes nothing
                        width, height = img.size
                        facts.update(format=img.format, width=width, height=height, **_exif_facts(img))
                except Exception:  # noqa: BLE001, S110 - not a format Pillow reads: a move needs none of it
                    pass
    except OSError as exc:
        raise _os_error(path, exc) from exc
    facts.update(file_size=size, sha256=sha256, header_only=True)
    return _finish(path, facts, located)


def display_size(
    width: int | None, height: int | None, orientation: int | None
) -> tuple[int | None, int | None]:
    """The size a photo is shown at: its stored size, width and height swapped for orientations 5-8
    (turned a quarter)."""
    return (height, width) if orientation in (5, 6, 7, 8) else (width, height)


def _finish(path: Path, facts: dict[str, Any], located: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The capture time from every source, and the displayed size, added to ``facts``."""
    facts["display_width"], facts["display_height"] = display_size(
        facts.get("width"), facts.get("height"), facts.get("orientation")
    )
    try:
        found = read_capture_time(path, located=located)
    except PhotoError:  # exiftool cannot read the metadata: what Pillow's EXIF reader said stands
        found = None
    if found is not None:
        facts.update(found.facts())
    return facts


def _open(path: Path) -> Any:
    return open(path, "rb")


def _os_error(path: Path, exc: OSError) -> UnreadableImage:
    """Map an OSError from opening/reading ``path`` to an UnreadableImage with a clear reason."""
    if isinstance(exc, FileNotFoundError) or exc.errno == errno.ENOENT:
        return UnreadableImage(path, "file does not exist")
    if isinstance(exc, PermissionError) or exc.errno in (errno.EACCES, errno.EPERM):
        return UnreadableImage(path, "permission denied (file is not readable)")
    if isinstance(exc, IsADirectoryError) or exc.errno == errno.EISDIR:
        return UnreadableImage(path, "is a directory, not an image file")
    return UnreadableImage(path, f"cannot read file: {exc.strerror or exc}")


def _hash_stream(fh: Any) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    while chunk := fh.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


def _analyze_open(path: Path, fh: Any, size: int, sha256: str, max_pixels: int) -> dict[str, Any]:
    try:
        img = Image.open(fh)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise UnreadableImage(path, f"refused as a decompression bomb: {exc}") from exc
    except UnidentifiedImageError as exc:
        looks = describe_content(_head(fh), size)
        raise UnreadableImage(path, f"not an image file Pillow can read ({looks})") from exc
    except (OSError, ValueError, SyntaxError, RuntimeError, zlib.error, EOFError) as exc:
        raise UnreadableImage(path, f"corrupt image header: {exc}") from exc
    with img:
        width, height = img.size
        fmt = img.format or "UNKNOWN"
        if width <= 0 or height <= 0:
            raise UnreadableImage(path, f"{fmt} header claims an empty image ({width}x{height})")
        if width * height > max_pixels:
            raise UnreadableImage(
                path,
                f"refused as a decompression bomb: {width}x{height} = {width * height} pixels "
                f"exceeds the limit of {max_pixels}",
            )
        exif = _exif_facts(img)
        try:
            if fmt == "JPEG":
                img.draft("RGB", (WORK_SIZE, WORK_SIZE))
            img.load()  # inside the try: truncation and decoder errors surface here
            work = _working_image(img)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise UnreadableImage(path, f"refused as a decompression bomb: {exc}") from exc
        except (OSError, ValueError, SyntaxError, RuntimeError, zlib.error, EOFError, MemoryError) as exc:
            raise UnreadableImage(path, f"cannot decode {fmt} data (truncated or corrupt): {exc}") from exc
    work = upright(work, exif["orientation"])
    return {
        "format": fmt,
        "width": width,
        "height": height,
        **exif,
        "file_size": size,
        "sha256": sha256,
        **_measures(work),
    }


def _analyze_raw(path: Path, size: int, sha256: str, max_pixels: int) -> dict[str, Any]:
    """A camera raw: the facts from its metadata, the pixel measures from its embedded preview (or
    LibRaw's demosaic, ``pixels_from`` says which); never written, never opened by Pillow."""
    facts = raw_facts(path)
    width, height = facts["width"], facts["height"]
    if width and height and width * height > max_pixels:
        raise UnreadableImage(
            path, f"refused as a decompression bomb: {width}x{height} = {width * height} pixels "
            f"exceeds the limit of {max_pixels}",
        )  # fmt: skip
    pixels = raw_pixels(path, facts["orientation"])
    if not (width and height):  # the metadata did not say: the picture's own size
        facts["width"], facts["height"] = pixels.image.size
    work = _working_image(pixels.image)
    return {
        **facts,
        "raw": True,
        "pixels_from": pixels.source,
        "file_size": size,
        "sha256": sha256,
        **_measures(work),
    }


def _head(fh: Any) -> bytes:
    try:
        fh.seek(0)
        return fh.read(512)
    except OSError:
        return b""


def _working_image(img: Image.Image) -> Image.Image:
    """An RGB copy with a long side of exactly WORK_SIZE pixels."""
    if img.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        import numpy as np  # here, not at the top: a worker that serves no analysis boots without it

        arr = np.asarray(img, dtype=np.float64)
        top = float(arr.max()) or 1.0
        rgb = Image.fromarray((arr / top * 255).clip(0, 255).astype(np.uint8), "L").convert("RGB")
    elif img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        rgb = Image.new("RGB", rgba.size, (255, 255, 255))
        rgb.paste(rgba, mask=rgba.getchannel("A"))
    else:
        rgb = img.convert("RGB")
    w, h = rgb.size
    scale = WORK_SIZE / max(w, h)
    new_size = (max(1, round(w * scale)), max(1, round(h * scale)))
    if new_size != rgb.size:
        rgb = rgb.resize(new_size, Image.Resampling.BILINEAR, reducing_gap=2.0)
    return rgb


# -- EXIF ----------------------------------------------------------------------------------------
def _exif_facts(img: Image.Image) -> dict[str, Any]:
    """orientation, taken, make, model, lens, gps; missing or malformed EXIF gives Nones."""
    facts: dict[str, Any] = {
        "orientation": 1,
        "taken": None,
        "make": None,
        "model": None,
        "lens": None,
        "gps": None,
    }
    try:
        exif = img.getexif()
        ifd0 = dict(exif)
        sub = dict(exif.get_ifd(_EXIF_IFD))
        gps = dict(exif.get_ifd(_GPS_IFD))
    except Exception:  # malformed EXIF is not a reason to refuse the pixels
        return facts
    orientation = ifd0.get(_ORIENTATION)
    if isinstance(orientation, int) and 1 <= orientation <= 8:
        facts["orientation"] = orientation
    facts["taken"] = parse_exif_datetime(sub.get(_DATETIME_ORIGINAL))
    facts["make"] = _text(ifd0.get(_MAKE))
    facts["model"] = _text(ifd0.get(_MODEL))
    facts["lens"] = _text(sub.get(_LENS_MODEL))
    facts["gps"] = _gps(gps)
    return facts


def parse_exif_datetime(value: object) -> str | None:
    """``"2021:07:04 18:30:05"`` → ``"2021-07-04T18:30:05"``; None for missing/blank/invalid."""
    text = _text(value)
    if not text:
        return None
    try:
        return datetime.strptime(text[:19], "%Y:%m:%d %H:%M:%S").isoformat()
    except ValueError:
        return None


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            value = value.decode("latin-1")
    if not isinstance(value, str):
        return None
    value = value.replace("\x00", "").strip()
    return value or None


def _gps(gps: dict[int, Any]) -> dict[str, float] | None:
    try:
        lat = _dms(gps[2], gps.get(1), "S")
        lon = _dms(gps[4], gps.get(3), "W")
    except (KeyError, TypeError, ValueError, ZeroDivisionError, IndexError):
        return None
    if lat is None or lon is None or not (-90 <= lat <= 90 and -180 <= lon <= 180):
        return None
    return {"lat": round(lat, 7), "lon": round(lon, 7)}


def _dms(value: Any, ref: Any, negative_ref: str) -> float | None:
    d, m, s = (float(v) for v in value)
    result = d + m / 60 + s / 3600
    if not math.isfinite(result):
        return None
    ref_text = _text(ref) or ""
    return -result if ref_text.upper().startswith(negative_ref) else result


# -- pixel measures ------------------------------------------------------------------------------
def sharpness(img: Image.Image) -> float:
    """Variance of the 4-neighbour Laplacian of the grayscale image (higher = sharper)."""
    import numpy as np

    g = np.asarray(img.convert("L"), dtype=np.float32)
    if g.shape[0] < 3 or g.shape[1] < 3:
        return 0.0
    lap = g[1:-1, :-2] + g[1:-1, 2:] + g[:-2, 1:-1] + g[2:, 1:-1] - 4.0 * g[1:-1, 1:-1]
    return round(float(lap.var()), 3)


def exposure(img: Image.Image) -> dict[str, float]:
    """Mean luma (0..1) and the shares of clipped shadows and highlights."""
    import numpy as np

    y = np.asarray(img.convert("L"), dtype=np.uint8)
    n = y.size or 1
    return {
        "mean": round(float(y.mean()) / 255.0, 4),
        "shadows_clipped": round(float(np.count_nonzero(y <= SHADOW_CLIP)) / n, 4),
        "highlights_clipped": round(float(np.count_nonzero(y >= HIGHLIGHT_CLIP)) / n, 4),
    }


def dominant_colors(img: Image.Image, count: int = 3, *, min_distance: float = 40.0) -> list[str]:
    """Up to ``count`` dominant colours (``#rrggbb``), most common first.

    Median cut to 8 colours on a 64 px thumbnail; a colour closer than ``min_distance`` (RGB
    Euclidean) to one already chosen is skipped, so the result is not three shades of one colour.
    """
    small = img.convert("RGB")
    small.thumbnail((64, 64), Image.Resampling.BILINEAR)
    quant = small.quantize(colors=8, method=Image.Quantize.MEDIANCUT)
    palette = quant.getpalette() or []
    chosen: list[tuple[int, int, int]] = []
    for _n, index in sorted(quant.getcolors() or [], key=lambda c: (-c[0], c[1])):
        rgb = (palette[index * 3], palette[index * 3 + 1], palette[index * 3 + 2])
        if all(math.dist(rgb, other) >= min_distance for other in chosen):
            chosen.append(rgb)
        if len(chosen) == count:
            break
    return [f"#{r:02x}{g:02x}{b:02x}" for r, g, b in chosen]


# -- near duplicates -----------------------------------------------------------------------------
def hamming(hex_a: str, hex_b: str) -> int:
    """Number of differing bits between two equal-length hex hashes."""
    if len(hex_a) != len(hex_b):
        raise ValueError(f"hashes differ in length: {hex_a!r} vs {hex_b!r}")
    return (int(hex_a, 16) ^ int(hex_b, 16)).bit_count()


K = TypeVar("K", bound=Hashable)


def near_duplicate_groups(items: Iterable[tuple[K, str | None]], max_distance: int = 6) -> list[list[K]]:
    """Groups (size >= 2) of keys whose perceptual hashes are within ``max_distance`` bits.

    Grouping is transitive (A~B and B~C put A, B, C together). Members keep input order and
    groups are ordered by their first member, so the result is deterministic. Items whose hash
    is None (unreadable photos) are ignored; hashes must all have the same length.
    """
    import numpy as np

    keys: list[K] = []
    hashes: list[str] = []
    for key, phash in items:
        if phash is None:
            continue
        keys.append(key)
        hashes.append(phash.lower())
    n = len(keys)
    if n < 2:
        return []
    width = len(hashes[0])
    if any(len(h) != width for h in hashes):
        raise ValueError("all perceptual hashes must have the same length")
    words = (width + 15) // 16
    padded = [h.rjust(words * 16, "0") for h in hashes]
    try:
        arr = np.array(
            [[int(h[i * 16 : (i + 1) * 16], 16) for i in range(words)] for h in padded], dtype=np.uint64
        )
    except ValueError as exc:
        raise ValueError(f"malformed hex hash: {exc}") from exc

    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(n - 1):
        dist = np.bitwise_count(arr[i + 1 :] ^ arr[i]).sum(axis=1)
        for j in np.nonzero(dist <= max_distance)[0]:
            a, b = find(i), find(i + 1 + int(j))
            if a != b:
                parent[max(a, b)] = min(a, b)
    groups: dict[int, list[K]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(keys[i])
    return [members for _root, members in sorted(groups.items()) if len(members) >= 2]


def _measures(work: Image.Image) -> dict[str, Any]:
    """The pixel measures of a working-size picture: perceptual hashes, sharpness, exposure, colours."""
    import imagehash  # with numpy, 0.1 s of CPU a worker process would pay at boot

    return {
        "phash": str(imagehash.phash(work)),
        "dhash": str(imagehash.dhash(work)),
        "sharpness": sharpness(work),
        "exposure": exposure(work),
        "colors": dominant_colors(work),
    }
