"""The ``rename`` lane: a pattern of capture time and camera, collision-free, never clobbering.

A burst (shots that render the same name, one second apart at most by their pattern) takes its
``_N`` suffixes in sub-second order (``SubSecTimeOriginal``), not in the order its items ran: each
shot finds the job's other shots that render its name (:func:`burst_rank`) and takes the free name
of its rank (``photos.rename.burst_suffix``)."""

from __future__ import annotations

import os
from collections import OrderedDict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from middleware.context import ItemContext
from photos.analyze import header_facts
from photos.capture_time import FILE_TIME, order_key
from photos.containment import is_within
from photos.params import DEFAULT_RENAME_PATTERN
from photos.rename import burst_suffix, render, resolve_target
from store.bursts import photo_paths, rename_candidates

from .common import facts_for, fallback_time, params, photo_path, photo_root, readable_roots
from .effects import FileEffects
from .lane import lane_actor
from .moves import MAX_SUFFIX, move_photo

_FACTS_CACHE: OrderedDict[tuple[str, int, int, int], dict[str, Any]] = OrderedDict()
_CACHE_SIZE = 4096
_Index = dict[str, list[tuple[tuple[str, float], int]]]
_BURSTS: OrderedDict[tuple[int, str, str], _Index] = OrderedDict()
_BURSTS_KEPT = 64


def rename_photo(ctx: ItemContext) -> dict[str, Any]:
    """One rename item (the lane's work, without Dramatiq: the actor below runs it)."""
    effects = FileEffects(ctx)
    recovered = effects.recover()
    if recovered:
        return {"target": recovered[-1].target, "recovered": True}
    path = photo_path(ctx)
    root = photo_root(ctx, path)
    facts = facts_for(ctx, path)
    pattern = params(ctx).get("pattern", DEFAULT_RENAME_PATTERN)
    rendered = render(pattern, facts, path, fallback_time(facts, path))
    first = 0
    if rendered.taken_from not in (None, FILE_TIME) and facts.get("taken_subsec") and "{sha8" not in pattern:
        first = _burst_first_suffix(ctx, path, root, pattern, facts, rendered.relpath)
    result = move_photo(ctx, effects, path, root, rendered.relpath, rendered.notes, first_suffix=first)
    if rendered.taken_from is not None:
        result["taken_from"] = rendered.taken_from
    return result


rename = lane_actor("rename")(rename_photo)


def _burst_first_suffix(
    ctx: ItemContext, path: Path, root: Path, pattern: str, facts: dict[str, Any], relpath: str
) -> int:
    """The collision number this shot takes so that its burst is named in sub-second order."""
    target_dir = resolve_target(root, relpath).parent
    rank, member_paths = burst_rank(ctx, path, pattern, facts, relpath, target_dir)
    if rank == 0 and not member_paths:
        return 0

    def free(candidate: str) -> bool:
        target = resolve_target(root, candidate)
        return target == path or str(target) in member_paths or not (target.exists() or target.is_symlink())

    return burst_suffix(rank, free, relpath, MAX_SUFFIX)


def burst_rank(
    ctx: ItemContext, path: Path, pattern: str, facts: dict[str, Any], relpath: str, target_dir: Path
) -> tuple[int, set[str]]:
    """This shot's place in its burst (0: first) and where the burst's other shots are now.

    The burst: the job's photos in this photo's folder or in the target's folder (renamed already)
    whose rename has not ended without a name and that render the same ``relpath`` — read from
    their headers, a time shift of this job added to those not shifted yet; ordered by capture time
    with sub-seconds, then id. Each worker process indexes a folder of a job once
    (:func:`_burst_index`); only the members' current paths are read per shot."""
    me = (order_key(facts.get("taken"), facts.get("taken_subsec")), ctx.lease.photo_id or 0)
    # the photo's own folder first: a shot not in it at that moment has moved already, so it is in
    # its target folder when that is indexed (after)
    found: dict[int, tuple[str, float]] = {}
    for folder in (path.parent, target_dir):
        for order, pid in _burst_index(ctx, pattern, folder).get(relpath, []):
            found.setdefault(pid, order)
    others = [(order, pid) for pid, order in found.items() if pid != ctx.lease.photo_id]
    members = sorted([me, *others])
    paths = photo_paths(ctx.engine, [pid for _, pid in others])
    return members.index(me), set(paths.values())


def _burst_index(ctx: ItemContext, pattern: str, folder: Path) -> _Index:
    """{rendered relpath: [(capture order key, photo id)]} of the job's rename candidates in
    ``folder``, built once per worker process, job and folder (a photo's rendered name does not
    change within the job: its time only by this job's shift, added here to those not shifted yet)."""
    key = (ctx.lease.job_id, pattern, str(folder))
    found = _BURSTS.get(key)
    if found is not None:
        return found
    shift = _job_shift(ctx)
    roots = readable_roots(ctx)
    index: _Index = {}
    before = "exif" if shift else None
    candidates = rename_candidates(ctx.engine, ctx.lease.job_id, [str(folder)], "rename", before)
    for c in candidates:
        if roots and not is_within(c.path, roots):
            continue
        other = Path(c.path)
        other_facts = _cached_facts(other)
        if other_facts is None or not other_facts.get("taken"):
            continue
        if shift and c.before_state != "succeeded":  # this job's shift is still to come for it
            moved = datetime.fromisoformat(other_facts["taken"]) + shift
            other_facts = {**other_facts, "taken": moved.isoformat()}
        file_time = c.file_time if c.file_time is not None else 0.0
        rendered = render(pattern, other_facts, other, file_time).relpath
        order = order_key(other_facts.get("taken"), other_facts.get("taken_subsec"))
        index.setdefault(rendered, []).append((order, c.photo_id))
    _BURSTS[key] = index
    while len(_BURSTS) > _BURSTS_KEPT:
        _BURSTS.popitem(last=False)
    return index


def _job_shift(ctx: ItemContext) -> timedelta | None:
    text = ctx.params.get("exif.shift")
    if not text:
        return None
    from photos.exif import parse_shift

    return parse_shift(str(text))


def _cached_facts(path: Path) -> dict[str, Any] | None:
    """A photo's header facts (capture time, camera, size; no hash), cached per process by inode,
    size and mtime; None when it is gone or unreadable."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    found = _FACTS_CACHE.get(key)
    if found is None:
        try:
            found = header_facts(path, hashed=False)
        except Exception:  # noqa: BLE001 - an unreadable neighbour is not a shot of this burst
            return None
        _FACTS_CACHE[key] = found
        while len(_FACTS_CACHE) > _CACHE_SIZE:
            _FACTS_CACHE.popitem(last=False)
    return found
