"""Archive layout and bundles: dated archive paths, zip/tar bundles with a manifest, verification.

:func:`archive_relpath` is the plan (pure). :func:`build_bundle` writes a bundle to a staged path the
caller chose (next to the final target, so the caller can record an intent and publish it atomically)
and fsyncs it; :func:`verify_bundle` re-reads a bundle and checks every member against the manifest.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, Literal

from photos import fileops
from photos.errors import InvalidParameter, PatternError, PhotoError
from photos.rename import check_relpath, render
from photos.rootfs import Roots

BundleKind = Literal["zip", "tar", "none"]
BUNDLE_KINDS: tuple[str, ...] = ("none", "tar", "zip")
MANIFEST_NAME = "MANIFEST.json"
MANIFEST_VERSION = 1
ARCHIVE_PATTERN = "{taken:%Y/%Y-%m-%d}/{name}"

_CHUNK = 1024 * 1024
_ZIP64_LIMIT = (1 << 31) - 1
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def archive_relpath(facts: Mapping[str, Any], original: Path, file_mtime: float) -> str:
    """Dated archive path ``YYYY/YYYY-MM-DD/<original name>`` (capture time, else file time).

    The original name is sanitised like any rename value (see :func:`photos.rename.sanitize_value`).
    Use :func:`photos.rename.capture_time` to learn whether the file time was used.
    """
    return render(ARCHIVE_PATTERN, facts, Path(original), file_mtime).relpath


def parse_bundle_kind(value: str | None) -> BundleKind:
    """Parse a bundle kind parameter (case-insensitive); ``None`` or ``""`` mean ``none``."""
    text = (value or "none").strip().lower()
    if text not in BUNDLE_KINDS:
        raise InvalidParameter(f"bundle kind {value!r} is not valid; use one of: {', '.join(BUNDLE_KINDS)}")
    return text  # type: ignore[return-value]


# ----------------------------------------------------------------------------------------------- build


def _check_members(members: Sequence[tuple[Path, str]]) -> list[tuple[Path, str, os.stat_result]]:
    if not members:
        raise InvalidParameter("a bundle needs at least one member")
    seen: set[str] = set()
    checked: list[tuple[Path, str, os.stat_result]] = []
    for src, arcname in members:
        try:
            check_relpath(arcname)
        except PatternError as exc:
            raise InvalidParameter(f"bundle member {str(src)!r}: bad name in the bundle: {exc}") from None
        if arcname == MANIFEST_NAME:
            raise InvalidParameter(f"bundle member {str(src)!r}: the name {MANIFEST_NAME} is reserved")
        if arcname in seen:
            raise InvalidParameter(f"bundle member {str(src)!r}: name {arcname!r} is used twice")
        seen.add(arcname)
        try:
            st = os.stat(src)
        except FileNotFoundError:
            raise PhotoError(src, "bundle member is missing") from None
        except OSError as exc:
            raise PhotoError(src, f"bundle member cannot be read: {exc.strerror}") from None
        if not Path(src).is_file():
            raise PhotoError(src, "bundle member is not a regular file")
        checked.append((Path(src), arcname, st))
    return checked


class _HashingReader(io.RawIOBase):
    """Reads ``size`` bytes of a file and hashes them; complains if the file is shorter."""

    def __init__(self, fh: BinaryIO, path: Path, size: int) -> None:
        self.fh, self.path, self.left = fh, path, size
        self.digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.fh.read(n)
        if len(data) < n:
            raise PhotoError(self.path, "bundle member shrank while it was being bundled")
        self.left -= len(data)
        self.digest.update(data)
        return data


def _zip_time(mtime: float) -> tuple[int, int, int, int, int, int]:
    stamp = datetime.fromtimestamp(mtime).timetuple()[:6]
    return max(stamp, _ZIP_EPOCH)  # type: ignore[return-value]


def _write_zip(
    out: BinaryIO, members: list[tuple[Path, str, os.stat_result]], opener: Opener
) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for src, arcname, st in members:
            info = zipfile.ZipInfo(arcname, date_time=_zip_time(st.st_mtime))
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = 0o644 << 16
            info.file_size = st.st_size
            with opener(src) as fh, zf.open(info, "w", force_zip64=st.st_size > _ZIP64_LIMIT) as dst:
                reader = _HashingReader(fh, src, st.st_size)
                while chunk := reader.read(_CHUNK):
                    dst.write(chunk)
                if fh.read(1):
                    raise PhotoError(src, "bundle member grew while it was being bundled")
            entries.append(_entry(src, arcname, st.st_size, reader.digest.hexdigest()))
        manifest = _manifest("zip", entries)
        zf.writestr(zipfile.ZipInfo(MANIFEST_NAME, date_time=_ZIP_EPOCH), _manifest_bytes(manifest))
    return entries


def _write_tar(
    out: BinaryIO, members: list[tuple[Path, str, os.stat_result]], opener: Opener
) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for src, arcname, st in members:
            info = _tar_info(arcname, st.st_size, int(st.st_mtime))
            with opener(src) as fh:
                reader = _HashingReader(fh, src, st.st_size)
                tf.addfile(info, reader)  # type: ignore[arg-type]
                if fh.read(1):
                    raise PhotoError(src, "bundle member grew while it was being bundled")
            entries.append(_entry(src, arcname, st.st_size, reader.digest.hexdigest()))
        data = _manifest_bytes(_manifest("tar", entries))
        tf.addfile(_tar_info(MANIFEST_NAME, len(data), 0), io.BytesIO(data))
    return entries


def _tar_info(name: str, size: int, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, mtime, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _entry(src: Path, arcname: str, size: int, sha256: str) -> dict[str, Any]:
    return {"arcname": arcname, "sha256": sha256, "size": size, "original": str(src)}


def _manifest(kind: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {"version": MANIFEST_VERSION, "kind": kind, "members": entries}


def _manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def _open_member(path: Path) -> BinaryIO:
    return open(path, "rb")  # noqa: SIM115 - the caller closes it


#: Opens a bundle member for reading (the archive lane's opens it checked inside the job's roots).
Opener = Callable[[Path], BinaryIO]


def build_bundle(
    members: Sequence[tuple[Path, str]],
    out_path: Path,
    kind: str,
    *,
    within: Roots,
    opener: Opener = _open_member,
) -> dict[str, Any]:
    """Write a ``zip`` (stored, photos do not compress) or ``tar`` bundle of ``members`` to ``out_path``.

    ``members`` are ``(source path, name in the bundle)``; names must be safe relative paths, unique
    and not ``MANIFEST.json``. The bundle also holds ``MANIFEST.json``, which is returned:
    ``{"version": 1, "kind": kind, "members": [{"arcname", "sha256", "size", "original"}]}``; the
    hashes are of the bytes actually written. ``out_path`` is a staged path the caller owns,
    written beneath its root (``within``, no symlink followed; a file planted at the name is
    replaced, never written through), fsynced (with its folder), and removed again if building
    fails. ``opener`` opens each member for reading (default: by its path).
    """
    kind = parse_bundle_kind(kind)
    if kind == "none":
        raise InvalidParameter("bundle kind 'none' builds no bundle; use one of: tar, zip")
    checked = _check_members(members)
    write = _write_zip if kind == "zip" else _write_tar
    entries: list[dict[str, Any]] = []

    def fill(out: BinaryIO) -> None:
        entries.extend(write(out, checked, opener))

    fileops.write_new(Path(out_path), fill, within=within)
    return _manifest(kind, entries)


# ---------------------------------------------------------------------------------------------- verify


def _hash_stream(fh: BinaryIO) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    while chunk := fh.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def _read_zip(path: Path) -> tuple[bytes | None, dict[str, tuple[str, int]]]:
    found: dict[str, tuple[str, int]] = {}
    manifest = None
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if info.is_dir():
                raise PhotoError(path, f"bundle holds an unexpected directory {info.filename!r}")
            with zf.open(info) as fh:
                if info.filename == MANIFEST_NAME:
                    manifest = fh.read()
                else:
                    found[info.filename] = _hash_stream(fh)  # type: ignore[arg-type]
    return manifest, found


def _read_tar(path: Path) -> tuple[bytes | None, dict[str, tuple[str, int]]]:
    found: dict[str, tuple[str, int]] = {}
    manifest = None
    with tarfile.open(path, mode="r:") as tf:
        for info in tf:
            if not info.isfile():
                raise PhotoError(path, f"bundle holds {info.name!r}, which is not a regular file")
            fh = tf.extractfile(info)
            # regular files always have data
            if fh is None:
                raise RuntimeError('internal error: expected fh is not None')
            if info.name == MANIFEST_NAME:
                manifest = fh.read()
            else:
                found[info.name] = _hash_stream(fh)
    return manifest, found


def verify_bundle(path: Path, manifest: Mapping[str, Any]) -> None:
    """Re-read the bundle at ``path`` and check it against ``manifest`` (as returned by build_bundle).

    Raises :class:`PhotoError` naming the bundle if it cannot be read, its embedded MANIFEST.json
    differs from ``manifest``, a member is missing, extra, or has another size or sha256.
    """
    path = Path(path)
    kind = manifest.get("kind")
    if kind not in ("zip", "tar"):
        raise InvalidParameter(f"manifest kind {kind!r} is not valid; use one of: tar, zip")
    try:
        embedded, found = _read_zip(path) if kind == "zip" else _read_tar(path)
    except FileNotFoundError:
        raise PhotoError(path, "bundle is missing") from None
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as exc:
        raise PhotoError(path, f"bundle is corrupt or unreadable ({kind}): {exc}") from None
    if embedded is None:
        raise PhotoError(path, f"bundle has no {MANIFEST_NAME}")
    try:
        embedded_manifest = json.loads(embedded)
    except ValueError as exc:
        raise PhotoError(path, f"bundle's {MANIFEST_NAME} is not valid JSON: {exc}") from None
    if embedded_manifest != json.loads(_manifest_bytes(manifest)):
        raise PhotoError(path, f"bundle's {MANIFEST_NAME} differs from the expected manifest")
    expected = {m["arcname"]: (m["sha256"], m["size"]) for m in manifest.get("members", [])}
    for arcname, (sha, size) in expected.items():
        if arcname not in found:
            raise PhotoError(path, f"bundle member {arcname!r} is missing")
        got_sha, got_size = found[arcname]
        if got_size != size:
            raise PhotoError(path, f"bundle member {arcname!r} has {got_size} bytes, expected {size}")
        if got_sha != sha:
            raise PhotoError(path, f"bundle member {arcname!r} has sha256 {got_sha}, expected {sha}")
    extra = sorted(set(found) - set(expected))
    if extra:
        raise PhotoError(path, f"bundle has unexpected members: {', '.join(map(repr, extra))}")
