"""``photojobs watch``: folders watched until their files are whole, then synced in batches.

watchdog's inotify observer reports what changes under the folders (its polling observer on a
network mount, where inotify sees nothing: ``--poll``, or by itself when the mount is NFS, SMB, …
or the inotify observer cannot start). An event only names a path; the **stability rule** decides
when it is submitted (docs/design.md, "Sync and watch"): a photo is *settled* once its size, mtime
and inode **and its sidecars'** (``NAME.EXT.xmp``, ``NAME.xmp``) have stayed the same for the
debounce interval (``--debounce``, 3 s), checked by ``stat`` on every tick; any event on it or
on a sidecar of it starts the interval again. A folder that appears is expanded into its files,
which settle one by one; a sidecar settles with its photo. Settled photos (and paths that are
gone: a photo deleted or moved away) are synced together (:func:`photojobs.sync.sync`): a batch is
flushed once no photo settled for ``--batch-wait`` (1 s), or it holds ``--batch-max`` photos, or
its first photo waited ``--batch-max-wait`` (10 s). A burst of 10,000 new files is a handful of
jobs. A photo a sync could not take yet (a job's move in flight, or it changed while read) goes
back to waiting. At start the watcher syncs its folders once, leaving files changed within the
debounce interval to settle first.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from photojobs.api import not_utf8
from photos.fileops import is_staged_name
from photos.formats import PHOTO_SUFFIXES
from photos.sidecar import SUFFIX as SIDECAR_SUFFIX
from photos.sidecar import owner_of

if TYPE_CHECKING:
    from photojobs.api import Client
    from photojobs.sync import SyncReport

log = logging.getLogger("photojobs.watch")

DEFAULT_DEBOUNCE = 3.0
DEFAULT_BATCH_WAIT = 1.0
DEFAULT_BATCH_MAX = 5000
DEFAULT_BATCH_MAX_WAIT = 10.0
DEFAULT_POLL_INTERVAL = 5.0
#: File systems inotify cannot watch (changes made on another host are never reported).
NETWORK_FS = frozenset(
    {"nfs", "nfs4", "cifs", "smb", "smb2", "smb3", "smbfs", "9p", "afs", "ceph", "glusterfs", "lustre",
     "fuse.sshfs", "fuse.rclone", "fuse.s3fs", "davfs", "fuse.davfs2", "ncpfs", "virtiofs"}
)  # fmt: skip
_EVENTS = ("created", "modified", "moved", "deleted", "closed", "attrib")


def wanted_name(name: str) -> str | None:
    """``"photo"`` or ``"sidecar"`` for a name the watcher follows; None for the rest (hidden,
    our temp files, names that are not UTF-8, files that are not photos)."""
    if name.startswith(".") or is_staged_name(name) or not_utf8(name):
        return None
    lower = name.lower()
    if lower.endswith(SIDECAR_SUFFIX):
        return "sidecar"
    return "photo" if os.path.splitext(lower)[1] in PHOTO_SUFFIXES else None


def _hidden_below(path: str, roots: Sequence[str]) -> bool:
    """A folder between the root and ``path`` is hidden (``.photojobs-history``, ``.git``)."""
    for root in roots:
        if path == root or path.startswith(root.rstrip("/") + "/"):
            rel = path[len(root.rstrip("/")) + 1 :]
            return any(part.startswith(".") for part in rel.split("/")[:-1])
    return True


# -- the stability rule ----------------------------------------------------------------------------
@dataclass
class _Entry:
    signature: tuple[Any, ...] | None = None
    since: float = 0.0


@dataclass
class Settled:
    """What one tick found settled: photos whose files (and sidecars) are whole, and paths gone."""

    photos: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)


class Stability:
    """The paths events named, each waiting until what ``stat`` says of it (and of its sidecars)
    has not changed for ``debounce`` seconds. No clock of its own: ``clock`` (monotonic)."""

    def __init__(self, debounce: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.debounce = debounce
        self.clock = clock
        self.entries: dict[str, _Entry] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def touch(self, path: str) -> None:
        """An event named ``path`` (a photo, a sidecar, a folder, or a path now gone): it waits
        (again) for the whole debounce interval."""
        self.entries[path] = _Entry(None, self.clock())

    def tick(self) -> Settled:
        """``stat`` every waiting path once (each folder listed once) and return what settled."""
        now = self.clock()
        out = Settled()
        by_folder: dict[str, list[str]] = {}
        for path in list(self.entries):
            by_folder.setdefault(os.path.dirname(path), []).append(path)
        for folder, paths in by_folder.items():
            listing = _listing(folder)
            folded = {name.casefold(): name for name in listing}
            for path in paths:
                entry = self.entries.get(path)
                if entry is None:
                    continue
                signature = self._signature(path, listing, folded)
                if signature is None:  # replaced by other entries (a folder, a sidecar's photo)
                    continue
                if signature != entry.signature:  # first look, or it changed: the interval starts
                    entry.signature, entry.since = signature, now
                    continue
                if now - entry.since >= self.debounce:
                    del self.entries[path]
                    if signature[0] == "gone":
                        out.gone.append(path)
                    elif signature[0] == "photo":
                        out.photos.append(path)
        return out

    def _signature(
        self, path: str, listing: Mapping[str, os.stat_result | None], folded: Mapping[str, str]
    ) -> tuple[Any, ...] | None:
        name = os.path.basename(path)
        st = listing.get(name)
        if name not in listing:
            return ("gone",)
        if st is None or stat.S_ISLNK(st.st_mode):  # a symlink is never followed
            del self.entries[path]
            return None
        if stat.S_ISDIR(st.st_mode):  # a folder that appeared: its files settle one by one
            del self.entries[path]
            for found in _files_below(path):
                if found not in self.entries:
                    self.touch(found)
            return None
        kind = wanted_name(name)
        if kind == "sidecar":
            owner = owner_of(Path(path), set(folded))
            if owner is not None and wanted_name(folded[owner]) == "photo":
                del self.entries[path]
                photo = os.path.join(os.path.dirname(path), folded[owner])
                self.touch(photo)  # the sidecar changed: its photo waits again
                return None
            return ("sidecar", st.st_size, st.st_mtime_ns, st.st_ino)
        if kind != "photo":
            del self.entries[path]
            return None
        sidecars = tuple(
            (n, s.st_size, s.st_mtime_ns, s.st_ino)
            for n in sorted(_companion_names(name, folded))
            if (s := listing.get(n)) is not None
        )
        return ("photo", st.st_size, st.st_mtime_ns, st.st_ino, sidecars)


def _companion_names(photo: str, folded: Mapping[str, str]) -> list[str]:
    """The names of ``photo``'s sidecars in its folder's listing (:func:`photos.sidecar.companions`
    without listing the folder again)."""
    out = []
    long = f"{photo}{SIDECAR_SUFFIX}".casefold()
    if long in folded:
        out.append(folded[long])
    short = f"{os.path.splitext(photo)[0]}{SIDECAR_SUFFIX}".casefold()
    if short != long and short in folded:
        if owner_of(Path(folded[short]), set(folded)) == photo.casefold():
            out.append(folded[short])
    return out


def _listing(folder: str) -> dict[str, os.stat_result | None]:
    """Name -> ``lstat`` of every entry of ``folder`` (None: it vanished while listed)."""
    out: dict[str, os.stat_result | None] = {}
    try:
        with os.scandir(folder) as it:
            for e in it:
                try:
                    out[e.name] = e.stat(follow_symlinks=False)
                except OSError:
                    out[e.name] = None
    except OSError:
        pass
    return out


def _files_below(folder: str) -> list[str]:
    """Every photo and sidecar at or below ``folder`` (no symlink followed, hidden ones left out)."""
    out: list[str] = []
    stack = [folder]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    if e.name.startswith("."):
                        continue
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    elif e.is_file(follow_symlinks=False) and wanted_name(e.name):
                        out.append(e.path)
        except OSError:
            continue
    return sorted(out)


# -- batches -------------------------------------------------------------------------------------
@dataclass
class Batcher:
    """Settled paths gathered into batches: flushed after ``wait`` quiet seconds, at ``most``
    paths, or once the first waited ``max_wait`` seconds."""

    wait: float = DEFAULT_BATCH_WAIT
    most: int = DEFAULT_BATCH_MAX
    max_wait: float = DEFAULT_BATCH_MAX_WAIT
    clock: Callable[[], float] = time.monotonic
    photos: dict[str, None] = field(default_factory=dict)
    gone: dict[str, None] = field(default_factory=dict)
    first: float | None = None
    last: float | None = None

    def add(self, settled: Settled) -> None:
        if not settled.photos and not settled.gone:
            return
        now = self.clock()
        self.first = now if self.first is None else self.first
        self.last = now
        self.photos.update(dict.fromkeys(settled.photos))
        self.gone.update(dict.fromkeys(settled.gone))

    def due(self) -> bool:
        if self.first is None or self.last is None:
            return False
        now = self.clock()
        size = len(self.photos) + len(self.gone)
        return size >= self.most or now - self.last >= self.wait or now - self.first >= self.max_wait

    def take(self) -> tuple[list[str], list[str]]:
        photos, gone = list(self.photos), list(self.gone)
        self.photos, self.gone, self.first, self.last = {}, {}, None, None
        return photos, gone


# -- observers -------------------------------------------------------------------------------------
def network_mount(path: str) -> str | None:
    """The file-system type of ``path``'s mount when inotify cannot see changes made there (NFS,
    SMB, sshfs, …), from ``/proc/self/mounts``; None otherwise (or where it cannot be told)."""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            mounts = [line.split()[:3] for line in f if len(line.split()) >= 3]
    except OSError:
        return None
    real = os.path.realpath(path)
    best: tuple[int, str] | None = None
    for _dev, point, fstype in mounts:
        point = point.replace("\\040", " ")
        if real == point or real.startswith(point.rstrip("/") + "/"):
            if best is None or len(point) > best[0]:
                best = (len(point), fstype)
    if best is not None and best[1] in NETWORK_FS:
        return best[1]
    return None


class _Handler:
    """watchdog's handler: every path an event names goes to ``sink`` (the watcher's queue)."""

    def __init__(self, sink: Callable[[str, bool], None]) -> None:
        self.sink = sink

    def dispatch(self, event: Any) -> None:
        if event.event_type not in _EVENTS:
            return  # opened / closed without writing: a reader (our own sync, a worker)
        if event.is_directory and event.event_type in ("modified", "attrib", "closed"):
            return
        for path in (event.src_path, getattr(event, "dest_path", "") or ""):
            if path:
                self.sink(os.fsdecode(path), event.is_directory)


def start_observer(
    roots: Sequence[str], sink: Callable[[str, bool], None], *, poll: bool, poll_interval: float
) -> tuple[Any, str]:
    """A started watchdog observer over ``roots`` and what it is (``inotify``, ``polling``): the
    polling one when asked, when a root is on a network mount, or when inotify cannot start
    (its watch limit, ``fs.inotify.max_user_watches``, reached)."""
    from watchdog.observers import Observer
    from watchdog.observers.polling import PollingObserver

    handler = _Handler(sink)
    why = "--poll" if poll else None
    if why is None:
        for root in roots:
            fstype = network_mount(root)
            if fstype:
                why = f"{root} is on a {fstype} mount"
                break
    if why is None:
        observer = Observer()
        try:
            for root in roots:
                observer.schedule(handler, root, recursive=True)  # type: ignore[arg-type]
            observer.start()
            return observer, "inotify"
        except OSError as exc:
            why = f"the inotify observer failed: {exc}"
            try:
                observer.stop()
            except Exception:  # noqa: BLE001 - it never started
                log.debug("the inotify observer did not stop", exc_info=True)
    log.warning("watching by polling every %g s (%s)", poll_interval, why)
    polling = PollingObserver(timeout=poll_interval)
    for root in roots:
        polling.schedule(handler, root, recursive=True)  # type: ignore[arg-type]
    polling.start()
    return polling, "polling"


# -- the watcher -----------------------------------------------------------------------------------
@dataclass
class WatchOptions:
    debounce: float = DEFAULT_DEBOUNCE
    batch_wait: float = DEFAULT_BATCH_WAIT
    batch_max: int = DEFAULT_BATCH_MAX
    batch_max_wait: float = DEFAULT_BATCH_MAX_WAIT
    poll: bool = False
    poll_interval: float = DEFAULT_POLL_INTERVAL
    initial_sync: bool = True


class Watcher:
    """Watches ``paths`` and syncs what settles (see the module). :meth:`run` until ``stop``;
    ``on_sync`` is called with each sync's report."""

    def __init__(
        self,
        client: Client,
        lanes: Sequence[str],
        paths: Iterable[str | os.PathLike[str]],
        params: Mapping[str, Any] | None = None,
        options: WatchOptions | None = None,
        on_sync: Callable[[SyncReport], None] | None = None,
    ) -> None:
        from photojobs.sync import sync_roots

        self.client = client
        self.options = options or WatchOptions()
        self.lanes = list(lanes)
        self.params = dict(params or {})
        self.client.check_job(self.lanes, self.params)  # a bad lane or parameter: at once
        self.roots = [r for r in sync_roots(paths, None) if os.path.isdir(r)]
        if not self.roots:
            from store.errors import SubmissionError

            raise SubmissionError("watch needs folders to watch, not files")
        self.on_sync = on_sync
        self.stability = Stability(self.options.debounce)
        self.batches = Batcher(self.options.batch_wait, self.options.batch_max, self.options.batch_max_wait)
        self.stopping = threading.Event()
        self._woken = threading.Event()
        self._lock = threading.Lock()
        self._queue: dict[str, None] = {}
        self.observer: Any = None
        self.kind = ""
        self.syncs = 0
        self.failures = 0

    def _sink(self, path: str, is_dir: bool) -> None:
        if not is_dir and wanted_name(os.path.basename(path)) is None:
            return
        if _hidden_below(path, self.roots):
            return
        with self._lock:
            self._queue[path] = None
        self._woken.set()

    def start(self) -> None:
        self.observer, self.kind = start_observer(
            self.roots, self._sink, poll=self.options.poll, poll_interval=self.options.poll_interval
        )

    def stop(self) -> None:
        self.stopping.set()
        self._woken.set()
        if self.observer is not None:
            self.observer.stop()
            self.observer.join(timeout=10)

    def run(self) -> None:
        """Start the observer (unless started), sync once, then settle and sync until stopped."""
        if self.observer is None:
            self.start()
        if self.options.initial_sync:
            self._sync(self.roots, [], min_age=self.options.debounce)
        tick = max(0.05, min(0.5, self.options.debounce / 4))
        while not self.stopping.is_set():
            idle = not self.stability.entries and not self.batches.photos and not self.batches.gone
            self._woken.wait(timeout=1.0 if idle else tick)
            self._woken.clear()
            with self._lock:
                named, self._queue = list(self._queue), {}
            for path in named:
                self.stability.touch(path)
            if self.stability.entries:
                self.batches.add(self.stability.tick())
            if self.batches.due():
                photos, gone = self.batches.take()
                self._sync(photos + gone, gone)

    def _sync(self, paths: list[str], gone: list[str], min_age: float | None = None) -> None:
        from photojobs.sync import sync

        if not paths:
            return
        try:
            report = sync(
                self.client, self.lanes, paths, self.params, job_roots=self.roots, allow_gone=True,
                min_age=min_age,
            )  # fmt: skip
        except Exception:
            self.failures += 1
            log.exception("sync of %d path(s) failed; they wait for the next try", len(paths))
            self.stopping.wait(min(30.0, 2.0 ** min(self.failures, 5)))
            for p in paths:
                self.stability.touch(p)
            return
        self.failures = 0
        self.syncs += 1
        for p in report.busy_paths:  # not taken this time: waits again
            self.stability.touch(p)
        if self.on_sync is not None:
            self.on_sync(report)


def start_in_thread(watcher: Watcher) -> threading.Thread:
    """Run ``watcher`` in a daemon thread (``photojobs worker --watch-photos``); stop it with
    ``watcher.stop()``."""
    watcher.start()
    thread = threading.Thread(target=watcher.run, name="photojobs-watch", daemon=True)
    thread.start()
    return thread
