"""The camera raws that keep their capture time outside EXIF: one table, maker by maker.

Most raws are TIFF-based (DNG, NEF, CR2, ARW, PEF, ORF, RW2, …) or carry a TIFF/EXIF block
(CR3's ``CMT`` boxes, RAF's embedded JPEG, MRW's ``TTW`` block): their clock is EXIF
``DateTimeOriginal``. An audit of the raw formats exiftool reads (its ``CanonRaw``, ``SigmaRaw``,
``KyoceraRaw``, ``Red`` and ``PhaseOne`` modules) found these keeping theirs elsewhere; each is
read as exiftool names it with ``-G1`` (``GROUP:TAG``), after EXIF's own, by capture time
(:mod:`photos.capture_time`: analysis, rename, archive, upload keys) and by a raw's sidecar shift
(:mod:`photos.sidecar`: the sidecar gets the raw's clock, shifted; the raw is never written).

==========================  ==============================  =====================================
raw                         clock (``-G1``)                 kept as
==========================  ==============================  =====================================
Canon CRW (CIFF)            ``CanonRaw:DateTimeOriginal``   Unix time in the ``TimeStamp`` record
Sigma/Foveon X3F            ``SigmaRaw:DateTimeOriginal``   Unix time in the ``TIME`` property
Kyocera/Contax ``.raw``     ``KyoceraRaw:DateTimeOriginal`` a reversed string
RED ``.r3d``                ``Red:DateTimeOriginal``        ``YYYYMMDDhhmmss`` text
Phase One IIQ               ``PhaseOne:DateTimeOriginal``   Unix time (when the file has no EXIF)
==========================  ==============================  =====================================
"""

from __future__ import annotations

#: (what the raw is, exiftool's ``GROUP:TAG`` with family-1 group) -- after EXIF, in this order.
RAW_CLOCKS: tuple[tuple[str, str], ...] = (
    ("Canon CRW", "CanonRaw:DateTimeOriginal"),
    ("Sigma X3F", "SigmaRaw:DateTimeOriginal"),
    ("Kyocera raw", "KyoceraRaw:DateTimeOriginal"),
    ("RED R3D", "Red:DateTimeOriginal"),
    ("Phase One IIQ", "PhaseOne:DateTimeOriginal"),
)


def raw_clock_args() -> tuple[str, ...]:
    """The exiftool arguments reading every raw clock of :data:`RAW_CLOCKS`."""
    return tuple(f"-{key}" for _, key in RAW_CLOCKS)
