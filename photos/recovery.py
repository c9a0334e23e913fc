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
from dataclasses import dataclass
from pathlib import Path

from . import fileops

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


def content_of(path: str | os.PathLike[str]) -> str | None:
    """SHA-256 of a regular file, None when there is no (readable) file. A symlink is not followed
    (None): whatever a name swapped for a symlink points to is never read."""
    try:
        if os.path.islink(path) or not os.path.isfile(path):
            return None
        return fileops.sha256_file(path, nofollow=True)
    except OSError:
        return None


def consume_staged(staged: str | os.PathLike[str], tag: str) -> Path | None:
    """Take a staged file away from the attempt that made it: rename it to a name of this
    recovery (``tag``); None if it is already gone (applied, or removed)."""
    staged = Path(staged)
    claimed = fileops.staged_path(staged, f"claimed-{tag}")
    try:
        os.rename(staged, claimed)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:  # staged_path shortens; this is a safety net
            return None
        raise
    return claimed


def link_staged(photo: str | os.PathLike[str], tag: str) -> Path | None:
    """A staged hard link of ``photo`` for one attempt's move (``.{name}.pj-{tag}.tmp`` next to
    it); None where the filesystem cannot hard-link (the move then uses the photo's own name)."""
    photo = Path(photo)
    staged = fileops.staged_path(photo, tag)
    _drop(staged)
    try:
        os.link(photo, staged)
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
            return None
        raise
    fileops.fsync_dir(photo.parent)
    return staged


def _drop(path: Path | None) -> None:
    if path is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def changed(path: str, expected: str | None, found: str | None) -> str:
    return f"changed by someone else: {path} expected {expected or 'nothing'} found {found or 'nothing'}"


def drop_moved_source(source: str | None, target: str, result: str | None) -> None:
    """After a move landed on ``target``: remove the source name if it still is the photo."""
    if not source or source == target or not os.path.lexists(source):
        return
    try:
        same = os.path.samefile(source, target)
    except OSError:
        same = False
    if same or (result is not None and content_of(source) == result):
        os.unlink(source)
        fileops.fsync_dir(Path(source).parent)


def settle_on_disk(effect: Effect, *, may_apply: bool, tag: str) -> Verdict:
    """Finish or discard one recorded effect, deciding from the disk (see the module docstring)."""
    if effect.kind == "move" and effect.staged == effect.source:
        return _legacy_move(effect, may_apply=may_apply, tag=tag)
    claimed = consume_staged(effect.staged, tag)
    try:
        return _decide(effect, claimed, may_apply=may_apply, tag=tag)
    finally:
        _drop(claimed)  # applied (renamed away) or not wanted: never left behind


def _decide(effect: Effect, claimed: Path | None, *, may_apply: bool, tag: str) -> Verdict:
    target, result, base = effect.target, effect.result_sha256, effect.base_sha256
    have = content_of(target)
    if result is not None and have == result:
        if effect.kind == "move":
            drop_moved_source(effect.source, target, result)
        return Verdict(APPLIED, "found applied on disk")
    if effect.kind == "move":
        # The photo is ``source`` (content ``base``); ``target`` must still be free.
        src_have = content_of(effect.source) if effect.source else None
        if claimed is None and have is not None and (src_have is None or src_have == base):
            # The staged link is gone and a file is at the target: the move landed (the link
            # became the target; the source name went, or still holds the photo as it was moved
            # when the attempt died before dropping it) and the photo was changed there since.
            return _moved_then_changed(effect, have, source_left=src_have is not None)
        if src_have is None or (base is not None and src_have != base):
            return Verdict(CONFLICT, changed(effect.source or "?", base, src_have))
        if os.path.lexists(target):
            return Verdict(REPLAN, f"target {target} is taken by another file")
        if claimed is None:
            return Verdict(REPLAN, "staged link gone before the move; photo unchanged")
        if not may_apply:
            return Verdict(DISCARDED, "not applied; photo left where it was")
        fileops.move_no_clobber(claimed, target, result, tag=f"mv-{tag}")
        drop_moved_source(effect.source, target, result)
        return Verdict(APPLIED, "applied by recovery", applied_now=True)
    if effect.kind == "publish":
        if os.path.lexists(target):
            return Verdict(REPLAN, f"target {target} is taken by another file")
        if claimed is None:
            return Verdict(REPLAN, "staged file gone; nothing published")
        if not may_apply or (result is not None and content_of(claimed) != result):
            return Verdict(DISCARDED, "not published")
        fileops.publish_no_clobber(claimed, target)
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
    if result is not None and content_of(claimed) != result:
        return Verdict(REPLAN, "staged file does not hold the planned result")
    fileops.replace_atomic(claimed, target)
    return Verdict(APPLIED, "applied by recovery", applied_now=True)


def _legacy_move(effect: Effect, *, may_apply: bool, tag: str) -> Verdict:
    """A move recorded without a staged link (the photo itself is the source)."""
    target, result, source = effect.target, effect.result_sha256, effect.source
    if result is not None and content_of(target) == result:
        drop_moved_source(source, target, result)
        return Verdict(APPLIED, "found applied on disk")
    if not source or content_of(source) is None:
        have = content_of(target)
        if source and have is not None:  # the photo itself moved, then was changed at the target
            return _moved_then_changed(effect, have)
        return Verdict(CONFLICT, changed(source or "?", result, None))
    if os.path.lexists(target):
        return Verdict(REPLAN, f"target {target} is taken by another file")
    if not may_apply:
        return Verdict(DISCARDED, "not applied; photo left where it was")
    fileops.move_no_clobber(source, target, result, tag=f"mv-{tag}")
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
