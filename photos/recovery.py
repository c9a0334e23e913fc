"""Deciding the fate of a recorded file effect from what is on disk (docs/design.md rule 9).

A recovering attempt, a stopping item and the sweeper all use :func:`settle_on_disk`. It first
*consumes* the effect's staged file (an atomic rename to a name of its own), so a zombie attempt
that wakes later finds its source gone and creates nothing; only then does it look at the target:

- the target holds the result             -> ``applied`` (finishing a half-done move);
- the target holds the base, staged taken -> apply it now (``may_apply``) or ``discarded``;
- the target holds the base, no staged    -> ``replan`` (discard and redo the work);
- anything else                           -> ``conflict``: "changed by someone else", nothing touched.

A move whose staged link is gone while a file is at its target, which is not the planned result,
and whose source name is gone (or still holds the base: the attempt died between the move and
dropping the old name) *landed*, and the photo was changed there afterwards (an outside edit:
``exiftool -Rating=3``): a ``conflict`` with ``moved`` set and the content found, so the store
follows the photo to the target (the intent settles ``applied``) while the item still fails with
the conflict. (Only a landed move takes a recorded move's staged link away without settling it:
a discarded move is marked before its link is removed.)

Intents recorded before content hashes existed (``base_sha256`` None) trust the staged file.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from . import fileops, rootfs
from .errors import OutsideRoot
from .rootfs import Roots

APPLIED = "applied"
DISCARDED = "discarded"
REPLAN = "replan"
CONFLICT = "conflict"


@dataclass(frozen=True)
class Effect:
    """What a recorded intent says (the store's row, without the store)."""

    kind: str  # replace | publish | move
    staged: str
    target: str
    source: str | None
    base_sha256: str | None
    result_sha256: str | None


@dataclass(frozen=True)
class Verdict:
    state: str  # APPLIED, DISCARDED, REPLAN or CONFLICT
    note: str
    applied_now: bool = False
    # A CONFLICT after a move that landed: the photo is at the effect's target, holding ``content``
    # (not the planned result: someone changed it after the move).
    moved: bool = False
    content: str | None = None

    @property
    def settles_as(self) -> str:
        """The intent's final state in the store (a move that landed is applied, even in conflict)."""
        return APPLIED if self.state == APPLIED or self.moved else DISCARDED


def content_of(path: str | os.PathLike[str], *, within: Roots) -> str | None:
    """SHA-256 of a regular file, None when there is no (readable) file. The file is opened beneath
    its root (``photos.rootfs``): a symlink at its name or on its way is never followed, so whatever
    a name or a folder swapped for a symlink points to is never read (None: nothing within reach)."""
    try:
        return fileops.content_sha256(path, within=within)
    except OutsideRoot:
        return None


def consume_staged(staged: str | os.PathLike[str], tag: str, *, within: Roots) -> Path | None:
    """Take a staged file away from the attempt that made it: rename it to a name of this
    recovery (``tag``), in its folder opened beneath its root; None if it is already gone (applied,
    or removed) or out of reach (its folder a symlink now)."""
    staged = Path(staged)
    claimed = fileops.staged_path(staged, f"claimed-{tag}")
    try:
        with within.folders(staged, claimed) as [(folder, name), (_, claimed_name)]:
            rootfs.replace(folder, name, folder, claimed_name)
    except (FileNotFoundError, OutsideRoot):
        return None
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:  # staged_path shortens; this is a safety net
            return None
        raise
    return claimed


def link_staged(photo: str | os.PathLike[str], tag: str, *, within: Roots) -> Path | None:
    """A staged hard link of ``photo`` for one attempt's move (``.{name}.pj-{tag}.tmp`` next to
    it, made in its folder opened beneath its root; a symlink at ``photo`` is linked, never
    followed); None where the filesystem cannot hard-link (the move then uses the photo's own name)."""
    photo = Path(photo)
    staged = fileops.staged_path(photo, tag)
    with within.folders(photo, staged) as [(folder, name), (_, staged_name)]:
        folder.delete(staged_name, missing_ok=True)
        try:
            rootfs.link(folder, name, folder, staged_name)
        except OSError as exc:
            if exc.errno in rootfs.NO_LINK_ERRNOS:
                return None
            raise
        folder.fsync()
    return staged


def changed(path: str, expected: str | None, found: str | None) -> str:
    return f"changed by someone else: {path} expected {expected or 'nothing'} found {found or 'nothing'}"


def drop_moved_source(source: str | None, target: str, result: str | None, *, within: Roots) -> None:
    """After a move landed on ``target``: remove the source name if it still is the photo (the
    same file as the target, or a file of the result's content), beneath its root."""
    if not source or source == target:
        return
    try:
        with within.folders(source, target) as [(sf, sname), (tf, tname)]:
            src = sf.lstat(sname)
            if src is None:
                return
            if stat.S_ISLNK(src.st_mode):  # a photo that was a symlink inside the roots: what it names
                try:
                    src = os.stat(sname, dir_fd=sf.fd)
                except OSError:
                    src = None
            dst = tf.lstat(tname)
            same = src is not None and dst is not None and _identity(src) == _identity(dst)
            if same or (result is not None and content_of(source, within=within) == result):
                sf.delete(sname)
                sf.fsync()
    except OutsideRoot:  # its folder is a symlink now: nothing there is removed
        return


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def lexists(path: str | os.PathLike[str], *, within: Roots) -> bool:
    """Whether a name (a symlink too) is at ``path``, looked up beneath its root; False when its
    folder is out of reach (a symlink now): nothing there can be taken or clobbered."""
    try:
        return within.lstat(path) is not None
    except OutsideRoot:
        return False


def settle_on_disk(effect: Effect, *, may_apply: bool, tag: str, within: Roots) -> Verdict:
    """Finish or discard one recorded effect, deciding from the disk (see the module docstring).
    Every file is reached beneath the job's roots (``within``); an effect whose folder is a symlink
    now (or lies outside the roots) is not applied: a conflict, nothing touched."""
    legacy = effect.kind == "move" and effect.staged == effect.source  # no staged link to consume
    claimed = None if legacy else consume_staged(effect.staged, tag, within=within)
    try:
        if legacy:
            return _legacy_move(effect, may_apply=may_apply, tag=tag, within=within)
        return _decide(effect, claimed, may_apply=may_apply, tag=tag, within=within)
    except OutsideRoot as exc:
        return Verdict(CONFLICT, f"{exc}; not applied")
    finally:
        if claimed is not None:  # applied (renamed away) or not wanted: never left behind
            try:
                within.delete(claimed, missing_ok=True)
            except OutsideRoot:
                pass


def _decide(effect: Effect, claimed: Path | None, *, may_apply: bool, tag: str, within: Roots) -> Verdict:
    target, result, base = effect.target, effect.result_sha256, effect.base_sha256
    have = content_of(target, within=within)
    if result is not None and have == result:
        if effect.kind == "move":
            drop_moved_source(effect.source, target, result, within=within)
        return Verdict(APPLIED, "found applied on disk")
    if effect.kind == "move":
        # The photo is ``source`` (content ``base``); ``target`` must still be free.
        src_have = content_of(effect.source, within=within) if effect.source else None
        if claimed is None and have is not None and (src_have is None or src_have == base):
            # The staged link is gone and a file is at the target: the move landed (the link
            # became the target; the source name went, or still holds the photo as it was moved
            # when the attempt died before dropping it) and the photo was changed there since.
            return _moved_then_changed(effect, have, source_left=src_have is not None)
        if src_have is None or (base is not None and src_have != base):
            return Verdict(CONFLICT, changed(effect.source or "?", base, src_have))
        if lexists(target, within=within):
            return Verdict(REPLAN, f"target {target} is taken by another file")
        if claimed is None:
            return Verdict(REPLAN, "staged link gone before the move; photo unchanged")
        if not may_apply:
            return Verdict(DISCARDED, "not applied; photo left where it was")
        fileops.move_no_clobber(claimed, target, result, tag=f"mv-{tag}", within=within)
        drop_moved_source(effect.source, target, result, within=within)
        return Verdict(APPLIED, "applied by recovery", applied_now=True)
    if effect.kind == "publish":
        if lexists(target, within=within):
            return Verdict(REPLAN, f"target {target} is taken by another file")
        if claimed is None:
            return Verdict(REPLAN, "staged file gone; nothing published")
        if not may_apply or (result is not None and content_of(claimed, within=within) != result):
            return Verdict(DISCARDED, "not published")
        fileops.publish_no_clobber(claimed, target, within=within)
        return Verdict(APPLIED, "published by recovery", applied_now=True)
    if effect.kind != "replace":
        return Verdict(CONFLICT, f"unknown intent kind {effect.kind!r}")
    unchanged = have == base if base is not None else have is not None
    if not unchanged:
        return Verdict(CONFLICT, changed(target, base or result, have))
    if claimed is None:
        return Verdict(REPLAN, "staged file gone; target unchanged")
    if not may_apply:
        return Verdict(DISCARDED, "not applied; target left unchanged")
    if result is not None and content_of(claimed, within=within) != result:
        return Verdict(REPLAN, "staged file does not hold the planned result")
    fileops.replace_atomic(claimed, target, within=within)
    return Verdict(APPLIED, "applied by recovery", applied_now=True)


def _legacy_move(effect: Effect, *, may_apply: bool, tag: str, within: Roots) -> Verdict:
    """A move recorded without a staged link (the photo itself is the source)."""
    target, result, source = effect.target, effect.result_sha256, effect.source
    if result is not None and content_of(target, within=within) == result:
        drop_moved_source(source, target, result, within=within)
        return Verdict(APPLIED, "found applied on disk")
    if not source or content_of(source, within=within) is None:
        have = content_of(target, within=within)
        if source and have is not None:  # the photo itself moved, then was changed at the target
            return _moved_then_changed(effect, have)
        return Verdict(CONFLICT, changed(source or "?", result, None))
    if lexists(target, within=within):
        return Verdict(REPLAN, f"target {target} is taken by another file")
    if not may_apply:
        return Verdict(DISCARDED, "not applied; photo left where it was")
    fileops.move_no_clobber(source, target, result, tag=f"mv-{tag}", within=within)
    return Verdict(APPLIED, "applied by recovery", applied_now=True)


def _moved_then_changed(effect: Effect, have: str, *, source_left: bool = False) -> Verdict:
    """The conflict of a move that landed on ``effect.target``, changed there by someone else.
    A source name still there (``source_left``) holds the photo as it was before the change: it is
    left alone (the only copy of those bytes now), and the note says so."""
    moved = f"after it was moved there from {effect.source}"
    if source_left:
        moved += f"; {effect.source} still holds the photo as it was moved and is left as it is"
    note = f"{changed(effect.target, effect.result_sha256, have)} ({moved})"
    return Verdict(CONFLICT, note, moved=True, content=have)
