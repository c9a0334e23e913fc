"""``photojobs sync``: one job for the photos that are new or changed since the store last saw them.

The identity rule (docs/design.md, "Sync and watch"): a photo is **unchanged** when its size, mtime
(ns), inode and device, and its sidecars' names and ``stat``, equal what the store recorded
(``store.sync``): nothing is read, nothing written. When they differ its content hash decides: the
same content as the store recorded (or as the photo lanes last recorded, ``photos.sha256``: a job's
own edit) is unchanged (the new identity is recorded), other content is **changed**. A path the store
does not know is hashed: content a recorded photo had whose own path is gone is that photo
**moved** (it keeps its id and history, the move is logged in it; no item), else it is **new**. A
known photo under the walked folders whose file is gone is **missing** (reported, never deleted).
New and changed photos get one job of the given lanes; ``--outdated`` also re-runs each lane on
the unchanged photos whose recorded lane version (:mod:`photos.versions`) differs.

The walk (``os.scandir``) never follows a symlink, leaves out what a submission's scan leaves out
(hidden files and folders, names that are not UTF-8, our temp files, files that are not photos),
counts sidecars (``.xmp``) as part of their photo, a second hard link of a photo once, and reads a
file only through a descriptor checked inside the roots (``photos.containment.open_inside``). Paths
are looked up in chunks of ``store.sync.LOOKUP_CHUNK`` (one statement each); the memory of a sync
grows with what changed, not with the library.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from photojobs.api import (
    SKIP_HIDDEN,
    SKIP_HIDDEN_FOLDER,
    SKIP_NOT_PHOTO,
    SKIP_NOT_UTF8,
    SKIP_NOT_UTF8_FOLDER,
    SKIP_ORPHAN_SIDECAR,
    SKIP_PHOTO_SIDECAR,
    SKIP_SIDECAR,
    SKIP_TEMP,
    Plan,
    not_utf8,
)
from photojobs.roots import OutsideRoots, confine
from photos.containment import is_within, open_inside, real_roots
from photos.fileops import is_staged_name
from photos.formats import PHOTO_SUFFIXES
from photos.params import ALLOWED_ROOTS_KEY, SKIPPED_KEY
from photos.raw import is_raw
from photos.sidecar import SUFFIX as SIDECAR_SUFFIX
from photos.sidecar import owner_of
from photos.versions import lane_version
from store import idempotency as store_idempotency
from store import jobs as store_jobs
from store import sync as store_sync
from store.errors import SubmissionError
from store.sync import FileIdentity, Identified, Known, Move

if TYPE_CHECKING:
    from photojobs.api import Client

log = logging.getLogger("photojobs.sync")

SKIP_SYMLINK = "symlink (never followed)"
SKIP_SPECIAL = "not a regular file"
SKIP_UNREADABLE = "folder not readable"
SKIP_HARD_LINK = "hard link of another photo"
SKIP_CHANGING = "changing while it was read"
#: Paths a report names (the counts are always whole).
NAMED = 100
#: Folders (or gone paths) per statement of the search for missing photos.
SCOPE_CHUNK = 100


# -- the walk ----------------------------------------------------------------------------------------
class Found(NamedTuple):
    """A photo file the walk found: its path, ``lstat`` and its sidecars' (path, ``lstat``)."""

    path: str
    st: os.stat_result
    sidecars: tuple[tuple[str, os.stat_result], ...] = ()

    def sidecar_signature(self) -> str | None:
        """The sidecars' ``stat`` signature: which of the photo's two names each has, its size,
        mtime (ns) and inode (not its name: a photo moved with its sidecars keeps it)."""
        if not self.sidecars:
            return None
        parts = sorted(
            f"{_role(self.path, p)}\t{s.st_size}\t{s.st_mtime_ns}\t{s.st_ino}" for p, s in self.sidecars
        )
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _role(photo: str, sidecar: str) -> str:
    """``long`` for ``NAME.EXT.xmp``, ``short`` for ``NAME.xmp``."""
    long = (os.path.basename(photo) + SIDECAR_SUFFIX).casefold()
    return "long" if os.path.basename(sidecar).casefold() == long else "short"


class Skips:
    """What a walk left out, counted by reason (and the first :data:`NAMED` of them named)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.named: list[dict[str, str]] = []

    def add(self, reason: str, path: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        if len(self.named) < NAMED:
            shown = os.fsencode(path).decode("utf-8", "backslashreplace")
            self.named.append({"path": shown, "reason": reason})


def _sidecar_reason(owner: str | None) -> str:
    if owner is None:
        return SKIP_ORPHAN_SIDECAR
    if is_raw(owner):
        return SKIP_SIDECAR
    return SKIP_PHOTO_SIDECAR if os.path.splitext(owner)[1].lower() in PHOTO_SUFFIXES else SKIP_NOT_PHOTO


def walk(roots: Sequence[str], skips: Skips) -> Iterator[Found]:
    """Every photo file at or under ``roots`` (folders, and files: each folder is listed once for
    all the files named in it), folder by folder in name order, with its sidecars; never through
    a symlink. A folder that cannot be read is counted, not fatal; a path that is gone is passed."""
    files: dict[str, set[str]] = {}
    folders: list[str] = []
    for root in roots:
        try:
            top = os.lstat(root)
        except (FileNotFoundError, NotADirectoryError):
            continue
        if stat.S_ISDIR(top.st_mode):
            folders.append(root)
        else:
            files.setdefault(os.path.dirname(root), set()).add(os.path.basename(root))
    for folder, names in sorted(files.items()):
        yield from _folder_files(folder, skips, only=names)
    for root in folders:
        stack = [root]
        while stack:
            folder = stack.pop()
            subfolders = yield from _folder_files(folder, skips)
            stack.extend(reversed(subfolders))


def _folder_files(folder: str, skips: Skips, only: set[str] | None = None) -> Iterator[Found]:
    """The photos of one folder (just those named ``only`` when given); returns its subfolders."""
    try:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        skips.add(SKIP_UNREADABLE, folder)
        return []
    folded: set[str] | None = None  # the folder's names, case-folded: only where a sidecar is
    subfolders: list[str] = []
    photos: list[os.DirEntry[str]] = []
    sidecars: dict[str, list[os.DirEntry[str]]] = {}
    for e in entries:
        name = e.name
        dot = name.rfind(".")
        ext = name[dot:].lower() if dot > 0 else ""
        if only is not None and name not in only and ext != SIDECAR_SUFFIX:
            continue
        try:
            is_link = e.is_symlink()
            is_dir = not is_link and e.is_dir(follow_symlinks=False)
            is_file = not is_link and e.is_file(follow_symlinks=False)
        except OSError:  # gone meanwhile
            continue
        if not name.isascii() and not_utf8(name):
            skips.add(SKIP_NOT_UTF8_FOLDER if is_dir else SKIP_NOT_UTF8, e.path)
        elif name[0] == ".":
            staged = is_file and is_staged_name(name)
            skips.add(SKIP_TEMP if staged else SKIP_HIDDEN_FOLDER if is_dir else SKIP_HIDDEN, e.path)
        elif is_link:
            if only is None or name in only:
                skips.add(SKIP_SYMLINK, e.path)
        elif is_dir:
            subfolders.append(e.path)
        elif not is_file:
            skips.add(SKIP_SPECIAL, e.path)
        elif ext in PHOTO_SUFFIXES:
            photos.append(e)
        elif ext == SIDECAR_SUFFIX:
            if folded is None:
                folded = {x.name.casefold() for x in entries}
            owner = owner_of(Path(e.path), folded)
            if owner is not None and os.path.splitext(owner)[1].lower() in PHOTO_SUFFIXES:
                sidecars.setdefault(owner, []).append(e)
            if only is None or name in only:
                skips.add(_sidecar_reason(owner), e.path)
        else:
            skips.add(SKIP_NOT_PHOTO, e.path)
    for e in photos:
        try:
            st = e.stat(follow_symlinks=False)
            mine = sidecars.get(e.name.casefold(), ()) if sidecars else ()
            own = tuple((s.path, s.stat(follow_symlinks=False)) for s in mine)
        except FileNotFoundError:  # deleted while the folder was walked
            continue
        yield Found(e.path, st, own)
    return subfolders


# -- reading a file ----------------------------------------------------------------------------------
class Changing(Exception):  # noqa: N818 - a condition of the file, not a failure of ours
    """The file was replaced or written while it was read: it is not recorded this time."""


def _hash_fd(fd: int) -> str:
    digest = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, 1024 * 1024, offset):
        digest.update(chunk)
        offset += len(chunk)
    return digest.hexdigest()


def _read(path: str, entry: os.stat_result, roots: Sequence[str]) -> tuple[str, os.stat_result]:
    """The file's content hash and its ``fstat``, read through a descriptor checked inside
    ``roots``. ``Changing`` when it is not the inode the walk saw, or changed while it was read."""
    fd = open_inside(path, roots)
    try:
        before = os.fstat(fd)
        if (before.st_dev, before.st_ino) != (entry.st_dev, entry.st_ino) or not stat.S_ISREG(before.st_mode):
            raise Changing(path)
        sha = _hash_fd(fd)
        after = os.fstat(fd)
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            raise Changing(path)
        return sha, after
    finally:
        os.close(fd)


def identify(found: Found, roots: Sequence[str]) -> FileIdentity:
    """The file's identity with its content hash (and its sidecars' content signature)."""
    sha, st = _read(found.path, found.st, roots)
    side_sha = None
    if found.sidecars:
        parts = sorted(f"{_role(found.path, p)}\t{_read(p, s, roots)[0]}" for p, s in found.sidecars)
        side_sha = hashlib.sha256("\n".join(parts).encode()).hexdigest()
    return FileIdentity(
        st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev, sha, found.sidecar_signature(), side_sha
    )


# -- the report ------------------------------------------------------------------------------------
@dataclass
class SyncReport:
    """What a sync found and did. ``job``: the job of the new and changed photos (else the first
    ``--outdated`` job), None when nothing needed one; ``jobs``: every job it submitted."""

    job: int | None = None
    jobs: list[int] = field(default_factory=list)
    new: int = 0
    changed: int = 0
    unchanged: int = 0
    moved: int = 0
    missing: int = 0
    outdated: int = 0
    busy: int = 0
    items: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    left_out: list[dict[str, str]] = field(default_factory=list)
    missing_paths: list[str] = field(default_factory=list)
    moves: list[dict[str, Any]] = field(default_factory=list)
    busy_paths: list[str] = field(default_factory=list)
    replayed: bool = False  # the answer of an earlier sync with the same idempotency key

    @classmethod
    def replay(cls, earlier: store_idempotency.Replay) -> SyncReport:
        """An earlier sync's report, as it answered (its job alone if it died before answering)."""
        answer = dict(earlier.response or {"job": earlier.job_id, "jobs": [earlier.job_id]})
        known = {f for f in cls.__dataclass_fields__ if f != "replayed"}
        return cls(**{k: v for k, v in answer.items() if k in known}, replayed=True)

    def as_dict(self) -> dict[str, Any]:
        return ({"replayed": True} if self.replayed else {}) | {
            "job": self.job,
            "new": self.new,
            "changed": self.changed,
            "unchanged": self.unchanged,
            "moved": self.moved,
            "missing": self.missing,
            "outdated": self.outdated,
            "busy": self.busy,
            "jobs": list(self.jobs),
            "items": self.items,
            "skipped": dict(self.skipped),
            "left_out": list(self.left_out),
            "moves": list(self.moves),
            "missing_paths": list(self.missing_paths),
        }


class _IdSet:
    """Photo ids seen by this sync, as a bit map (a million ids: 125 kB)."""

    def __init__(self) -> None:
        self.bits = bytearray()
        self.count = 0

    def add(self, n: int) -> None:
        i = n >> 3
        if i >= len(self.bits):
            self.bits.extend(bytes(i + 1 - len(self.bits) + 4096))
        if not self.bits[i] & (1 << (n & 7)):
            self.bits[i] |= 1 << (n & 7)
            self.count += 1

    def __contains__(self, n: int) -> bool:
        i = n >> 3
        return i < len(self.bits) and bool(self.bits[i] & (1 << (n & 7)))


#: An unchanged (or moved) photo for ``--outdated``: path, photo id, identity, per-lane record.
_Current = tuple[str, int, FileIdentity, Mapping[str, Any]]


class _Pending(NamedTuple):
    """A photo for a job: ``kind`` new or changed (all lanes), or outdated (``lanes`` only, its
    other lanes' record ``lanes_before`` kept)."""

    path: str
    identity: FileIdentity
    lanes_before: Mapping[str, Any] | None
    kind: str
    lanes: tuple[str, ...] = ()


# -- the sync --------------------------------------------------------------------------------------
class _Sync:
    def __init__(
        self,
        client: Client,
        names: list[str],
        roots: list[str],
        read_roots: list[str],
        confine_to: list[Path] | None,
        outdated: bool,
    ) -> None:
        self.client = client
        self.engine = client.engine
        self.names = names
        self.roots = roots
        self.read_roots = read_roots
        self.confine_to = confine_to
        self.outdated = outdated
        self.versions: dict[str, str] = {}
        self.report = SyncReport()
        self.skips = Skips()
        self.seen = _IdSet()
        self.claimed: set[int] = set()  # photos a new path of this sync was found to be (moves)
        self.links: dict[tuple[int, int], str] = {}  # (device, inode) of hard-linked files -> its path
        self.pending: list[_Pending] = []
        self.min_age: float | None = None

    # one chunk of found files -------------------------------------------------------------------
    def chunk(self, found: Sequence[Found]) -> None:
        known = store_sync.lookup(self.engine, [f.path for f in found])
        # Known paths first: a hard link the store knows by one name keeps that name.
        linked = any(f.st.st_nlink > 1 for f in found)
        ordered = sorted(found, key=lambda f: f.path not in known) if linked else found
        refresh: list[Identified] = []
        fresh: list[tuple[Found, FileIdentity]] = []
        outdated: list[_Current] = []
        for f in ordered:
            if f.st.st_nlink > 1:
                key = (f.st.st_dev, f.st.st_ino)
                if self.links.setdefault(key, f.path) != f.path:
                    self.skips.add(SKIP_HARD_LINK, f.path)
                    continue
            k = known.get(f.path)
            if k is not None and k.photo_id is not None and k.identity is not None:
                if store_sync.unchanged(f.st, f.sidecar_signature(), k.identity):  # no read, no write
                    self.seen.add(k.photo_id)
                    self.report.unchanged += 1
                    if self.outdated:
                        outdated.append((f.path, k.photo_id, k.identity, k.lanes))
                    continue
            if k is not None and (k.photo_id is None or k.busy):  # a job's file effect in flight
                if k.photo_id is not None:
                    self.seen.add(k.photo_id)
                self._busy(f.path)
                continue
            if self.min_age is not None and _young(f, self.min_age):  # may still be being written
                self._busy(f.path)
                continue
            try:
                identity = identify(f, self.read_roots)
            except (Changing, FileNotFoundError):
                self.skips.add(SKIP_CHANGING, f.path)
                self._busy(f.path)
                continue
            if k is None:
                fresh.append((f, identity))
                continue
            self.seen.add(k.photo_id or 0)
            if self._same_content(identity, k):
                self.report.unchanged += 1
                refresh.append(Identified(f.path, identity, k.lanes))
                if self.outdated:
                    outdated.append((f.path, k.photo_id, identity, k.lanes))
            elif k.identity is None and k.photo_sha256 is None:
                self.report.new += 1
                self.pending.append(_Pending(f.path, identity, None, "new"))
            else:
                self.report.changed += 1
                self.pending.append(_Pending(f.path, identity, None, "changed"))
        store_sync.record_files(self.engine, refresh)
        self._new_or_moved(fresh)
        if outdated:
            self._outdated(outdated)

    @staticmethod
    def _same_content(identity: FileIdentity, k: Known) -> bool:
        """The photo's content is one the store has seen (the sync's record, or the hash the photo
        lanes last recorded: a job's own edit), and its sidecars' content is what the sync recorded
        (or it has none and had none)."""
        content = identity.sha256 in {k.photo_sha256, k.identity.sha256 if k.identity else None}
        if not content:
            return False
        if k.identity is None:
            return True  # never synced: its sidecars are the photo's as they are now
        return identity.sidecars_sha256 == k.identity.sidecars_sha256

    def _busy(self, path: str) -> None:
        self.report.busy += 1
        self.report.busy_paths.append(path)  # every one: a watcher waits for each again

    def _new_or_moved(self, fresh: list[tuple[Found, FileIdentity]]) -> None:
        """Paths the store does not know: a recorded photo's content whose old path is gone is that
        photo moved; anything else is new."""
        if not fresh:
            return
        candidates = store_sync.by_content(self.engine, [i.sha256 for _, i in fresh])
        moves: list[Move] = []
        for f, identity in fresh:
            move = None
            for rec in candidates.get(identity.sha256, ()):
                if rec.photo_id in self.claimed or rec.photo_id in self.seen or rec.path == f.path:
                    continue
                if self.confine_to is not None and not is_within(rec.path, self.confine_to):
                    continue
                if not _gone(rec.path):
                    continue
                move = Move(rec.photo_id, rec.path, f.path, identity, rec.lanes)
                break
            if move is None:
                self.report.new += 1
                self.pending.append(_Pending(f.path, identity, None, "new"))
                continue
            self.claimed.add(move.photo_id)
            moves.append(move)
        if not moves:
            return
        done = store_sync.record_moves(self.engine, moves)
        for m in done.moved:
            self.seen.add(m.photo_id)
            self.report.moved += 1
            if len(self.report.moves) < NAMED:
                self.report.moves.append({"photo": m.photo_id, "from": m.old_path, "to": m.new_path})
        for m in done.busy:
            self._busy(m.new_path)
        if self.outdated and done.moved:
            self._outdated([(m.new_path, m.photo_id, m.identity, dict(m.lanes)) for m in done.moved])

    # --outdated --------------------------------------------------------------------------------
    def _outdated(self, entries: Sequence[_Current]) -> None:
        """Unchanged (or moved) photos whose recorded version of a lane is not the current one, or
        whose item of it was cancelled with its job: that lane again (``sync --outdated``)."""
        needs: list[tuple[_Current, list[tuple[str, int | None]]]] = []
        wanted: list[tuple[int, int, str]] = []
        for entry in entries:
            _path, photo_id, _identity, record = entry
            lanes: list[tuple[str, int | None]] = []
            for lane in self.names:
                rec = record.get(lane)
                current = isinstance(rec, list) and len(rec) == 2 and rec[0] == self.versions[lane]
                lanes.append((lane, int(rec[1]) if current and rec is not None else None))
                if current and rec is not None:
                    wanted.append((int(rec[1]), photo_id, lane))
            needs.append((entry, lanes))
        states = store_sync.item_states(self.engine, wanted) if wanted else {}
        for (path, photo_id, identity, record), lanes in needs:
            again = tuple(
                lane
                for lane, job in lanes
                if job is None or store_sync.was_cancelled(states.get((job, photo_id, lane)))
            )
            if again:
                self.report.outdated += 1
                self.pending.append(_Pending(path, identity, dict(record), "outdated", again))

    # after the walk ------------------------------------------------------------------------------
    def missing(self, scope: Sequence[str]) -> None:
        """Known photos at or under ``scope`` (the walked folders, and paths that are gone) that
        this sync did not see and whose file is gone."""
        parts = [scope[i : i + SCOPE_CHUNK] for i in range(0, len(scope), SCOPE_CHUNK)]
        if len(parts) == 1 and store_sync.count_under(self.engine, parts[0]) <= self.seen.count:
            return  # every photo under the folders was seen (the usual case: no row streamed)
        for part in parts:
            for photo_id, path in store_sync.photos_under(self.engine, part):
                if photo_id in self.seen or not _gone(path):
                    continue
                self.report.missing += 1
                if len(self.report.missing_paths) < NAMED:
                    self.report.missing_paths.append(path)

    def submit(
        self, params: dict[str, Any], priority: str | None, idem: store_idempotency.Idempotency | None = None
    ) -> None:
        """One job for the new and changed photos (every lane), one per set of outdated lanes; then
        the identities of what they cover, with the lanes' versions and the job."""
        groups: dict[tuple[str, ...], list[_Pending]] = {}
        for p in self.pending:
            groups.setdefault(tuple(self.names) if p.kind != "outdated" else p.lanes, []).append(p)
        order = sorted(groups, key=lambda lanes: lanes != tuple(self.names))
        for lanes in order:
            members = sorted(groups[lanes], key=lambda p: p.path)
            plan = Plan(
                list(lanes),
                params,
                [store_jobs.PhotoInput(p.path, p.identity.size, p.identity.mtime_ns / 1e9) for p in members],
                list(self.roots),
                store_jobs.job_fingerprint(list(lanes), [f"sync:{r}" for r in self.roots], params),
                dict(self.skips.counts),
                list(self.skips.named),
            )
            done = self.client.submit(list(lanes), [], plan=plan, priority=priority, idempotency_key=idem)
            idem = None  # the key is recorded with the first job
            self.report.jobs.append(done.job_id)
            self.report.items += done.items
            if self.report.job is None:
                self.report.job = done.job_id
            recorded = {lane: [self.versions[lane], done.job_id] for lane in lanes}
            store_sync.record_files(
                self.engine,
                (Identified(p.path, p.identity, {**(p.lanes_before or {}), **recorded}) for p in members),
            )


def _young(found: Found, age: float) -> bool:
    """The file or one of its sidecars was modified less than ``age`` seconds ago."""
    newest = max([found.st.st_mtime_ns, *(s.st_mtime_ns for _, s in found.sidecars)])
    return time.time_ns() - newest < age * 1e9


def _gone(path: str) -> bool:
    """No file (nor anything else) is at ``path`` now."""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
    return False


def sync_roots(
    paths: Iterable[str | os.PathLike[str]],
    allowed_roots: Sequence[str | os.PathLike[str]] | None,
    *,
    allow_gone: bool = False,
) -> list[str]:
    """The paths a sync walks, absolute and resolved (a symlinked root is taken where it leads),
    inside ``allowed_roots`` when given (``OutsideRoots``), without one that lies inside another.
    A path that does not exist is an error (``SubmissionError``) unless ``allow_gone`` (a watcher's
    deleted file or folder: its photos are missing)."""
    given = [os.fspath(p) for p in paths]
    if not given:
        raise SubmissionError("give at least one folder or file to sync")
    if allowed_roots is not None:
        given = confine(given, [Path(r) for r in allowed_roots])
    out: list[str] = []
    for raw in given:
        if not isinstance(raw, str) or not raw.strip() or "\x00" in raw:
            raise SubmissionError(f"{raw!r}: not a path")
        p = Path(raw).expanduser()
        if not_utf8(str(p)):
            raise SubmissionError(
                f"{os.fsencode(p)!r}: the name is not UTF-8; photojobs keeps names as text (rename it)"
            )
        if not p.exists() and not p.is_symlink():
            if not allow_gone:
                raise SubmissionError(f"{raw}: no such file or folder (nothing was synced)")
            out.append(str(p.absolute()))
            continue
        out.append(str(p.resolve()))
        if allowed_roots is not None and not is_within(out[-1], real_roots(allowed_roots)):
            raise OutsideRoots(raw, "resolves (through a symlink) outside the photo roots")
    kept: list[str] = []
    for r in sorted(set(out), key=lambda p: p.replace("/", "\0")):  # a folder, then what is in it
        if not kept or not (r == kept[-1] or r.startswith(kept[-1].rstrip("/") + "/")):
            kept.append(r)
    return kept


def sync(
    client: Client,
    lanes: str | Sequence[str],
    paths: Iterable[str | os.PathLike[str]],
    params: Mapping[str, Any] | None = None,
    *,
    outdated: bool = False,
    allowed_roots: Sequence[str | os.PathLike[str]] | None = None,
    output_roots: Sequence[str | os.PathLike[str]] | None = None,
    untrusted: bool = False,
    diagnostics: bool = False,
    priority: str | None = None,
    job_roots: Sequence[str | os.PathLike[str]] | None = None,
    allow_gone: bool = False,
    min_age: float | None = None,
    chunk: int = store_sync.LOOKUP_CHUNK,
    idempotency_key: str | None = None,
) -> SyncReport:
    """Walk ``paths`` and submit one job for what is new or changed (see the module); see
    ``Client.sync``. ``job_roots``: the roots the job records (a watcher's folders when it syncs
    the files that settled; default: the walked folders). ``allow_gone``: a path that does not
    exist is a deleted file or folder (a watcher's), not an error. ``min_age``: a file (or sidecar)
    modified less than this many seconds ago is not taken (``busy``: a watcher's first sync).
    ``idempotency_key``: checked under the sync lock (syncs run one at a time), recorded with the
    sync's first job in the transaction that creates it (or alone when it made none)."""
    paths = list(paths)
    names, clean, named = client.check_job(lanes, params, untrusted=untrusted, diagnostics=diagnostics)
    walked = sync_roots(paths, allowed_roots, allow_gone=allow_gone)
    roots = (
        [str(Path(r).expanduser().resolve()) for r in job_roots]
        if job_roots is not None
        else [r if os.path.isdir(r) else os.path.dirname(r) for r in walked]
    )
    roots = sorted(set(roots))
    allowed = client.confine_job(
        names, clean, named, [Path(r) for r in roots], allowed_roots=allowed_roots, output_roots=output_roots
    )
    confine_to = [Path(r) for r in real_roots(allowed_roots)] if allowed_roots is not None else None
    job = _Sync(client, names, roots, [str(r) for r in real_roots(roots)], confine_to, outdated)
    job.versions = {lane: lane_version(lane, clean) for lane in names}
    job.min_age = min_age
    idem = None
    if idempotency_key is not None:
        request = {"lanes": names, "paths": [str(p) for p in paths], "params": dict(params or {})}
        idem = store_idempotency.make(
            "sync", idempotency_key, request | {"outdated": outdated, "priority": priority}
        )
    with store_sync.sync_lock(client.engine):
        if idem is not None:
            earlier = store_idempotency.look_up(client.engine, idem)
            if earlier is not None:
                return SyncReport.replay(earlier)
        for part in store_sync.batched(walk(walked, job.skips), chunk):
            job.chunk(part)
        job.missing([r for r in walked if os.path.isdir(r) or _gone(r)])
        job.report.skipped = dict(sorted(job.skips.counts.items()))
        job.report.left_out = list(job.skips.named)
        if job.pending:
            params_out = dict(clean)
            if allowed is not None:
                params_out[ALLOWED_ROOTS_KEY] = allowed
            if job.skips.counts:
                params_out[SKIPPED_KEY] = dict(job.report.skipped)
            job.submit(params_out, priority, idem)
        if idem is not None:
            if job.report.job is None:
                store_idempotency.record_without_job(client.engine, idem, job.report.as_dict())
            else:
                store_idempotency.record_response(client.engine, idem, job.report.as_dict())
    log.info("sync of %s: %s", ", ".join(walked), job.report.as_dict())
    return job.report
