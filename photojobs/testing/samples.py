"""Realistic, deterministic sample photos for demos, tests and benchmarks (photojobs.testing).

:func:`generate_samples` writes JPEGs with varied content (gradients, shapes, grain; so their
perceptual hashes differ), cameras, lenses, capture dates over several years (with bursts of
photos taken in the same second), GPS on some, orientations 1/3/6/8, and names that include
spaces and non-ASCII characters. It can add near-duplicates (the same scene resized,
brightened and recompressed) and corrupt files (empty, truncated, text named ``.jpg``).

:func:`make_png`, :func:`make_tiff` and :func:`make_heic` write small lossless test images.
"""

from __future__ import annotations

import io
import os
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import piexif
from PIL import Image, ImageChops, ImageDraw, ImageEnhance

CAMERAS: tuple[tuple[str, str, str | None], ...] = (
    ("Canon", "Canon EOS 5D Mark IV", "EF24-70mm f/2.8L II USM"),
    ("NIKON CORPORATION", "NIKON D850", "AF-S NIKKOR 24-70mm f/2.8E ED VR"),
    ("SONY", "ILCE-7M3", "FE 24-105mm F4 G OSS"),
    ("FUJIFILM", "X-T4", "XF16-55mmF2.8 R LM WR"),
    ("Apple", "iPhone 13 Pro", "iPhone 13 Pro back triple camera 5.7mm f/1.5"),
    ("Google", "Pixel 7", None),
    ("OLYMPUS CORPORATION", "E-M1MarkII", "OLYMPUS M.12-40mm F2.8"),
    ("Panasonic", "DC-GH5", "LUMIX G VARIO 12-35/F2.8II"),
)
PLACES: tuple[tuple[float, float], ...] = (
    (48.8566, 2.3522),  # Paris
    (35.6762, 139.6503),  # Tokyo
    (-33.8688, 151.2093),  # Sydney
    (40.7128, -74.0060),  # New York
    (-22.9068, -43.1729),  # Rio de Janeiro
    (64.1466, -21.9426),  # Reykjavik
)
NAME_STYLES: tuple[str, ...] = (
    "IMG_{n:04d}.jpg",
    "DSC_{n:04d}.JPG",
    "P{n:07d}.JPG",
    "DSCF{n:04d}.jpg",
    "PXL_2023_{n:05d}.jpg",
    "Été à Paris {n:02d}.jpg",
    "Holiday photo {n}.jpeg",
    "東京 タワー {n}.jpg",
    "Ñandú {n}.JPG",
)
ORIENTATIONS = (1, 1, 1, 1, 3, 6, 6, 8)
EPOCH = datetime(2015, 1, 1, 8, 0, 0)
SPAN_SECONDS = 9 * 365 * 86400
QUALITY = 85
_CORRUPT_KINDS = ("empty", "truncated", "text")


def generate_samples(
    dest: str | os.PathLike[str],
    count: int,
    *,
    seed: int = 0,
    corrupt: int = 0,
    near_duplicates: int = 0,
    size: tuple[int, int] = (1600, 1200),
) -> list[Path]:
    """Write ``count`` good photos, then ``near_duplicates`` altered copies of the first ones,
    then ``corrupt`` broken files (cycling empty / truncated JPEG / text named ``.jpg``) into
    ``dest``; return all their paths in that order. Same arguments, same bytes.

    Near-duplicate ``k`` is a copy of good photo ``k % count`` named ``"<stem> (edit k+1).jpg"``;
    corrupt files are named ``corrupt_<kind>_NN.jpg``.
    """
    if count < 0 or corrupt < 0 or near_duplicates < 0:
        raise ValueError("count, corrupt and near_duplicates must be >= 0")
    if near_duplicates and not count:
        raise ValueError("near_duplicates need at least one original photo (count >= 1)")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    names = _names(count)
    plans = _plans(count, seed)
    workers = min(8, os.cpu_count() or 1)
    grain = _grain(seed, size) if count else None

    def make_original(i: int) -> Path:
        path = dest / names[i]
        path.write_bytes(_jpeg_bytes(_render(seed, i, size, grain), plans[i]))
        return path

    def make_duplicate(k: int) -> Path:
        original = dest / names[k % count]
        path = original.with_name(f"{original.stem} (edit {k + 1}).jpg")
        path.write_bytes(_near_duplicate(original.read_bytes(), seed, k))
        return path

    with ThreadPoolExecutor(max_workers=workers) as pool:
        paths = list(pool.map(make_original, range(count)))
        paths += list(pool.map(make_duplicate, range(near_duplicates)))
    for k in range(corrupt):
        kind = _CORRUPT_KINDS[k % len(_CORRUPT_KINDS)]
        path = dest / f"corrupt_{kind}_{k + 1:02d}.jpg"
        path.write_bytes(_corrupt_bytes(kind, seed, k, size))
        paths.append(path)
    return paths


def _names(count: int) -> list[str]:
    """Unique, camera-like names; some with spaces and non-ASCII characters."""
    return [NAME_STYLES[i % len(NAME_STYLES)].format(n=i + 1) for i in range(count)]


def _plans(count: int, seed: int) -> list[dict[str, object]]:
    """Per-photo metadata. Every 7th photo is in the same second as the one before (a burst)."""
    rng = np.random.default_rng([seed, 0xE1F])
    plans: list[dict[str, object]] = []
    for i in range(count):
        if i % 7 == 6 and plans:
            taken = plans[-1]["taken"]
        else:
            taken = EPOCH + timedelta(seconds=int(rng.integers(0, SPAN_SECONDS)))
        camera = CAMERAS[int(rng.integers(0, len(CAMERAS)))]
        gps = None
        if rng.random() < 0.4:
            lat, lon = PLACES[int(rng.integers(0, len(PLACES)))]
            gps = (lat + float(rng.normal(0, 0.02)), lon + float(rng.normal(0, 0.02)))
        plans.append(
            {
                "taken": taken,
                "camera": camera,
                "gps": gps,
                "orientation": ORIENTATIONS[int(rng.integers(0, len(ORIENTATIONS)))],
                "iso": int(rng.choice([100, 200, 400, 800, 1600, 3200])),
            }
        )
    return plans


# -- pixels --------------------------------------------------------------------------------------
def _grain(seed: int, size: tuple[int, int]) -> Image.Image:
    """A deterministic RGB sensor-noise texture of the photo size (shared by all photos)."""
    rng = np.random.default_rng([seed, 0x6A1])
    w, h = size
    noise = rng.integers(0, 16, size=(h, w, 3), dtype=np.uint8)
    return Image.fromarray(noise, "RGB")


def _render(seed: int, index: int, size: tuple[int, int], grain: Image.Image) -> Image.Image:
    """A scene: a two-colour gradient at a random angle, big shapes, fine detail and grain."""
    rng = np.random.default_rng([seed, index, 0x5CE])
    w, h = size
    sw, sh = max(4, w // 8), max(4, h // 8)
    yy, xx = np.mgrid[0:sh, 0:sw].astype(np.float32)
    angle = rng.uniform(0, 2 * np.pi)
    t = (np.cos(angle) * xx / sw + np.sin(angle) * yy / sh + 1) / 2
    ramp = Image.fromarray((t * 255).astype(np.uint8), "L").resize((w, h), Image.Resampling.BILINEAR)
    c1, c2 = rng.integers(0, 256, size=(2, 3))
    levels = np.arange(256) / 255.0
    channels = [ramp.point([int(a + (b - a) * x) for x in levels]) for a, b in zip(c1, c2, strict=True)]
    img = Image.merge("RGB", channels)

    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 8))):
        x0, x1 = sorted(rng.integers(-w // 4, w + w // 4, size=2))
        y0, y1 = sorted(rng.integers(-h // 4, h + h // 4, size=2))
        color = tuple(int(c) for c in rng.integers(0, 256, size=3))
        kind = int(rng.integers(0, 3))
        if kind == 0:
            draw.ellipse((x0, y0, x1 + 20, y1 + 20), fill=color)
        elif kind == 1:
            draw.rectangle((x0, y0, x1 + 20, y1 + 20), fill=color)
        else:
            pts = [(int(rng.integers(0, w)), int(rng.integers(0, h))) for _ in range(3)]
            draw.polygon(pts, fill=color)
    for _ in range(int(rng.integers(20, 60))):  # fine detail, so sharpness is non-trivial
        x, y = int(rng.integers(0, w)), int(rng.integers(0, h))
        color = tuple(int(c) for c in rng.integers(0, 256, size=3))
        draw.line(
            (x, y, x + int(rng.integers(-200, 200)), y + int(rng.integers(-200, 200))), fill=color, width=2
        )

    return ImageChops.difference(img, grain)


# -- EXIF ----------------------------------------------------------------------------------------
def _dms(value: float) -> tuple[tuple[int, int], ...]:
    value = abs(value)
    degrees = int(value)
    minutes_f = (value - degrees) * 60
    minutes = int(minutes_f)
    seconds = round((minutes_f - minutes) * 60 * 100)
    return (degrees, 1), (minutes, 1), (seconds, 100)


def _exif_bytes(plan: dict[str, object]) -> bytes:
    make, model, lens = plan["camera"]  # type: ignore[misc]
    taken: datetime = plan["taken"]  # type: ignore[assignment]
    stamp = taken.strftime("%Y:%m:%d %H:%M:%S").encode()
    zeroth = {
        piexif.ImageIFD.Make: make.encode(),
        piexif.ImageIFD.Model: model.encode(),
        piexif.ImageIFD.Orientation: plan["orientation"],
        piexif.ImageIFD.DateTime: stamp,
        piexif.ImageIFD.Software: b"photojobs samples",
    }
    sub: dict[int, object] = {
        piexif.ExifIFD.DateTimeOriginal: stamp,
        piexif.ExifIFD.DateTimeDigitized: stamp,
        piexif.ExifIFD.ISOSpeedRatings: plan["iso"],
        piexif.ExifIFD.ExposureTime: (1, 125),
        piexif.ExifIFD.FNumber: (28, 10),
    }
    if lens:
        sub[piexif.ExifIFD.LensModel] = lens.encode()
    gps: dict[int, object] = {}
    if plan["gps"]:
        lat, lon = plan["gps"]  # type: ignore[misc]
        gps = {
            piexif.GPSIFD.GPSVersionID: (2, 3, 0, 0),
            piexif.GPSIFD.GPSLatitudeRef: b"N" if lat >= 0 else b"S",
            piexif.GPSIFD.GPSLatitude: _dms(lat),
            piexif.GPSIFD.GPSLongitudeRef: b"E" if lon >= 0 else b"W",
            piexif.GPSIFD.GPSLongitude: _dms(lon),
        }
    return piexif.dump({"0th": zeroth, "Exif": sub, "GPS": gps, "1st": {}, "thumbnail": None})


def _jpeg_bytes(img: Image.Image, plan: dict[str, object] | None, quality: int = QUALITY) -> bytes:
    buf = io.BytesIO()
    kwargs = {"exif": _exif_bytes(plan)} if plan else {}
    img.save(buf, "JPEG", quality=quality, **kwargs)
    return buf.getvalue()


def _near_duplicate(original: bytes, seed: int, k: int) -> bytes:
    """The same scene resized (85-95 %), brightened (+-6 %) and recompressed, same EXIF."""
    rng = np.random.default_rng([seed, k, 0xD0B])
    with Image.open(io.BytesIO(original)) as img:
        exif = img.info.get("exif", b"")
        w, h = img.size
        scale = float(rng.uniform(0.85, 0.95))
        out = img.convert("RGB").resize((round(w * scale), round(h * scale)), Image.Resampling.BILINEAR)
    out = ImageEnhance.Brightness(out).enhance(float(rng.uniform(0.94, 1.06)))
    buf = io.BytesIO()
    out.save(buf, "JPEG", quality=int(rng.integers(70, 80)), exif=exif)
    return buf.getvalue()


def _corrupt_bytes(kind: str, seed: int, k: int, size: tuple[int, int]) -> bytes:
    if kind == "empty":
        return b""
    if kind == "text":
        return b"This is not a photo, just text saved with a .jpg name.\n"
    small = (max(16, size[0] // 4), max(16, size[1] // 4))
    whole = _jpeg_bytes(_render(seed, 100_000 + k, small, _grain(seed, small)), None)
    return whole[: len(whole) * 3 // 5]


# -- small lossless helpers ----------------------------------------------------------------------
def _pattern(size: tuple[int, int], mode: str = "RGB") -> Image.Image:
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    arr = np.stack([(xx * 255 // max(1, w - 1)), (yy * 255 // max(1, h - 1)), ((xx ^ yy) * 7) % 256], axis=-1)
    img = Image.fromarray(arr.astype(np.uint8), "RGB")
    return img if mode == "RGB" else img.convert(mode)


def _simple_exif(taken: datetime | None) -> Image.Exif:
    exif = Image.Exif()
    exif[0x010F] = "Samples"  # Make
    exif[0x0110] = "Lossless"  # Model
    if taken is not None:
        stamp = taken.strftime("%Y:%m:%d %H:%M:%S")
        exif[0x0132] = stamp  # DateTime
        exif.get_ifd(0x8769)[0x9003] = stamp  # DateTimeOriginal
    return exif


def make_png(
    path: str | os.PathLike[str],
    size: tuple[int, int] = (96, 64),
    *,
    taken: datetime | None = datetime(2020, 5, 17, 10, 30, 0),
) -> Path:
    """A small RGB PNG (with EXIF DateTimeOriginal = ``taken`` unless None); returns its path."""
    path = Path(path)
    _pattern(size).save(path, "PNG", exif=_simple_exif(taken))
    return path


def make_tiff(
    path: str | os.PathLike[str],
    size: tuple[int, int] = (96, 64),
    *,
    taken: datetime | None = datetime(2020, 5, 17, 10, 30, 0),
) -> Path:
    """A small uncompressed RGB TIFF whose IFD0 and Exif IFD carry Make/Model and (unless
    ``taken`` is None) DateTime/DateTimeOriginal, as a camera TIFF would. Built with piexif,
    because Pillow does not write an Exif sub-IFD into TIFF files."""
    path = Path(path)
    w, h = size
    pixels = _pattern(size).tobytes()
    zeroth: dict[int, object] = {
        piexif.ImageIFD.ImageWidth: w,
        piexif.ImageIFD.ImageLength: h,
        piexif.ImageIFD.BitsPerSample: (8, 8, 8),
        piexif.ImageIFD.Compression: 1,
        piexif.ImageIFD.PhotometricInterpretation: 2,
        piexif.ImageIFD.Make: b"Samples",
        piexif.ImageIFD.Model: b"Lossless",
        piexif.ImageIFD.StripOffsets: 0,
        piexif.ImageIFD.SamplesPerPixel: 3,
        piexif.ImageIFD.RowsPerStrip: h,
        piexif.ImageIFD.StripByteCounts: len(pixels),
        piexif.ImageIFD.PlanarConfiguration: 1,
    }
    sub: dict[int, object] = {}
    if taken is not None:
        stamp = taken.strftime("%Y:%m:%d %H:%M:%S").encode()
        zeroth[piexif.ImageIFD.DateTime] = stamp
        sub[piexif.ExifIFD.DateTimeOriginal] = stamp
    exif = {"0th": zeroth, "Exif": sub, "GPS": {}, "1st": {}, "thumbnail": None}
    header = piexif.dump(exif)[6:]  # drop "Exif\0\0": the rest is a TIFF header and its IFDs
    zeroth[piexif.ImageIFD.StripOffsets] = len(header)  # same size as the placeholder
    header = piexif.dump(exif)[6:]
    path.write_bytes(header + pixels)
    return path


def make_heic(
    path: str | os.PathLike[str],
    size: tuple[int, int] = (96, 64),
    *,
    taken: datetime | None = datetime(2020, 5, 17, 10, 30, 0),
) -> Path:
    """A small HEIC through pillow-heif (EXIF DateTimeOriginal = ``taken`` unless None)."""
    import pillow_heif

    pillow_heif.register_heif_opener()
    path = Path(path)
    _pattern(size).save(path, "HEIF", quality=90, exif=_simple_exif(taken).tobytes())
    return path
