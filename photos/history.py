"""The history store: displaced originals kept for undo, and the tags an edit changes.

When an effect replaces a file (a metadata edit, or an undo restoring one), the file it displaces is
kept first, content-addressed, in a hidden folder beside the photo's root
(``ROOT/.photojobs-history/ab/abcdef…``): a hard link to the inode the atomic replace will take off
the photo's name, so keeping it costs no copy (a copy only where the store is on another filesystem
or the filesystem has no hard links). The folder is inside the configured roots, on the photos'
filesystem, hidden (a folder scan never takes it for photos), and pruned by ``photojobs prune``
(``PHOTOJOBS_HISTORY_KEEP``). A kept file is used only after its content is verified again.

Kept at the cost of what changed (issue 39): when the edit's new version is known (``keep(…,
new=…)``), the displaced version is kept as a binary delta against it instead —
``ab/SHA.delta-BASESHA``: a small header (the original's SHA-256, size, mode and times, and the
base's SHA-256) and a zstd frame compressed with the new version as a raw-content dictionary
(zstd's patch-from). An exif edit changes metadata and leaves the image data as it was, so the
delta is a few KB. A full copy (the hard link) is kept only where the delta is not smaller (or the
file is over ``DELTA_MAX_BYTES``). A delta is restored only from a base that still holds
``BASESHA`` (the photo as the edit left it, or a kept version), and only when what it rebuilds
hashes to ``SHA``: a delta whose base is gone or changed, or that is corrupt, refuses, naming it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import exiftool, fileops, rootfs
from .errors import OutsideRoot, PhotoError
from .rootfs import NotBeneath, Root, Roots

log = logging.getLogger("photojobs.history")

FOLDER = ".photojobs-history"
_NO_LINK = {errno.EXDEV, *rootfs.NO_LINK_ERRNOS}
_SHA = re.compile(r"[0-9a-f]{64}")
_SUB = re.compile(r"[0-9a-f]{2}")
#: a kept original (its SHA-256), a copy an undo moved away (``SHA.removed-INTENT``), or a
#: version kept as a delta against the version that replaced it (``SHA.delta-BASESHA``)
_KEPT = re.compile(r"[0-9a-f]{64}(?:\.removed-[0-9]+|\.delta-[0-9a-f]{64})?")
_DELTA_NAME = re.compile(r"([0-9a-f]{64})\.delta-([0-9a-f]{64})")
_BASE_NAME = re.compile(r"([0-9a-f]{64})\.base")
DELTA_MAGIC = b"PJDELTA1\n"
#: files larger than this are kept whole (a delta is built in memory: the base and the version)
DELTA_MAX_BYTES = 128 * 1024 * 1024
DELTA_LEVEL = 9  # zstd level: the metadata-sized deltas this store keeps cost milliseconds
_HEADER_MAX = 4096
_BASE_DEPTH = 8  # how many kept deltas a base may be rebuilt through
_NOT_A_FOLDER = (
    "the history store is a symlink or not a folder: refused (an original is kept only in a real "
    "folder beneath its root, never elsewhere)"
)
# Groups (exiftool family 0) that describe the file or exiftool itself, not what an edit wrote.
_NOT_METADATA = {"File", "ExifTool", "Composite", "System", "SourceFile"}


def store_for(root: str | os.PathLike[str]) -> Path:
    """The history store of a photo root."""
    return Path(root) / FOLDER


def blob_path(store: Path, sha256: str) -> Path:
    if not _SHA.fullmatch(sha256):
        raise ValueError(f"not a SHA-256: {sha256!r}")
    return store / sha256[:2] / sha256


class StoreRefused(PhotoError):
    """A history store (or one of its folders) that is a symlink or not a folder: nothing is kept
    in it, restored from it or pruned through it."""


def open_store(root: Root, *, create: bool) -> Root:
    """The history store of ``root``, opened beneath it without following a symlink (made when
    missing with ``create``); :class:`StoreRefused` when it is a symlink or not a folder."""
    try:
        return root.opendir(FOLDER, create=create)
    except NotBeneath:
        raise StoreRefused(root.path / FOLDER, _NOT_A_FOLDER) from None


def _open_sub(store: Root, sub: str, *, create: bool) -> Root:
    try:
        return store.opendir(sub, create=create)
    except NotBeneath:
        raise StoreRefused(store.path / sub, _NOT_A_FOLDER) from None


def keep(
    path: str | os.PathLike[str],
    sha256: str,
    *,
    within: Roots,
    new: str | os.PathLike[str] | None = None,
    new_sha256: str | None = None,
) -> Path | None:
    """Keep the file at ``path`` (content ``sha256``) in the history store of the deepest root of
    ``within`` that holds it. With ``new`` (the version that will replace it, content
    ``new_sha256``): as a delta against that version (``SHA.delta-NEWSHA``) when the delta is
    smaller than the file; otherwise (and without ``new``) whole: a hard link made through the
    folders' descriptors, or a copy across filesystems. Returns the kept file, or None when what is
    at ``path`` is not ``sha256`` (it changed meanwhile; nothing wrong is ever kept under a content
    address). An existing kept file of the same content (and base) is reused. A store that is a
    symlink or not a folder is :class:`StoreRefused` (nothing is kept anywhere else); a photo whose
    folder is a symlink now, ``rootfs.NotBeneath``."""
    blob_path(Path(), sha256)  # a content address, or ValueError
    root, rel = within.root_of(path)
    blob = blob_path(store_for(root.path), sha256)
    with open_store(root, create=True) as store, _open_sub(store, sha256[:2], create=True) as sub:
        if sub.is_file(sha256):
            return blob
        if new is not None and new_sha256 is not None and _SHA.fullmatch(new_sha256):
            kept = _keep_delta(root, rel, sub, sha256, Path(new), new_sha256, within)
            if kept is _CHANGED:
                return None
            if isinstance(kept, Path):
                # the new version's base link (free while the photo is that version), then the
                # displaced version's own base link is no longer needed: its delta rebuilds it
                _link_base(root, store, Path(new), new_sha256, within)
                sub.delete(f"{sha256}{BASE_SUFFIX}", missing_ok=True)
                return kept
        tmp = fileops.staged_path(blob, f"keep{os.getpid()}").name
        sub.delete(tmp, missing_ok=True)
        try:
            with root.parent(rel) as (folder, name):
                rootfs.link(folder, name, sub, tmp)
        except OSError as exc:
            if exc.errno not in _NO_LINK:
                raise
            _copy_into(root, rel, sub, tmp)
        try:
            with os.fdopen(sub.open(tmp), "rb") as fh:
                if fileops.sha256_of(fh) != sha256:
                    return None
            rootfs.replace(sub, tmp, sub, sha256)
        finally:
            sub.delete(tmp, missing_ok=True)
        sub.fsync()
    return blob


_CHANGED = object()  # ``_keep_delta``: the file at the path is not the content to keep
BASE_SUFFIX = ".base"  # ``ab/SHA.base``: a hard link to the version a delta was made against


def _link_base(root: Root, store: Root, new: Path, new_sha256: str, within: Roots) -> None:
    """Hard-link the new version (staged beside the photo, about to take its name) into the store as
    ``NEWSHA.base``: the same inode as the photo, so it costs nothing while the photo is that
    version. An editor that later *replaces* the photo (a new file renamed over it: most do) leaves
    the link holding the base, so the kept delta still rebuilds the original: a restore over an edit
    by hand works. An edit in place changes the link too: the delta then refuses, naming its base.
    When photojobs itself replaces the photo again, ``keep`` drops the link (the version is then
    kept as a delta against the next one). Best effort: no link (another filesystem), no base kept."""
    try:
        base_root, base_rel = within.root_of(new)
    except (OutsideRoot, NotBeneath):
        return
    if base_root.path != root.path:
        return
    name = f"{new_sha256}{BASE_SUFFIX}"
    with _open_sub(store, new_sha256[:2], create=True) as sub:
        if sub.is_file(name):
            return
        tmp = fileops.staged_path(sub.path / name, f"base{os.getpid()}").name
        sub.delete(tmp, missing_ok=True)
        try:
            with root.parent(base_rel) as (folder, fname):
                rootfs.link(folder, fname, sub, tmp)
            with os.fdopen(sub.open(tmp), "rb") as fh:
                if fileops.sha256_of(fh) != new_sha256:
                    return
            rootfs.replace(sub, tmp, sub, name)
            sub.fsync()
        except OSError as exc:
            log.debug("no base link for %s (%s)", new, exc)
        finally:
            sub.delete(tmp, missing_ok=True)


def _keep_delta(
    root: Root, rel: str, sub: Root, sha256: str, new: Path, new_sha256: str, within: Roots
) -> Path | object | None:
    """Keep ``rel`` beneath ``root`` as a delta against ``new`` in ``sub``: its path; ``_CHANGED``
    when ``rel`` does not hold ``sha256``; None when a delta does not pay (not smaller, too large,
    ``new`` not ``new_sha256``): the caller keeps the file whole."""
    name = f"{sha256}.delta-{new_sha256}"
    if sub.is_file(name):
        return sub.path / name
    with os.fdopen(root.open(rel), "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > DELTA_MAX_BYTES:
            return None
        original = fh.read()
    if hashlib.sha256(original).hexdigest() != sha256:
        return _CHANGED
    base = _read_verified(new, new_sha256, within)
    if base is None:
        return None
    data = encode_delta(original, base, sha256=sha256, base_sha256=new_sha256, st=st)
    if len(data) >= len(original) or decode_delta(data, base)[1] != original:
        return None  # not smaller (or, never seen, not a faithful delta): kept whole
    tmp = fileops.staged_path(sub.path / name, f"keep{os.getpid()}").name
    sub.delete(tmp, missing_ok=True)
    try:
        with os.fdopen(sub.create(tmp), "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        rootfs.replace(sub, tmp, sub, name)
    finally:
        sub.delete(tmp, missing_ok=True)
    sub.fsync()
    return sub.path / name


def _read_verified(path: Path, sha256: str, within: Roots) -> bytes | None:
    """The bytes of the regular file at ``path`` (beneath its root, no symlink followed) when they
    hash to ``sha256`` and fit ``DELTA_MAX_BYTES``; None otherwise (gone, changed, out of reach)."""
    try:
        fd = within.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, OutsideRoot):
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > DELTA_MAX_BYTES:
            return None
        data = fh.read()
    return data if hashlib.sha256(data).hexdigest() == sha256 else None


class DeltaCorrupt(ValueError):
    """A kept delta that does not parse or does not decompress."""


@dataclass(frozen=True)
class DeltaHeader:
    """What a kept delta says of the version it rebuilds (and of its base)."""

    sha256: str
    base_sha256: str
    size: int
    mode: int
    mtime_ns: int
    atime_ns: int


def _raw_dict(base: bytes) -> Any:
    import zstandard

    return zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)


def encode_delta(original: bytes, base: bytes, *, sha256: str, base_sha256: str, st: os.stat_result) -> bytes:
    """``original`` as a delta against ``base``: ``DELTA_MAGIC``, a JSON header line (the original's
    SHA-256, size, permission bits and times; the base's SHA-256), then a zstd frame (content
    checksum on) compressed with ``base`` as a raw-content dictionary, its window wide enough to
    reach back over the whole base (zstd's patch-from)."""
    import zstandard

    header = {
        "sha256": sha256,
        "base_sha256": base_sha256,
        "size": len(original),
        "mode": stat.S_IMODE(st.st_mode),
        "mtime_ns": st.st_mtime_ns,
        "atime_ns": st.st_atime_ns,
    }
    window = min(31, max(10, (len(base) + len(original)).bit_length()))
    params = zstandard.ZstdCompressionParameters.from_level(
        DELTA_LEVEL, window_log=window, write_checksum=1, write_content_size=1
    )
    frame = zstandard.ZstdCompressor(dict_data=_raw_dict(base), compression_params=params).compress(original)
    return DELTA_MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + frame


def decode_delta(data: bytes, base: bytes) -> tuple[DeltaHeader, bytes]:
    """The header and the version a delta rebuilds against ``base``; ``DeltaCorrupt`` when it does
    not parse or decompress (the caller checks the result's SHA-256)."""
    import zstandard

    if not data.startswith(DELTA_MAGIC):
        raise DeltaCorrupt("it does not start as a photojobs delta")
    end = data.find(b"\n", len(DELTA_MAGIC), len(DELTA_MAGIC) + _HEADER_MAX)
    if end < 0:
        raise DeltaCorrupt("its header has no end")
    try:
        fields = json.loads(data[len(DELTA_MAGIC) : end])
        header = DeltaHeader(
            str(fields["sha256"]), str(fields["base_sha256"]), int(fields["size"]), int(fields["mode"]),
            int(fields["mtime_ns"]), int(fields["atime_ns"]),
        )  # fmt: skip
    except (ValueError, KeyError, TypeError) as exc:
        raise DeltaCorrupt(f"its header does not parse ({exc})") from None
    if not 0 <= header.size <= DELTA_MAX_BYTES:
        raise DeltaCorrupt(f"its header names an impossible size {header.size}")
    try:
        out = zstandard.ZstdDecompressor(dict_data=_raw_dict(base), max_window_size=2**31).decompress(
            data[end + 1 :], max_output_size=header.size
        )
    except zstandard.ZstdError as exc:
        raise DeltaCorrupt(f"it does not decompress ({exc})") from None
    if len(out) != header.size:
        raise DeltaCorrupt(f"it rebuilds {len(out)} bytes, not {header.size}")
    return header, out


def is_delta(kept: str | os.PathLike[str]) -> bool:
    """Whether a kept file's path names a delta (``SHA.delta-BASESHA``)."""
    return bool(_DELTA_NAME.fullmatch(Path(kept).name))


def _rebuild(
    path: Path, sha256: str, within: Roots, bases: Sequence[Path], depth: int = 0
) -> tuple[DeltaHeader, bytes]:
    """The version the kept delta ``path`` rebuilds, verified to hash to ``sha256``; ``PhotoError``
    naming the delta when its base is gone or changed, or it is corrupt."""
    found = _DELTA_NAME.fullmatch(path.name)
    if found is None:
        raise PhotoError(path, "not a kept delta; not restored")
    of, base_sha = found.groups()
    if of != sha256:
        raise PhotoError(path, f"the kept delta {path} rebuilds sha256 {of}, not {sha256}; not restored")
    data = _read_kept(path, within)
    base = _find_base(path, base_sha, within, bases, depth)
    if base is None:
        raise PhotoError(
            path,
            f"the base of the kept delta {path} (sha256 {base_sha}, the version that replaced it) "
            "is gone or changed: neither the photo nor the history store holds it; not restored",
        )
    try:
        header, out = decode_delta(data, base)
    except DeltaCorrupt as exc:
        raise PhotoError(path, f"the kept delta {path} is corrupt: {exc}; not restored") from None
    if header.sha256 != sha256 or header.base_sha256 != base_sha or hashlib.sha256(out).hexdigest() != sha256:
        raise PhotoError(
            path, f"the kept delta {path} does not rebuild sha256 {sha256} (corrupt); not restored"
        )
    return header, out


def _read_kept(path: Path, within: Roots) -> bytes:
    """A kept file's bytes, read beneath its root with no symlink followed."""
    try:
        fd = within.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except NotBeneath as exc:
        raise StoreRefused(path, f"{exc.reason}; not restored") from None
    except FileNotFoundError:
        raise PhotoError(path, "the kept original is gone (pruned?); not restored") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise PhotoError(path, "the kept original is gone (pruned?); not restored")
        return fh.read()


def _find_base(path: Path, base_sha: str, within: Roots, bases: Sequence[Path], depth: int) -> bytes | None:
    """The bytes of ``base_sha``: one of ``bases`` (the photo as it is now) when it holds them, else
    a version kept in the same history store (whole, or a delta rebuilt in turn, at most
    ``_BASE_DEPTH`` deep); None when none does."""
    for candidate in bases:
        data = _read_verified(Path(candidate), base_sha, within)
        if data is not None:
            return data
    sub = path.parent.parent / base_sha[:2]
    whole = _read_verified(sub / base_sha, base_sha, within)
    if whole is None:  # the base link ``keep`` made (an editor replaced the photo since)
        whole = _read_verified(sub / f"{base_sha}{BASE_SUFFIX}", base_sha, within)
    if whole is not None or depth >= _BASE_DEPTH:
        return whole
    try:
        names = within.listdir(sub)
    except (OSError, OutsideRoot):
        return None
    for name in sorted(names):
        if name.startswith(f"{base_sha}.delta-") and _DELTA_NAME.fullmatch(name):
            try:
                return _rebuild(sub / name, base_sha, within, bases, depth + 1)[1]
            except PhotoError:
                continue
    return None


def removed_path(photo: Path, sha256: str, intent_id: int | None, *, within: Roots) -> Path:
    """Where an undo moves a file it removes (a local upload's copy, a new sidecar): the history
    store of the deepest root holding ``photo``, under ``SHA.removed-INTENT``. The store (and its
    sub-folder) are made now, beneath the root; :class:`StoreRefused` when one is a symlink or not
    a folder, so nothing is ever moved anywhere else."""
    blob_path(Path(), sha256)
    root, _ = within.root_of(photo)
    with open_store(root, create=True) as store:
        _open_sub(store, sha256[:2], create=True).close()
        return blob_path(store.path, sha256).with_name(f"{sha256}.removed-{intent_id}")


def _copy_into(root: Root, rel: str, folder: Root, name: str) -> None:
    """Copy the file ``rel`` beneath ``root`` to the new file ``name`` in ``folder``, fsynced."""
    with os.fdopen(root.open(rel), "rb") as src, os.fdopen(folder.create(name), "wb") as out:
        shutil.copyfileobj(src, out, fileops.CHUNK)
        out.flush()
        os.fsync(out.fileno())


def kept_file(
    kept: str | None, sha256: str | None, *, within: Roots, bases: Sequence[str | os.PathLike[str]] = ()
) -> Path:
    """The kept original, verified (read beneath its root, no symlink followed) to hold ``sha256``
    — a delta verified by rebuilding it against its base, found among ``bases`` (the photo's
    current file) or in the history store; ``PhotoError`` naming why it cannot be used."""
    path = _kept_entry(kept, sha256, within)
    if is_delta(path):
        _rebuild(path, sha256, within, [Path(b) for b in bases])
        return path
    if fileops.content_sha256(path, within=within) != sha256:
        raise PhotoError(path, f"the kept original no longer holds sha256 {sha256}; not restored")
    return path


def _kept_entry(kept: str | None, sha256: str | None, within: Roots) -> Path:
    """The kept file's path when one is named and is a regular file beneath its root (no symlink
    followed); ``PhotoError`` (``StoreRefused``) naming why not."""
    if not kept or not sha256:
        raise PhotoError(
            None, "the original was not kept (pruned after PHOTOJOBS_HISTORY_KEEP, or never kept)"
        )
    path = Path(kept)
    try:
        found = within.lstat(path)
    except NotBeneath as exc:
        raise StoreRefused(path, f"{exc.reason}; not restored") from None
    if not rootfs.is_regular(found):
        raise PhotoError(path, "the kept original is gone (pruned?); not restored")
    return path


def stage_original(
    kept: str | None,
    sha256: str | None,
    target: str | os.PathLike[str],
    tag: str,
    *,
    within: Roots,
    bases: Sequence[str | os.PathLike[str]] = (),
) -> Path:
    """Stage the kept version ``kept`` (content ``sha256``) next to ``target`` — a whole copy, or
    a delta rebuilt against its base (``bases``, or the history store) — with its permission bits
    and times; the staged path. ``PhotoError`` naming the kept file when it cannot be used."""
    path = _kept_entry(kept, sha256, within)
    if not is_delta(path):
        return fileops.stage_copy(kept_file(kept, sha256, within=within), target, tag, within=within)
    header, data = _rebuild(path, str(sha256), within, [Path(b) for b in bases])

    def write(fh: Any) -> None:
        fh.write(data)
        fh.flush()
        try:  # permission bits and times are a courtesy; the content is what must be right
            os.chmod(fh.fileno(), header.mode)
            os.utime(fh.fileno(), ns=(header.atime_ns, header.mtime_ns))
        except OSError:
            pass

    return fileops.stage_with(target, tag, write, within=within)


def tag_changes(before: str | os.PathLike[str] | None, after: str | os.PathLike[str]) -> dict[str, list[Any]]:
    """``{TAG: [BEFORE, AFTER]}`` for every metadata tag (exiftool's ``GROUP:Name``, family 0) whose
    value differs between the two files (``before`` None: a new file); None for a tag one of them
    lacks. Binary values are left out."""
    files = [os.path.abspath(f) for f in (before, after) if f is not None]
    # -fast: metadata up to the image data (not a trailer after it); what an edit changes is there;
    # -e: no Composite tags (derived from the others, never compared: a fifth of a read's time)
    out = exiftool.ExifTool.shared().execute("-j", "-G", "-a", "-fast", "-e", *files, retry_if_died=True)
    try:
        found = json.loads(out)
        a, b = ({}, found[0]) if before is None else (found[0], found[1])
    except (ValueError, IndexError, KeyError):
        return {}
    changes: dict[str, list[Any]] = {}
    for tag in sorted(set(a) | set(b)):
        if tag.split(":", 1)[0] in _NOT_METADATA:
            continue
        va, vb = a.get(tag), b.get(tag)
        if va == vb or any(isinstance(v, str) and v.startswith("(Binary data") for v in (va, vb)):
            continue
        changes[tag] = [va, vb]
    return changes


def tag_changes_or_none(before: Path | None, after: Path) -> dict[str, list[Any]] | None:
    """:func:`tag_changes`, or None when exiftool cannot tell (history then shows no tags)."""
    try:
        return tag_changes(before, after)
    except (PhotoError, OSError):
        return None


def prune(paths: Iterable[str], *, keep_paths: set[str]) -> list[str]:
    """Remove the kept files ``paths`` (never one still in ``keep_paths``); the ones gone now.

    Only a content-addressed name (``ROOT/.photojobs-history/ab/abcdef…``) of a regular file is
    removed, reached beneath its root with no symlink followed: a store (or one of its folders)
    that is a symlink or not a folder is skipped with a warning naming it, and nothing it points to
    is touched."""
    by_root: dict[Path, list[tuple[str, str, str]]] = {}
    for p in paths:
        place = _kept_place(p)
        if p in keep_paths or place is None:
            continue
        root, sub, name = place
        by_root.setdefault(root, []).append((sub, name, p))
    removed: list[str] = []
    for root, entries in by_root.items():
        with _store_of(root) as store:
            if store is None:
                continue
            for sub, name, p in entries:
                if _remove_kept(store, sub, name):
                    removed.append(p)
    return removed


def sweep_unreferenced(store: Path, referenced: set[str], older_than: float) -> list[str]:
    """Remove kept files in ``store`` no effect names (kept for an edit that never landed), older than
    ``older_than`` seconds (by ctime: when the link was made). Only content-addressed names of
    regular files in real folders beneath the store's root; a store that is a symlink is skipped
    with a warning naming it."""
    removed: list[str] = []
    now = time.time()
    with _store_of(store.parent) as opened:
        if opened is None:
            return removed
        subs = [sub for sub in sorted(opened.listdir()) if _SUB.fullmatch(sub)]
        based_on = set()  # the versions some kept delta is made against: their base links stay
        for sub in subs:
            try:
                with opened.opendir(sub) as folder:
                    based_on |= {m.group(2) for m in map(_DELTA_NAME.fullmatch, folder.listdir()) if m}
            except (NotBeneath, FileNotFoundError):
                continue
        for sub in subs:
            try:
                folder = opened.opendir(sub)
            except (NotBeneath, FileNotFoundError):
                continue  # a sub-folder swapped for a symlink: never followed
            with folder:
                for name in sorted(folder.listdir()):
                    path = str(folder.path / name)
                    base = _BASE_NAME.fullmatch(name)
                    if base is not None:  # a base link no delta is made against any more
                        if base.group(1) not in based_on and rootfs.is_regular(folder.lstat(name)):
                            folder.delete(name, missing_ok=True)
                            removed.append(path)
                        continue
                    if not _KEPT.fullmatch(name) or path in referenced:
                        continue
                    st = folder.lstat(name)
                    if not rootfs.is_regular(st) or now - st.st_ctime <= older_than:  # type: ignore[union-attr]
                        continue
                    folder.delete(name, missing_ok=True)
                    removed.append(path)
    return removed


def _kept_place(path: str) -> tuple[Path, str, str] | None:
    """``(root, sub-folder, name)`` of a kept file's path, None unless it is a content address in a
    history store (``ROOT/.photojobs-history/<2 hex>/<64 hex>[.removed-N]``)."""
    p = Path(path)
    if len(p.parts) < 4 or p.parent.parent.name != FOLDER or not p.is_absolute():
        return None
    if not (_SUB.fullmatch(p.parent.name) and _KEPT.fullmatch(p.name) and p.name.startswith(p.parent.name)):
        return None
    return p.parent.parent.parent, p.parent.name, p.name


@contextmanager
def _store_of(root: Path) -> Iterator[Root | None]:
    """The history store of ``root`` opened for pruning, or None (with a warning naming it when
    it, or its root, is not a real folder; silently when there is none)."""
    store = store_for(root)
    try:
        opened_root = rootfs.open_root(root)
    except FileNotFoundError:
        yield None
        return
    except NotBeneath:
        log.warning("skipped the history store %s: its root is not a real folder now; nothing pruned", store)
        yield None
        return
    with opened_root:
        try:
            opened = open_store(opened_root, create=False)
        except FileNotFoundError:
            yield None
            return
        except StoreRefused:
            log.warning(
                "skipped the history store %s: it is a symlink or not a folder; nothing it points to "
                "was pruned", store,
            )  # fmt: skip
            yield None
            return
        with opened:
            yield opened


def _remove_kept(store: Root, sub: str, name: str) -> bool:
    """Remove ``sub/name`` when it is a regular file (opened beneath the store, not followed);
    True when nothing is there now."""
    try:
        folder = store.opendir(sub)
    except FileNotFoundError:
        return True
    except NotBeneath:
        log.warning("skipped %s: a symlink or not a folder; nothing it points to is pruned", store.path / sub)
        return False
    with folder:
        if not folder.is_file(name):
            return folder.lstat(name) is None
        folder.delete(name, missing_ok=True)
        return True
