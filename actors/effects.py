"""Exactly-once file effects (docs/design.md rule 9), shared by the exif, rename, archive and upload lanes.

Order of every effect: stage the output next to its target (fsynced) -> record an intent in a
fenced transaction -> apply it with one atomic operation (fsync the directory) -> mark it applied
in a fenced transaction, moving the photo's path/hash in the store with it. A recovering attempt
first finishes or discards every intent its predecessors left ``recorded``, deciding from the content on
disk (``photos.recovery``) and consuming the staged file first; a zombie's late apply finds its
staged file gone and changes nothing. Until an intent is settled it holds the item's photo locks.

Intent kinds:
- ``replace``: ``staged`` takes the place of ``target`` (an EXIF edit of the photo in place).
- ``move``: ``source`` moves to ``target`` without clobbering (rename, archive); ``staged`` is a hard
  link of the photo made for this attempt, so recovery can take it away from a zombie.
- ``publish``: ``staged`` (a copy) gets the name ``target`` without clobbering (local upload).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from middleware import failpoints
from middleware.context import ItemContext
from photos import fileops, history, recovery
from photos.errors import OutsideRoot, PhotoError
from photos.rootfs import Roots
from store import intents as store_intents
from store.history import MADE_DIRS
from store.intents import IntentRow, TargetTaken

from .common import job_roots

log = logging.getLogger("photojobs.effects")

__all__ = ["Applied", "FileEffects", "TargetTaken"]


@dataclass(frozen=True)
class Applied:
    intent_id: int
    kind: str
    target: str
    recovered: bool
    note: str | None = None
    companion: bool = False  # a file that travels with the photo (a raw's sidecar), not the photo


class FileEffects:
    def __init__(self, ctx: ItemContext) -> None:
        self.ctx = ctx
        self.lane = ctx.spec.name
        #: every file this item stages, applies, links or removes is reached beneath these
        self.fs: Roots = job_roots(ctx)

    @property
    def tag(self) -> str:
        return f"i{self.ctx.item_id}-t{self.ctx.token}"

    # -- recovery ---------------------------------------------------------------------------
    def recover(self) -> list[Applied]:
        """Finish or discard the intents earlier attempts of this item left behind, deciding from the
        disk (``photos.recovery``): the staged file is consumed first, so the attempt that made it
        can never apply it late. A photo changed by someone else fails the item, touching nothing."""
        for intent in store_intents.open_intents(self.ctx.engine, self.ctx.item_id):
            self._finish(intent)
        # An effect an earlier attempt applied (and perhaps died before finishing the item) is done:
        # it must not be applied again (an EXIF time shift twice, a second rename).
        # The photo's own effect last: callers report ``recovered[-1]`` (a raw's sidecars first).
        applied = [
            Applied(i.id, i.kind, i.target, True, "applied by an earlier attempt", i.photo_id is None)
            for i in store_intents.item_intents(self.ctx.engine, self.ctx.item_id)
            if i.state == store_intents.APPLIED
        ]
        return sorted(applied, key=lambda a: not a.companion)

    def _finish(self, intent: IntentRow) -> Applied | None:
        verdict = recovery.settle_on_disk(intent.effect(), may_apply=True, tag=self.tag, within=self.fs)
        if verdict.state == recovery.APPLIED:
            self._settle(intent, "applied", verdict.note)
            return Applied(intent.id, intent.kind, intent.target, True, verdict.note)
        # A move that landed and was then changed by someone else: the store follows the photo to
        # where it is (path and the content found), and the item fails with the conflict.
        self._settle(intent, verdict.settles_as, verdict.note, content=verdict.content)
        if verdict.state == recovery.CONFLICT:
            raise PhotoError(Path(intent.target), verdict.note)
        return None

    def _settle(self, intent: IntentRow, state: str, note: str, content: str | None = None) -> None:
        """Mark ``intent`` ``state`` (fenced); an applied move or replace moves the photo in the
        store with it, to the content ``content`` when given (else the planned result)."""
        moves_photo = intent.kind in ("move", "replace") and intent.photo_id == self.ctx.lease.photo_id
        with self.ctx.fenced(f"{state} intent") as s:
            store_intents.settle(
                s,
                self.ctx.lease,
                intent.id,
                state,
                worker=self.ctx.worker,
                photo_path=intent.target
                if state == "applied" and intent.kind == "move" and moves_photo
                else None,
                photo_sha256=(content or intent.sha256) if state == "applied" and moves_photo else None,
                note=note,
            )

    def sweep_temps(self, *folders: Path) -> list[Path]:
        """Remove this item's staged files left by earlier (dead) attempts in ``folders`` (each
        opened beneath its root; one that is missing or out of reach is left alone)."""
        live: set[str] | None = None  # read from the store only when a folder holds a candidate
        mine = f".pj-i{self.ctx.item_id}-t"
        removed = []
        for path in folders:
            try:
                folder = self.fs.opendir(path)
            except (OSError, OutsideRoot):
                continue
            with folder:
                for name in folder.listdir():
                    ours_now = name.endswith(f"{mine}{self.ctx.token}.tmp")
                    if mine not in name or not name.endswith(".tmp") or ours_now:
                        continue
                    if live is None:
                        live = store_intents.live_staged_paths(self.ctx.engine)
                    entry = path / name
                    if str(entry) not in live:
                        folder.delete(name, missing_ok=True)
                        removed.append(entry)
        return removed

    def drop(self, path: Path) -> None:
        """Remove a staged file of this item, beneath its root; gone already, or out of reach (its
        folder a symlink now), it is left to the sweeper."""
        try:
            self.fs.delete(path, missing_ok=True)
        except OutsideRoot:
            pass

    # -- one effect -----------------------------------------------------------------------
    def record(
        self,
        *,
        kind: str,
        staged: Path,
        target: Path,
        source: Path | None,
        sha256: str,
        base_sha256: str | None = None,
        companion: bool = False,
    ) -> int:
        """Record the intent (fenced). ``sha256`` is what ``target`` will hold, ``base_sha256`` what
        it holds now (None for a new name); a ``companion`` effect (a raw's sidecar) names no photo."""
        return self.record_unit(
            [
                {
                    "kind": kind,
                    "staged": staged,
                    "target": target,
                    "source": source,
                    "sha256": sha256,
                    "base_sha256": base_sha256,
                    "companion": companion,
                }
            ]
        )[0]

    def record_unit(self, effects: list[dict[str, Any]]) -> list[int]:
        """Record several intents in ONE fenced transaction (a raw and its sidecars: all recorded or
        none); each dict holds :meth:`record`'s arguments. ``TargetTaken`` records none.

        A ``replace`` first keeps the file it will displace in the history store (``photos.history``:
        a hard link to the inode the replace takes off the name) and, like a metadata edit's new
        file, notes the tags it changes: the effect log's row (``store.history``) takes both."""
        for e in effects:
            e["detail"] = {**self._history_detail(e), **(e.get("detail") or {})}
            if e["kind"] in ("move", "publish"):  # the folders it will make: its undo removes them
                e["detail"].setdefault(MADE_DIRS, self.missing_folders(Path(e["target"]).parent))
        with self.ctx.fenced("record intent") as s:
            ids = [
                store_intents.record(
                    s,
                    self.ctx.lease,
                    kind=e["kind"],
                    staged=str(e["staged"]),
                    target=str(e["target"]),
                    source=str(e["source"]) if e.get("source") else None,
                    sha256=e["sha256"],
                    base_sha256=e.get("base_sha256"),
                    worker=self.ctx.worker,
                    companion=bool(e.get("companion")),
                    detail=e["detail"] or None,
                )
                for e in effects
            ]
        failpoints.hit(f"{self.lane}.after_record")
        return ids

    def _history_detail(self, e: dict[str, Any]) -> dict[str, Any]:
        """The displaced original kept and the tags changed, for a replace (and a new sidecar)."""
        kind, staged, target = e["kind"], Path(e["staged"]), Path(e["target"])
        detail: dict[str, Any] = {}
        if kind == "replace" and e.get("base_sha256"):
            # a store (or the target's folder) that is a symlink refuses the edit (PhotoError)
            try:
                # kept as a delta against the version that replaces it (``photos.history``)
                kept = history.keep(
                    target, e["base_sha256"], within=self.fs, new=staged, new_sha256=e["sha256"]
                )
            except OSError as exc:  # the edit goes on; its undo will say the original was not kept
                log.warning("could not keep the original of %s: %s", target, exc)
                kept = None
            detail["kept"] = str(kept) if kept else None
        if kind == "replace" or (kind == "publish" and self.lane == "exif"):
            changes = history.tag_changes_or_none(target if kind == "replace" else None, staged)
            if changes is not None:
                detail["changes"] = changes
        return detail

    def missing_folders(self, folder: Path) -> list[str]:
        """``folder`` and its parents beneath their root that are not there yet (deepest first): the
        ones a move or publish into ``folder`` makes, looked at beneath the roots (none outside)."""
        try:
            root = self.fs.locate(folder / "x")[0]
        except (OSError, OutsideRoot):
            return []
        missing: list[str] = []
        while folder != root and root in folder.parents:
            try:
                if self.fs.lstat(folder) is not None:
                    break
            except (OSError, OutsideRoot):
                break
            missing.append(str(folder))
            folder = folder.parent
        return missing

    def root_of(self, path: Path) -> Path:
        """The deepest of the job's roots that holds ``path`` (``OutsideRoot`` when none does): its
        history store is on the photo's filesystem and inside what the operator configured."""
        return self.fs.locate(path)[0]

    def apply_and_mark(
        self,
        intent_id: int,
        *,
        kind: str,
        staged: Path,
        target: Path,
        source: Path | None,
        sha256: str,
        companion: bool = False,
    ) -> Applied:
        """Apply a recorded intent atomically, then mark it applied (moving the photo in the store).

        Right before the file operation a fenced transaction checks that the lease and the intent
        are still live; a zombie that is revoked after that check finds its staged file consumed by
        whoever recovers the intent (and the photo still locked by it), so nothing lands."""
        if kind not in ("replace", "publish", "move"):
            raise ValueError(f"unknown intent kind {kind!r}")
        with self.ctx.fenced("apply intent") as s:
            store_intents.assert_live(s, self.ctx.lease, intent_id)
        failpoints.hit(f"{self.lane}.before_apply")  # live, checked; the file operation next
        # every name is reached beneath the job's roots by descriptor: a folder swapped for a
        # symlink since the plan is refused (rootfs.NotBeneath, a PhotoError), nothing done outside
        if kind == "replace":
            fileops.replace_atomic(staged, target, within=self.fs)
        elif kind == "publish":
            fileops.publish_no_clobber(staged, target, within=self.fs)
        else:
            if source is None:
                raise RuntimeError("internal error: expected source is not None")
            if staged != source:  # a staged hard link of the photo: it moves, then the old name goes
                fileops.move_no_clobber(staged, target, sha256, tag=self.tag, within=self.fs)
                failpoints.hit(f"{self.lane}.after_move")  # landed; the old name not yet dropped
                recovery.drop_moved_source(str(source), str(target), sha256, within=self.fs)
            else:
                fileops.move_no_clobber(source, target, sha256, tag=self.tag, within=self.fs)
        failpoints.hit(f"{self.lane}.after_apply")
        row = IntentRow(
            intent_id,
            self.ctx.item_id,
            self.ctx.token,
            None if companion else self.ctx.lease.photo_id,
            kind,
            str(staged),
            str(target),
            str(source) if source else None,
            None,
            sha256,
            "recorded",
        )
        self._settle(row, "applied", "applied")
        failpoints.hit(f"{self.lane}.after_mark")
        return Applied(intent_id, kind, str(target), False, companion=companion)

    def discard(
        self,
        intent_id: int,
        kind: str,
        staged: Path,
        target: Path,
        note: str,
        source: Path | None = None,
        companion: bool = False,
    ) -> None:
        """Give up a recorded intent: mark it discarded, then remove its staged file (never the
        photo). Marked first: a recorded move whose staged link is gone has landed (recovery relies
        on it); an attempt that dies in between leaves a stray staged file the sweeper removes."""
        row = IntentRow(
            intent_id,
            self.ctx.item_id,
            self.ctx.token,
            None if companion else self.ctx.lease.photo_id,
            kind,
            str(staged),
            str(target),
            str(source) if source else None,
            None,
            None,
            "recorded",
        )
        self._settle(row, "discarded", note)
        if staged != source:
            self.drop(staged)


def result_of(applied: Applied, **extra: Any) -> dict[str, Any]:
    return {
        "target": applied.target,
        "recovered": applied.recovered,
        **({"note": applied.note} if applied.note else {}),
        **extra,
    }
