"""The files of a photo chaos run against a model computed from the event log and the store.

Before the run, :func:`take_baseline` records per photo what must never change (decoded pixels, a
few EXIF tags read with exiftool, the file's modification time) and its original capture time.
After the run, :func:`check_files` walks every folder the run's jobs could write to and reports:

- every photo exists exactly once (matched by its decoded pixels), at the path the store records;
  no other file with its pixels under the roots (a duplicate or a resurrected old path), none missing;
- its pixels are unchanged (a file with unknown pixels is a damaged photo);
- the content hash the store records is the file's;
- each EXIF time shift applied exactly once: DateTimeOriginal = original + the shifts of the exif
  items whose intent is ``applied`` (an undated photo stays undated); an item applies at most one
  edit, and a succeeded exif item applied one;
- the keywords of the last applied keywords edit are visible where photo apps read them
  (XMP-dc:Subject or IPTC:Keywords);
- the watched tags (make, model, exposure, lens, GPS, UserComment, ...) and the modification time
  are as before;
- no staged or temp file is left anywhere;
- no intent is still ``recorded`` for an item that has stopped (terminal or paused);
- no photo lock is held by an item that is not running and owns no unsettled intent;
- every succeeded upload's file holds the bytes the item uploaded, with the photo's pixels;
- every succeeded bundle holds each of its photos with that photo's pixels.

A camera raw (``photos.raw.is_raw``) is matched by its bytes, not its pixels: it must be
byte-identical to its original wherever it is (roots, archive, uploads, bundles). Its XMP sidecar
(``photos.sidecar``) must sit next to it with the matching name after every move (``NAME.EXT.xmp``,
or ``NAME.xmp`` for one that started so), exist iff it existed before or an exif edit of the raw
applied, hold every keyword of every applied keywords edit exactly once (merged with its own), its
``exif:DateTimeOriginal`` = the raw's capture time + the applied shifts (absent without a shift), and
keep the other content it started with; a sidecar next to no photo at its store path is an orphan.
Any other photo's sidecar (a JPEG's Lightroom ``NAME.xmp`` or darktable ``NAME.jpg.xmp``) must
likewise sit next to it under the matching name after every move, keep its editor's content and
list no keyword twice.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import zipfile
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from PIL import Image
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from photos.exif import parse_shift
from photos.fileops import is_staged_name, sha256_file
from photos.history import FOLDER as HISTORY  # kept originals (issue 31), not photos
from photos.raw import is_raw
from photos.sidecar import companions, is_sidecar
from store.events import EventRecord
from store.models import Intent, Item, Job, Photo, PhotoEffect, PhotoLock

# Tags no job of the run asks to change: they must read the same after the run (absent stays absent).
WATCHED_TAGS = (
    "IFD0:Make",
    "IFD0:Model",
    "IFD0:Orientation",
    "IFD0:Software",
    "ExifIFD:ISO",
    "ExifIFD:FNumber",
    "ExifIFD:ExposureTime",
    "ExifIFD:LensModel",
    "ExifIFD:UserComment",
    "GPS:GPSLatitude",
    "GPS:GPSLongitude",
)
TAKEN_TAG = "ExifIFD:DateTimeOriginal"
KEYWORD_TAGS = ("XMP-dc:Subject", "IPTC:Keywords")
EXIF_FORMAT = "%Y:%m:%d %H:%M:%S"
SIDECAR_TAKEN = "XMP-exif:DateTimeOriginal"
SIDECAR_KEYWORDS = "XMP-dc:Subject"
# What an editor left in a sidecar that no job asks to change: it must survive every write and move.
SIDECAR_KEPT = ("XMP-xmp:Rating", "XMP-xmp:Label", "XMP-dc:Description")
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "skipped"})
BUNDLE_SUFFIXES = (".zip", ".tar")


def pixel_hash(data: bytes | Path) -> str | None:
    """SHA-256 of the decoded pixels (mode, size and raw bytes); None if it does not decode."""
    try:
        with Image.open(io.BytesIO(data) if isinstance(data, bytes) else data) as img:
            img.load()
            return hashlib.sha256(f"{img.mode}{img.size}".encode() + img.tobytes()).hexdigest()
    except Exception:  # noqa: BLE001 - any decoding failure means "not this photo"
        return None


def content_key(data: bytes | Path, name: str) -> str | None:
    """What identifies a photo's content: a raw's SHA-256 of its bytes (it is never written), any
    other photo's decoded pixels (:func:`pixel_hash`)."""
    if is_raw(name):
        raw = data if isinstance(data, bytes) else data.read_bytes()
        return "raw:" + hashlib.sha256(raw).hexdigest()
    return pixel_hash(data)


def read_tags(paths: Sequence[Path]) -> dict[str, dict[str, Any]]:
    """{path: {group:tag: value}} for ``paths``, read by one exiftool call."""
    if not paths:
        return {}
    out = subprocess.run(
        ["exiftool", "-j", "-G1", "-charset", "filename=utf8", *[str(p) for p in paths]],
        capture_output=True,
        check=False,
        timeout=300,
    )
    if not out.stdout.strip():
        raise AssertionError(f"exiftool read nothing: {out.stderr.decode(errors='replace')[-2000:]}")
    return {str(Path(d["SourceFile"])): d for d in json.loads(out.stdout)}


@dataclass(frozen=True)
class Baseline:
    """What the run must preserve about one photo."""

    path: str  # where it was before the run
    sha256: str
    pixels: str
    mtime_ns: int
    taken: str | None  # EXIF DateTimeOriginal as written, None if undated
    tags: dict[str, Any]
    raw: bool = False
    sidecar: str | None = None  # its sidecar before the run: "ext" (NAME.EXT.xmp), "stem" (NAME.xmp)
    sidecar_tags: dict[str, Any] = field(default_factory=dict)  # SIDECAR_KEPT + its keywords


def take_baseline(paths: Sequence[Path]) -> dict[str, Baseline]:
    """{path: Baseline} of the photos before the run; every photo's pixels must be unique."""
    sidecars = {p: companions(p) for p in paths}  # a raw's, and a JPEG's (any photo's) the same way
    assert all(len(c) <= 1 for c in sidecars.values()), f"one sidecar per photo at most: {sidecars}"
    tags = read_tags([*paths, *(c[0] for c in sidecars.values() if c)])
    out: dict[str, Baseline] = {}
    for p in paths:
        t = tags[str(p)]
        pix = content_key(p, p.name)
        assert pix is not None, f"{p}: the sample does not decode"
        side = sidecars.get(p) or []
        form = None if not side else "ext" if side[0].name == f"{p.name}.xmp" else "stem"
        kept = {k: tags[str(side[0])].get(k) for k in (*SIDECAR_KEPT, SIDECAR_KEYWORDS)} if side else {}
        out[str(p)] = Baseline(
            str(p),
            sha256_file(p),
            pix,
            p.stat().st_mtime_ns,
            t.get(TAKEN_TAG),
            {k: t.get(k) for k in WATCHED_TAGS},
            raw=is_raw(p),
            sidecar=form,
            sidecar_tags=kept,
        )
    pixels = Counter(b.pixels for b in out.values())
    assert max(pixels.values()) == 1, "two sample photos share their pixels: the model needs them unique"
    return out


def _keywords(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


@dataclass
class FileReport:
    violations: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class IntentFact:
    id: int
    item_id: int
    token: int
    photo_id: int | None
    kind: str
    staged: str
    target: str
    state: str


def _walk(folder: Path) -> list[Path]:
    if not folder.exists():
        return []
    walk = ((d, files) for d, _, files in os.walk(folder) if HISTORY not in Path(d).parts)
    return sorted(Path(d) / f for d, files in walk for f in files)


def check_files(
    engine: Engine,
    *,
    baseline: Mapping[int, Baseline],
    folders: Iterable[Path],
    uploads: Path,
    records: Sequence[EventRecord],
    job_ids: Iterable[int],
) -> FileReport:
    """Compare the files under ``folders`` (photo roots, archive) and ``uploads`` with the model.

    ``baseline`` maps the store's photo id to the photo's state before the run."""
    rep = FileReport()
    bad = rep.violations
    jobs = set(job_ids)
    by_pixels = {b.pixels: pid for pid, b in baseline.items()}
    with Session(engine) as s:
        photos = {p.id: p for p in s.execute(select(Photo).where(Photo.id.in_(list(baseline)))).scalars()}
        items = {i.id: i for i in s.execute(select(Item).where(Item.job_id.in_(jobs))).scalars()}
        params = {
            j.id: dict(j.params or {}) for j in s.execute(select(Job).where(Job.id.in_(jobs))).scalars()
        }
        intents = [
            IntentFact(i.id, i.item_id, i.token, i.photo_id, i.kind, i.staged, i.target, i.state)
            for i in s.execute(select(Intent).order_by(Intent.id)).scalars()
        ]
        locks = list(s.execute(select(PhotoLock)).scalars())
        logged = list(s.execute(select(PhotoEffect).order_by(PhotoEffect.id)).scalars())
        s.expunge_all()

    # -- the photo files ------------------------------------------------------------------------
    found: dict[int, list[Path]] = defaultdict(list)
    bundles: list[Path] = []
    sidecar_files: list[Path] = []
    for folder in folders:
        for f in _walk(folder):
            if is_staged_name(f.name) or f.name.endswith(".tmp"):
                bad.append(f"staged/temp file left behind: {f}")
                continue
            if f.suffix.lower() in BUNDLE_SUFFIXES:
                bundles.append(f)
                continue
            if is_sidecar(f):
                sidecar_files.append(f)
                continue
            pix = content_key(f, f.name)
            pid = by_pixels.get(pix) if pix else None
            if pid is None:
                what = "raw bytes changed" if is_raw(f) else "unreadable" if pix is None else "changed"
                bad.append(f"file {f} is none of the photos (pixels {what})")
                continue
            found[pid].append(f)
    rep.counts["photo_files"] = sum(len(v) for v in found.values())
    current: dict[int, Path] = {}
    for pid, base in sorted(baseline.items()):
        photo = photos.get(pid)
        if photo is None:
            bad.append(f"photo {pid} ({base.path}): not in the store")
            continue
        at = Path(photo.path)
        where = found.get(pid, [])
        if at not in where:
            bad.append(
                f"photo {pid}: missing at the path the store records {at} "
                f"(its pixels are at {[str(w) for w in where]})"
            )
        extra = [w for w in where if w != at]
        if extra:
            bad.append(
                f"photo {pid}: exists {len(where)} times: duplicate(s) {[str(w) for w in extra]} "
                f"beside the store's {at}"
            )
        if at in where:
            current[pid] = at
            sha = sha256_file(at)
            if photo.sha256 and photo.sha256 != sha:
                bad.append(
                    f"photo {pid}: the store's content hash {photo.sha256[:12]} is not the file's "
                    f"{sha[:12]} ({at})"
                )

    # -- intents: per item, per photo ----------------------------------------------------------
    applied_at: dict[int, int] = {}  # intent id -> cursor of its intent_applied event
    for e in records:
        if e.type == "intent_applied" and e.detail and "intent" in e.detail:
            applied_at.setdefault(int(e.detail["intent"]), e.cursor)
    by_item: dict[int, list[IntentFact]] = defaultdict(list)
    for i in intents:
        by_item[i.item_id].append(i)
    unsettled_items: set[int] = set()
    for i in intents:
        item = items.get(i.item_id)
        if i.state != "recorded" or item is None:
            continue
        unsettled_items.add(i.item_id)
        if item.state in TERMINAL or item.state == "paused":
            bad.append(
                f"intent {i.id} ({i.kind} -> {i.target}) of item {i.item_id} (job {item.job_id}, "
                f"{item.lane}) is still "
                f"recorded but the item is {item.state}: an orphaned intent (staged file {i.staged}"
                f"{' still on disk' if Path(i.staged).exists() else ''})"
            )
    for lock in locks:
        item = items.get(lock.item_id)
        state = item.state if item else "unknown"
        if state != "running" and lock.item_id not in unsettled_items:
            bad.append(
                f"photo {lock.photo_id}: lock ({lock.mode}) leaked by item {lock.item_id} ({state}), "
                "which is not "
                "running and owns no unsettled intent"
            )

    shifts: dict[int, timedelta] = defaultdict(timedelta)
    edited: set[int] = set()  # photos an exif edit applied to
    all_keywords: dict[int, list[tuple[int, list[str]]]] = defaultdict(list)  # photo -> (item, kws)
    shift_items: dict[int, list[int]] = defaultdict(list)
    last_keywords: dict[int, tuple[int, list[str], int]] = {}  # photo -> (cursor, keywords, item)
    for item in items.values():
        if item.lane != "exif" or item.photo_id not in baseline:
            continue
        p = params.get(item.job_id, {})
        if p.get("undo.job") is not None:  # an undo's restores: from the effect log, below
            continue
        # one edit is one unit: the photo's own intent (photo_id set) and its sidecar's (a companion,
        # photo_id None); a raw's edit is its sidecar's alone
        applied = [i for i in by_item.get(item.id, []) if i.state == "applied"]
        applied = [i for i in applied if i.photo_id is not None] or applied
        if len(applied) > 1:
            bad.append(
                f"item {item.id} (job {item.job_id}, exif): {len(applied)} applied edits, at most one allowed"
            )
        if item.state == "succeeded" and not applied:
            bad.append(f"item {item.id} (job {item.job_id}, exif): succeeded without an applied edit")
        if not applied:
            continue
        rep.counts["exif_edits_applied"] += 1
        edited.add(item.photo_id)
        if p.get("exif.shift"):
            shifts[item.photo_id] += parse_shift(str(p["exif.shift"])) * len(applied)
            shift_items[item.photo_id].append(item.id)
        if p.get("exif.keywords") is not None:
            cursor = max(applied_at.get(i.id, 0) for i in applied)
            if item.photo_id not in last_keywords or cursor > last_keywords[item.photo_id][0]:
                wanted = p["exif.keywords"]  # normalised to a list at submission; a raw "a,b" too
                listed = wanted if isinstance(wanted, list) else str(wanted).split(",")
                last_keywords[item.photo_id] = (
                    cursor,
                    [str(k).strip() for k in listed if str(k).strip()],
                    item.id,
                )
            wanted = p["exif.keywords"]
            listed = wanted if isinstance(wanted, list) else str(wanted).split(",")
            all_keywords[item.photo_id].append((item.id, [str(k).strip() for k in listed if str(k).strip()]))

    _account_undos(bad, rep, logged, params, baseline, shifts, shift_items, edited)

    # -- metadata ---------------------------------------------------------------------------------
    sidecar_at = _check_sidecars(
        bad, current, baseline, sidecar_files, edited, found={pid: [*w] for pid, w in found.items()}
    )
    tags = read_tags([*current.values(), *sidecar_at.values()])
    for pid, side in sorted(sidecar_at.items()):
        _check_sidecar_content(
            bad, rep, pid, side, baseline[pid], tags.get(str(side), {}), shifts.get(pid, timedelta()),
            shift_items.get(pid, []), all_keywords.get(pid, []),
        )  # fmt: skip
    for pid, at in sorted(current.items()):
        base, now = baseline[pid], tags.get(str(at), {})
        taken = now.get(TAKEN_TAG)
        delta = shifts.get(pid, timedelta()) if not base.raw else timedelta()  # a raw's shift: its sidecar
        if base.taken is None:
            if taken is not None:
                bad.append(f"photo {pid} ({at}): was undated, now has DateTimeOriginal {taken}")
        else:
            want = (datetime.strptime(base.taken, EXIF_FORMAT) + delta).strftime(EXIF_FORMAT)
            if taken != want:
                try:
                    landed = datetime.strptime(str(taken), EXIF_FORMAT) - datetime.strptime(
                        base.taken, EXIF_FORMAT
                    )
                    how = f"the shifts landed {landed} in all"
                except ValueError:
                    how = "unreadable"
                bad.append(
                    f"photo {pid} ({at}): DateTimeOriginal {taken}, expected {want} = {base.taken} + {delta} "
                    "from "
                    f"{len(shift_items.get(pid, []))} applied shift edit(s) "
                    f"(items {shift_items.get(pid, [])}); {how}"
                )
            elif delta:
                rep.counts["shifts_verified"] += 1
        if pid in last_keywords and not base.raw:  # a raw's keywords: its sidecar
            _, want_kw, item_id = last_keywords[pid]
            seen = {tag: _keywords(now.get(tag)) for tag in KEYWORD_TAGS}
            if not any(set(want_kw) <= set(v) for v in seen.values()):
                bad.append(
                    f"photo {pid} ({at}): keywords {want_kw} of item {item_id} not visible as "
                    f"{' or '.join(KEYWORD_TAGS)} (found {seen}; XPKeywords {now.get('IFD0:XPKeywords')!r})"
                )
            else:
                rep.counts["keywords_verified"] += 1
        for tag in WATCHED_TAGS:
            if base.tags.get(tag) != now.get(tag):
                bad.append(
                    f"photo {pid} ({at}): untouched tag {tag} changed: "
                    f"{base.tags.get(tag)!r} -> {now.get(tag)!r}"
                )
        last = _last_effect(logged, pid)
        if last is not None and sha256_file(at) != last.after_sha256:
            bad.append(
                f"photo {pid} ({at}): its content is not what its last effect left (effect {last.id}, "
                f"job {last.job_id} {last.kind}: {(last.after_sha256 or '')[:12]}), neither the last job's "
                "result nor the photo as it was before an undone job"
            )
        mtime = at.stat().st_mtime_ns
        if abs(mtime - base.mtime_ns) >= 1_000_000_000:  # whole seconds: exiftool -P keeps those
            bad.append(f"photo {pid} ({at}): file modification time changed ({base.mtime_ns} -> {mtime})")

    # -- uploads ----------------------------------------------------------------------------------
    for f in _walk(uploads):
        if is_staged_name(f.name) or f.name.endswith(".tmp"):
            bad.append(f"staged/temp file left behind: {f}")
            continue
        if is_sidecar(f):
            rep.counts["upload_sidecars"] += 1
            continue
        rep.counts["upload_files"] += 1
        if by_pixels.get(content_key(f, f.name) or "") is None:
            bad.append(f"uploaded file {f} holds none of the photos' pixels")
    for item in items.values():
        if item.lane != "upload" or item.state != "succeeded" or item.photo_id not in baseline:
            continue
        res = item.result or {}
        loc, sha = res.get("location") or res.get("target"), res.get("sha256")  # target: recovered
        if not loc or not Path(loc).is_file():
            bad.append(f"item {item.id} (upload): its upload {loc} is missing")
            continue
        if sha and sha256_file(loc) != sha:
            bad.append(f"item {item.id} (upload): {loc} does not hold the bytes it uploaded ({sha[:12]})")
        if content_key(Path(loc), loc) != baseline[item.photo_id].pixels:
            bad.append(f"item {item.id} (upload): {loc} does not hold photo {item.photo_id}'s pixels")
        for side in res.get("sidecars") or []:  # a raw's sidecars went with it
            if not Path(side).is_file() or not is_sidecar(side):
                bad.append(f"item {item.id} (upload): the sidecar {side} it uploaded with {loc} is missing")
            else:
                rep.counts["upload_sidecars_verified"] += 1
        rep.counts["uploads_verified"] += 1

    # -- bundles ------------------------------------------------------------------------------------
    bundle_paths = {str(b) for b in bundles}
    for item in items.values():
        if item.lane != "archive" or item.photo_id is not None or item.state != "succeeded":
            continue
        res = item.result or {}
        where = res.get("bundle") or res.get("target")  # target: a bundle recovered by a later attempt
        if not where:
            continue
        if where not in bundle_paths:
            bad.append(f"item {item.id} (bundle): {where} is missing")
            continue
        bundle_paths.discard(where)
        try:
            with zipfile.ZipFile(where) as z:
                members = [n for n in z.namelist() if n != "MANIFEST.json" and not is_sidecar(n)]
                for name in members:
                    pid = int(name.split("_", 1)[0])
                    if pid not in baseline or content_key(z.read(name), name) != baseline[pid].pixels:
                        bad.append(
                            f"item {item.id} (bundle): member {name} does not hold photo {pid}'s pixels"
                        )
        except (zipfile.BadZipFile, ValueError) as exc:
            bad.append(f"item {item.id} (bundle): {where} is not a readable bundle: {exc}")
            continue
        if "photos" in res and len(members) != res["photos"]:
            bad.append(
                f"item {item.id} (bundle): {len(members)} members, its result says {res.get('photos')}"
            )
        rep.counts["bundles_verified"] += 1
    published = {i.target for i in intents if i.state == "applied"}
    for leftover in sorted(bundle_paths - published):
        bad.append(f"bundle {leftover} belongs to no succeeded bundle item and no applied intent")
    return rep


def _account_undos(
    bad: list[str],
    rep: FileReport,
    logged: Sequence[PhotoEffect],
    params: Mapping[int, Mapping[str, Any]],
    baseline: Mapping[int, Baseline],
    shifts: dict[int, timedelta],
    shift_items: dict[int, list[int]],
    edited: set[int],
) -> None:
    """Undo jobs (issue 31) in the model, from the effect log: an undo's restore takes back what the
    effect it reverses did (its time shift, its edit), a redo puts it back. A photo whose edits are
    all undone has none: a raw's sidecar that an undone edit created is gone with it."""
    by_id = {e.id: e for e in logged}

    def undo_of(e: PhotoEffect) -> bool:
        return params.get(e.job_id, {}).get("undo.job") is not None

    def shift_of(e: PhotoEffect) -> timedelta:
        if e.undoes is not None:
            undone = by_id.get(e.undoes)
            return -shift_of(undone) if undone is not None else timedelta()
        shift = params.get(e.job_id, {}).get("exif.shift")
        return parse_shift(str(shift)) if e.lane == "exif" and shift else timedelta()

    def edits_of(e: PhotoEffect) -> int:
        if e.undoes is not None:
            undone = by_id.get(e.undoes)
            return -edits_of(undone) if undone is not None else 0
        return 1 if e.lane == "exif" else 0

    net: dict[int, int] = defaultdict(int)
    touched: set[int] = set()
    for e in logged:
        if e.lane != "exif" or e.photo_id not in baseline:
            continue
        net[e.photo_id] += edits_of(e)
        if undo_of(e):
            if e.undoes is None:
                bad.append(f"effect {e.id} of undo job {e.job_id} names no effect it undoes")
                continue
            touched.add(e.photo_id)
            shifts[e.photo_id] += shift_of(e)
            shift_items[e.photo_id].append(e.item_id)
            rep.counts["undo_restores"] += 1
    for e in logged:
        if undo_of(e) and e.lane in ("rename", "archive") and not e.sidecar:
            rep.counts["undo_moves"] += 1
    for pid in touched:
        if net[pid] <= 0:
            edited.discard(pid)


def _last_effect(logged: Sequence[PhotoEffect], pid: int) -> PhotoEffect | None:
    """The photo's own newest effect (a replace or a move of the photo, not a sidecar or a copy)."""
    mine = [e for e in logged if e.photo_id == pid and not e.sidecar and e.effect in ("replace", "move")]
    return mine[-1] if mine else None


def _check_sidecars(
    bad: list[str],
    current: Mapping[int, Path],
    baseline: Mapping[int, Baseline],
    sidecar_files: Sequence[Path],
    edited: set[int],
    found: Mapping[int, list[Path]],
) -> dict[int, Path]:
    """Each raw's sidecar next to it under its matching name, and no sidecar anywhere else (an orphan
    left at an old location); returns {photo: its sidecar} to check the content of."""
    on_disk = {(f.parent, f.name.casefold()): f for f in sidecar_files}
    claimed: set[Path] = set()
    out: dict[int, Path] = {}
    for pid, at in sorted(current.items()):
        base = baseline[pid]
        kind = "raw" if base.raw else "photo"
        if not base.raw and base.sidecar is None:
            # a photo that is not a raw and had no sidecar has none after the run (none is made)
            continue
        name = f"{at.stem}.xmp" if base.sidecar == "stem" else f"{at.name}.xmp"
        want = base.sidecar is not None or pid in edited
        got = on_disk.get((at.parent, name.casefold()))
        other_name = f"{at.name}.xmp" if base.sidecar == "stem" else f"{at.stem}.xmp"
        other = on_disk.get((at.parent, other_name.casefold()))
        if other is not None and other != got:
            claimed.add(other)
            bad.append(f"{kind} {pid} ({at}): sidecar {other.name} beside it, expected only {name}")
        if got is not None:
            claimed.add(got)
            if want:
                out[pid] = got
            else:
                bad.append(f"{kind} {pid} ({at}): sidecar {got.name} appeared but no exif edit of it applied")
        elif want:
            stem = Path(base.path).stem.casefold()
            elsewhere = [str(f) for f in sidecar_files if f.name.casefold().startswith(stem)]
            bad.append(
                f"{kind} {pid} ({at}): sidecar missing, expected {at.parent / name} "
                f"(it {'existed before the run' if base.sidecar else 'got an applied exif edit'}; "
                f"sidecars named like its original: {elsewhere})"
            )
    owners = {w.parent / w.name for ws in found.values() for w in ws}
    for f in sidecar_files:
        if f not in claimed:
            near = [str(o) for o in owners if o.parent == f.parent and f.name.startswith(o.stem)]
            bad.append(f"orphan sidecar {f}: next to no photo at its store path (photos beside it: {near})")
    return out


def _check_sidecar_content(
    bad: list[str],
    rep: FileReport,
    pid: int,
    side: Path,
    base: Baseline,
    now: Mapping[str, Any],
    delta: timedelta,
    shift_items: Sequence[int],
    keyword_edits: Sequence[tuple[int, list[str]]],
) -> None:
    """A raw's sidecar: each applied shift once, each applied keyword once, its editor's content kept.
    Another photo's (a JPEG's): its editor's content kept, no keyword twice (what an edit of the
    photo writes into it is the metadata lanes' to check)."""
    if not base.raw:
        listed = _keywords(now.get(SIDECAR_KEYWORDS))
        if len(set(listed)) != len(listed):
            bad.append(f"photo {pid}: sidecar {side} lists a keyword more than once ({listed})")
        for tag in SIDECAR_KEPT:
            if base.sidecar_tags.get(tag) != now.get(tag):
                bad.append(
                    f"photo {pid}: sidecar {side} lost its own content: {tag} "
                    f"{base.sidecar_tags.get(tag)!r} -> {now.get(tag)!r}"
                )
        rep.counts["photo_sidecars_verified"] += 1
        return
    taken = now.get(SIDECAR_TAKEN)
    if delta and base.taken is not None:
        want = (datetime.strptime(base.taken, EXIF_FORMAT) + delta).strftime(EXIF_FORMAT)
        if str(taken)[:19] != want:
            bad.append(
                f"raw {pid}: sidecar {side} DateTimeOriginal {taken}, expected {want} = {base.taken} + "
                f"{delta} from {len(shift_items)} applied shift edit(s) (items {list(shift_items)})"
            )
        else:
            rep.counts["sidecar_shifts_verified"] += 1
    elif taken is not None:
        bad.append(f"raw {pid}: sidecar {side} has DateTimeOriginal {taken} but no shift of it applied")
    listed = _keywords(now.get(SIDECAR_KEYWORDS))
    twice = sorted(k for k, n in Counter(listed).items() if n > 1)
    if twice:
        bad.append(f"raw {pid}: sidecar {side} keyword(s) {twice} written more than once ({listed})")
    wanted = {k: item for item, kws in keyword_edits for k in kws}
    wanted.update({k: 0 for k in _keywords(base.sidecar_tags.get(SIDECAR_KEYWORDS))})
    lost = sorted(k for k in wanted if k not in listed)
    if lost:
        bad.append(
            f"raw {pid}: sidecar {side} keywords {lost} not in {SIDECAR_KEYWORDS} (items "
            f"{sorted({wanted[k] for k in lost})}, 0 = the sidecar's own; found {listed})"
        )
    elif keyword_edits:
        rep.counts["sidecar_keywords_verified"] += 1
    for tag in SIDECAR_KEPT:
        if base.sidecar_tags.get(tag) != now.get(tag):
            bad.append(
                f"raw {pid}: sidecar {side} lost its own content: {tag} "
                f"{base.sidecar_tags.get(tag)!r} -> {now.get(tag)!r}"
            )
    rep.counts["sidecars_verified"] += 1


def effects_recovered(records: Sequence[EventRecord]) -> Counter[str]:
    """Intents settled by another attempt than the one that recorded them, by settle event type."""
    recorded_by: dict[int, int | None] = {}
    out: Counter[str] = Counter()
    for e in records:
        intent = (e.detail or {}).get("intent")
        if intent is None or not e.type.startswith("intent_"):
            continue
        if e.type == "intent_recorded":
            recorded_by[int(intent)] = e.token
        elif int(intent) in recorded_by and e.token != recorded_by[int(intent)]:
            out[e.type] += 1
    return out
