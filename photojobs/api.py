"""The Python API for the web app and the CLI: submit, status, events, cancel, pause, resume, and the
inspection the web API needs: job and item pages, failures grouped by reason, retry, workers, prune.

Every bad-input error is a ``SubmissionError`` (``BacklogFull``, ``UnknownLane``, ``BadParameter``,
``OutsideRoots``); a control action that does not apply raises ``NotApplicable``."""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from photojobs.config import Settings
from photojobs.doorbell import ring_sweepers
from photojobs.history import photo_history, prune_history, submit_restore, submit_undo
from photojobs.roots import (
    OUTPUT_ROOTS_ENV,
    ROOTS_ENV,
    UPLOAD_TARGETS_ENV,
    NamedTarget,
    OutsideRoots,
    check_found,
    confine,
    confine_destination,
    parse_roots,
    parse_upload_targets,
)
from photos.containment import real_roots
from photos.errors import InvalidParameter
from photos.fileops import is_staged_name
from photos.formats import PHOTO_SUFFIXES
from photos.params import ALLOWED_ROOTS_KEY, SKIPPED_KEY, refuse_untrusted, validate_params
from photos.raw import is_raw
from photos.sidecar import is_sidecar, owner_of
from store import console as store_console
from store import control as store_control
from store import counters as store_counters
from store import events as store_events
from store import histograms as store_histograms
from store import idempotency as store_idempotency
from store import jobs as store_jobs
from store import lane_control as store_lane_control
from store import listing as store_listing
from store import retention as store_retention
from store import retry as store_retry
from store import waiting as store_waiting
from store.engine import make_engine, shortest_lease_ttl
from store.errors import BacklogFull, NotApplicable, SubmissionError, UnknownJob
from store.lanes import all_lanes, parse_lanes
from store.schema import upgrade

__all__ = [
    "BacklogFull",
    "BadParameter",
    "NotApplicable",
    "OutsideRoots",
    "SubmissionError",
    "UnknownJob",
    "UnknownLane",
    "Client",
    "collect_photos",
    "scan_photos",
]


class UnknownLane(SubmissionError):
    """A lane name that does not exist (or a lane given twice, or none)."""


class BadParameter(SubmissionError, InvalidParameter):
    """A job parameter that is unknown for the job's lanes or malformed."""


# Which job states each control action applies to (anything else: NotApplicable, HTTP 409): decided
# in ``store.control`` under the job's row lock, for this API and the CLI alike.
CONTROL_APPLIES = store_control.CONTROL_APPLIES


# Why a folder scan left a file out (the submission result's ``skipped`` counts these).
SKIP_NOT_PHOTO = "not a photo"
SKIP_HIDDEN = "hidden file"
SKIP_HIDDEN_FOLDER = "hidden folder"
SKIP_TEMP = "photojobs temp file"
SKIP_SIDECAR = "sidecar of a raw"
SKIP_PHOTO_SIDECAR = "sidecar of a photo"
SKIP_ORPHAN_SIDECAR = "sidecar without its photo"
SKIP_NOT_UTF8 = "name is not UTF-8"
SKIP_NOT_UTF8_FOLDER = "folder name is not UTF-8"


def not_utf8(name: str) -> bool:
    """The file system's name holds bytes that are not UTF-8 (Python surrogate-escaped them): it
    cannot be stored, shown or handed to a tool as text, so a scan leaves it out, saying so."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


@dataclass(frozen=True)
class Scan:
    """What :func:`scan_photos` found: the photos (as absolute path text, sorted as paths), their
    roots, and what it left out: counted by reason (``skipped``) and each file named (``left_out``:
    ``{"path", "reason"}``, path order; a hidden folder is named once, not its files)."""

    paths: list[str]
    roots: list[Path]
    skipped: dict[str, int]
    left_out: list[dict[str, str]] = field(default_factory=list)

    @property
    def photos(self) -> list[Path]:
        """The photos as ``Path`` objects (a million of them cost seconds: a submission uses ``paths``)."""
        return [Path(p) for p in self.paths]


def photo_roots(paths: Iterable[str | Path]) -> list[Path]:
    """The roots the given paths stand for: a folder itself, a file's folder (sorted, unique)."""
    roots = set()
    for raw in paths:
        p = Path(raw).expanduser()
        if not p.exists():
            raise SubmissionError(f"{raw}: no such file or folder")
        p = p.resolve()
        roots.add(p if p.is_dir() else p.parent)
    return sorted(roots)


def collect_photos(paths: Iterable[str | Path], *, any_file: bool = False) -> tuple[list[Path], list[Path]]:
    """:func:`scan_photos`' photos and roots (without what it left out)."""
    scan = scan_photos(paths, any_file=any_file)
    return scan.photos, scan.roots


def scan_photos(paths: Iterable[str | Path], *, any_file: bool = False) -> Scan:
    """Expand files and folders (recursively) into absolute photo paths, sorted, with their roots and
    a count of every file a folder scan left out, by reason (nothing is skipped silently).

    Folders contribute files with a photo suffix, camera raws included (or every file with
    ``any_file``); a file named explicitly is always taken. A path that does not exist raises
    ``SubmissionError``, as does a path whose name is not UTF-8. Left out: names that are not
    UTF-8 (:func:`not_utf8`), hidden files and folders (a hidden folder counts once),
    photojobs' own temp files, XMP sidecars (part of their raw's unit: they move with it) and
    every other file ("not a photo").
    """
    paths = list(paths)
    roots = photo_roots(paths)
    photos: list[str] = []  # path text: a Path object per file costs more than the walk itself
    skipped: dict[str, int] = {}
    left_out: list[dict[str, str]] = []

    def skip(reason: str, *paths: Path) -> None:
        skipped[reason] = skipped.get(reason, 0) + len(paths)
        # a name that is not UTF-8 is shown with its bytes escaped (b"bad\\xffname.jpg"), never raw
        left_out.extend({"path": _as_text(path), "reason": reason} for path in paths)

    for raw in paths:
        p = Path(raw).expanduser().resolve()
        if not_utf8(str(p)):
            raise SubmissionError(
                f"{os.fsencode(p)!r}: the name is not UTF-8; photojobs keeps names as text (rename it)"
            )
        if not p.is_dir():
            photos.append(str(p))
            continue
        for dirpath, dirnames, filenames in os.walk(p):
            hidden = sorted(d for d in dirnames if d.startswith("."))
            if hidden:
                skip(SKIP_HIDDEN_FOLDER, *(Path(dirpath) / d for d in hidden))
            undecodable = [d for d in dirnames if not_utf8(d) and not d.startswith(".")]
            if undecodable:
                skip(SKIP_NOT_UTF8_FOLDER, *(Path(dirpath) / d for d in undecodable))
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not not_utf8(d))
            folded = {n.casefold() for n in filenames}
            for name in sorted(filenames):
                if not_utf8(name):
                    skip(SKIP_NOT_UTF8, Path(dirpath) / name)
                elif is_staged_name(name):
                    skip(SKIP_TEMP, Path(dirpath) / name)
                elif name.startswith("."):
                    skip(SKIP_HIDDEN, Path(dirpath) / name)
                elif any_file or os.path.splitext(name)[1].lower() in PHOTO_SUFFIXES:
                    photos.append(os.path.join(dirpath, name))
                elif is_sidecar(f := Path(dirpath) / name):
                    skip(_sidecar_reason(owner_of(f, folded)), f)
                else:
                    skip(SKIP_NOT_PHOTO, Path(dirpath) / name)
    # Path order (component by component, as sorting Path objects) without the objects: no name holds
    # a NUL, which sorts before every other character, so it stands for the separator.
    unique = sorted(set(photos), key=_path_order)
    named = sorted({(e["path"], e["reason"]) for e in left_out})
    return Scan(unique, roots, dict(sorted(skipped.items())), [{"path": p, "reason": r} for p, r in named])


def _as_text(path: Path) -> str:
    """``path`` as text: its bytes that are not UTF-8 written as ``\\xNN`` escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _path_order(path: str) -> str:
    return path.replace("/", "\0")


def skipped_text(skipped: Mapping[str, int]) -> str:
    """``{"not a photo": 3, "hidden file": 1}`` -> ``"3 not a photo, 1 hidden file"``."""
    return ", ".join(f"{n} {reason}" for reason, n in skipped.items())


def left_out_lines(left_out: Sequence[Mapping[str, str]], limit: int | None = None) -> list[str]:
    """``"  PATH: REASON"`` per file a scan left out (the first ``limit``, then how many more)."""
    shown = left_out if limit is None else left_out[:limit]
    lines = [f"  {e['path']}: {e['reason']}" for e in shown]
    if len(shown) < len(left_out):
        lines.append(f"  … and {len(left_out) - len(shown)} more (--json names every one)")
    return lines


def _sidecar_reason(owner: str | None) -> str:
    if owner is None:
        return SKIP_ORPHAN_SIDECAR
    if is_raw(owner):
        return SKIP_SIDECAR
    return SKIP_PHOTO_SIDECAR if Path(owner).suffix.lower() in PHOTO_SUFFIXES else SKIP_NOT_PHOTO


@dataclass(frozen=True)
class SubmittedJob(store_jobs.Submitted):
    """``store.jobs.Submitted`` plus what the folder scan left out, by reason and file by file."""

    skipped: dict[str, int] = field(default_factory=dict)
    left_out: list[dict[str, str]] = field(default_factory=list)
    replayed: bool = False  # answered from an earlier request with the same idempotency key
    broker_reached: bool = True  # False: Redis did not answer; the job waits in the store for it

    def as_dict(self) -> dict[str, Any]:
        """The submission's answer (``POST /api/jobs``, ``submit --json``)."""
        out: dict[str, Any] = {"job": self.job_id, "items": self.items, "skipped": self.skipped}
        out["left_out"] = self.left_out
        if self.replayed:
            out["replayed"] = True
        return out


def submit_request(
    lanes: str | Sequence[str],
    paths: Iterable[str | Path],
    params: Mapping[str, Any] | None,
    priority: str | None,
) -> dict[str, Any]:
    """A submission's request as its idempotency key's hash covers it: what was asked, as given."""
    names = [n.strip() for n in (lanes.split(",") if isinstance(lanes, str) else lanes) if n.strip()]
    return {
        "lanes": names,
        "paths": [str(p) for p in paths],
        "params": dict(params or {}),
        "priority": priority,
    }


@dataclass(frozen=True)
class Plan:
    lanes: list[str]
    params: dict[str, Any]
    photos: list[store_jobs.PhotoInput]
    roots: list[str]
    fingerprint: str
    skipped: dict[str, int] = field(default_factory=dict)  # what the folder scan left out, by reason
    left_out: list[dict[str, str]] = field(default_factory=list)  # and each file it left out, named


class Client:
    """photojobs as a library: ``Client().submit(["analysis"], ["/photos"])`` returns a job id at once."""

    def __init__(
        self, settings: Settings | None = None, engine: Engine | None = None, *, migrate: bool = True
    ):
        self.settings = settings or Settings.from_env()
        self.engine = engine or make_engine(self.settings.database_url)
        self.specs = all_lanes(self.settings.env)
        if migrate:
            upgrade(self.engine)

    def plan(
        self,
        lanes: str | Sequence[str],
        paths: Iterable[str | Path],
        params: Mapping[str, Any] | None = None,
        *,
        allowed_roots: Sequence[str | Path] | None = None,
        output_roots: Sequence[str | Path] | None = None,
        untrusted: bool = False,
        diagnostics: bool = False,
    ) -> Plan:
        """Check a job before submitting it: lanes, parameters (with defaults filled in), photos, roots.

        With ``allowed_roots`` (the web API's photo roots) every path, and every file found under
        it, must lie inside one of them (``OutsideRoots`` otherwise); relative paths are taken
        relative to the first root. When photo or output roots are known (these arguments, else
        ``PHOTOJOBS_PHOTO_ROOTS`` / ``PHOTOJOBS_OUTPUT_ROOTS`` in the settings' environment) every
        local destination, defaults included, must resolve inside one of them too, and the job
        records them for the workers' check at the moment of use. ``untrusted`` (the web API)
        refuses an S3 endpoint, a raw ``s3://`` target and, unless ``diagnostics``, the noop lane's
        fault parameters. ``upload.target_name`` picks a target from ``PHOTOJOBS_UPLOAD_TARGETS``.
        """
        names, clean, named = self.check_job(lanes, params, untrusted=untrusted, diagnostics=diagnostics)
        paths_list = [str(p) for p in paths]
        if allowed_roots is not None:
            paths_list = confine(paths_list, [Path(r) for r in allowed_roots])
        scan = scan_photos(paths_list, any_file=names == ["noop"])
        roots = scan.roots
        if allowed_roots is not None:
            check_found(scan.photos, [Path(r) for r in allowed_roots])
        allowed = self.confine_job(
            names, clean, named, roots, allowed_roots=allowed_roots, output_roots=output_roots
        )
        inputs = [_photo_input(p) for p in scan.paths]
        # "The same job" is the same command: the paths as given (resolved), lanes and params; not the
        # files found, since a rename or archive moves them out of the way.
        given = [str(Path(p).expanduser().resolve()) for p in paths_list]
        fingerprint = store_jobs.job_fingerprint(names, given, clean)
        if allowed is not None:
            clean[ALLOWED_ROOTS_KEY] = allowed
        if scan.skipped:
            clean[SKIPPED_KEY] = dict(scan.skipped)
        return Plan(names, clean, inputs, [str(r) for r in roots], fingerprint, scan.skipped, scan.left_out)

    def check_job(
        self,
        lanes: str | Sequence[str],
        params: Mapping[str, Any] | None,
        *,
        untrusted: bool = False,
        diagnostics: bool = False,
    ) -> tuple[list[str], dict[str, Any], dict[str, NamedTarget]]:
        """A job's lanes and parameters checked (:meth:`plan`'s first step, also ``sync``'s): the
        lane names, the parameters parsed (a named upload target filled in) and the operator's
        named targets. ``UnknownLane``, ``BadParameter``."""
        try:
            names = parse_lanes(list(lanes) if not isinstance(lanes, str) else lanes)
        except ValueError as exc:
            raise UnknownLane(str(exc)) from None
        if not isinstance(params, Mapping | None):
            raise BadParameter("parameters must be an object of KEY: VALUE")
        try:
            clean = validate_params(names, dict(params or {}))
            if untrusted:
                refuse_untrusted(clean, diagnostics=diagnostics)
        except InvalidParameter as exc:
            raise BadParameter(str(exc)) from None
        named = parse_upload_targets(self.settings.env.get(UPLOAD_TARGETS_ENV))
        _pick_named_target(clean, named)
        return names, clean, named

    def confine_job(
        self,
        names: Sequence[str],
        clean: dict[str, Any],
        named: Mapping[str, NamedTarget],
        roots: Sequence[Path],
        *,
        allowed_roots: Sequence[str | Path] | None = None,
        output_roots: Sequence[str | Path] | None = None,
    ) -> list[str] | None:
        """Fill in the default destinations (from the first of ``roots``) and, when photo or output
        roots are known, check every local destination against them (``OutsideRoots``); returns
        the real folders the job may use (recorded as ``job.allowed_roots``), None unconfined."""
        given_keys = set(clean)
        if roots:
            base = roots[0]
            if "upload" in names:
                clean.setdefault("upload.target", f"{base}-uploads")
            if "archive" in names:
                clean.setdefault("archive.root", f"{base}-archive")
                clean.setdefault("archive.bundle", "none")
        env = self.settings.env
        dest_roots = (
            [Path(r) for r in allowed_roots] if allowed_roots is not None else parse_roots(env.get(ROOTS_ENV))
        )
        out_roots = (
            [Path(r) for r in output_roots]
            if output_roots is not None
            else parse_roots(env.get(OUTPUT_ROOTS_ENV))
        )
        if not (allowed_roots is not None or dest_roots or out_roots):
            return None
        _confine_destinations(clean, given_keys, dest_roots, [*out_roots, *_local_targets(named)])
        return sorted({str(r) for r in real_roots([*dest_roots, *out_roots, *_local_targets(named)])})

    def submit(
        self,
        lanes: str | Sequence[str],
        paths: Iterable[str | Path],
        params: Mapping[str, Any] | None = None,
        *,
        plan: Plan | None = None,
        priority: str | None = None,
        idempotency_key: str | store_idempotency.Idempotency | None = None,
    ) -> SubmittedJob:
        """Write the job, its photos and items (in short chunks; see ``store.jobs.submit``) and return
        its id, counts and what the folder scan left out (``skipped``, by reason); raise
        ``BacklogFull`` past a bound, before anything is written. ``priority``: "interactive" (goes
        before the lanes' backlog: a user waiting for an upload), "normal", or None: interactive when
        it has at most ``PHOTOJOBS_INTERACTIVE_PHOTOS`` (16) photos.

        ``idempotency_key``: a retry with the same key and the same request (lanes, paths, params,
        priority as given) answers the first job (``replayed``) and writes nothing; the same key with
        another request raises ``store.idempotency.KeyReused``. The key is recorded in the
        transaction that creates the job and kept ``PHOTOJOBS_IDEMPOTENCY_KEEP``."""
        idem = idempotency_key
        if isinstance(idem, str):
            idem = store_idempotency.make("jobs", idem, submit_request(lanes, paths, params, priority))
        if idem is not None:
            earlier = self.earlier_submission(idem)
            if earlier is not None:
                return earlier
        plan = plan or self.plan(lanes, paths, params)
        try:
            submitted = store_jobs.submit(
                self.engine,
                [self.specs[n] for n in plan.lanes],
                plan.photos,
                params=plan.params,
                roots=plan.roots,
                fingerprint=plan.fingerprint,
                bundle_lanes=["archive"] if plan.params.get("archive.bundle", "none") != "none" else [],
                priority=priority,
                idempotency=idem,
            )
        except store_idempotency.Replay as earlier:
            return _replayed(earlier)
        rung = ring_sweepers(self.settings.redis_url)  # dispatched now, not at the next sweep pass
        done = SubmittedJob(
            submitted.job_id, submitted.items, submitted.photos, dict(plan.skipped), list(plan.left_out),
            broker_reached=rung,
        )  # fmt: skip
        if idem is not None and idem.scope == "jobs":
            answer = {"job": done.job_id, "items": done.items, "photos": done.photos, "skipped": done.skipped}
            store_idempotency.record_response(self.engine, idem, answer)
        return done

    def earlier_submission(self, idem: store_idempotency.Idempotency) -> SubmittedJob | None:
        """The answer of an earlier submission with this key and request (``replayed``), None if the
        key is new; ``KeyReused`` when it came with another request."""
        earlier = store_idempotency.look_up(self.engine, idem)
        return None if earlier is None else _replayed(earlier)

    def find_same_job(self, plan: Plan) -> int | None:
        """The newest job with the same paths, lanes and params (``photojobs run`` resumes it)."""
        return store_jobs.find_job_by_fingerprint(self.engine, plan.fingerprint)

    def sync(
        self,
        lanes: str | Sequence[str],
        paths: Iterable[str | Path],
        params: Mapping[str, Any] | None = None,
        *,
        outdated: bool = False,
        allowed_roots: Sequence[str | Path] | None = None,
        untrusted: bool = False,
        diagnostics: bool = False,
        priority: str | None = None,
        idempotency_key: str | None = None,
    ) -> Any:
        """Walk ``paths`` and submit one job for the photos that are new or changed since the store
        last saw them (``photojobs.sync``): a ``SyncReport`` (``as_dict()``: ``{"job", "new",
        "changed", "unchanged", "moved", "missing", …}``). ``outdated``: also each lane again where
        its recorded version differs. ``allowed_roots`` (the web API's photo roots): every path
        must lie inside them. ``SubmissionError`` (a path that does not exist), ``BacklogFull``.
        ``idempotency_key``: as ``submit``'s; a replay answers the first sync's report
        (``replayed``), ``KeyReused`` for another request."""
        from photojobs.sync import sync

        return sync(
            self, lanes, paths, params, outdated=outdated, allowed_roots=allowed_roots,
            untrusted=untrusted, diagnostics=diagnostics, priority=priority,
            idempotency_key=idempotency_key,
        )  # fmt: skip

    def status(self, job_id: int | None = None, *, why_waiting: bool = True) -> store_jobs.JobStatus:
        """The job's status (the newest job's when None); ``why_waiting``: with ``waiting``, why its
        items are not moving (``store.waiting``: lane paused, no live worker, backoff, photo locked,
        job paused), and ``waiting_for`` when nothing of it can move."""
        if job_id is None:
            jobs = store_jobs.list_jobs(self.engine, limit=1)
            if not jobs:
                raise UnknownJob(0)
            st = jobs[0]
        else:
            st = store_jobs.job_status(self.engine, job_id)
        if why_waiting:
            store_waiting.explain(self.engine, [st])
        return st

    def events(
        self, *, after: int = 0, job_id: int | None = None, limit: int = 1000
    ) -> list[store_events.EventRecord]:
        return store_events.read_events(self.engine, after=after, job_id=job_id, limit=limit)

    def latest_events(self, *, job_id: int | None = None, limit: int = 50) -> list[store_events.EventRecord]:
        """The newest ``limit`` events (of a job), oldest first; follow on from the last cursor."""
        return store_listing.latest_events(self.engine, job_id=job_id, limit=limit)

    def cancel(self, job_id: int) -> int:
        """Cancel the job; ``NotApplicable`` (``store.control.ControlRefused``) when it has finished."""
        return store_control.cancel(self.engine, job_id, lease_ttl=shortest_lease_ttl(self.settings.env))

    def pause(self, job_id: int) -> int:
        """Pause a running job; ``NotApplicable`` otherwise (a finished job stays finished)."""
        return store_control.pause(self.engine, job_id, lease_ttl=shortest_lease_ttl(self.settings.env))

    def resume(self, job_id: int) -> int:
        changed = store_control.resume(self.engine, job_id, lease_ttl=shortest_lease_ttl(self.settings.env))
        ring_sweepers(self.settings.redis_url)
        return changed

    def control(self, action: str, job_id: int) -> int:
        """``cancel``, ``pause`` or ``resume`` when it applies to the job's state, else ``NotApplicable``
        (e.g. resuming a cancelled job); returns how many items changed at once."""
        if action not in CONTROL_APPLIES:
            raise ValueError(f"unknown action {action!r}; actions: {', '.join(CONTROL_APPLIES)}")
        return int(getattr(self, action)(job_id))  # the store decides whether it applies

    def list_jobs(
        self, *, state: str | None = None, limit: int = 20, after: int | None = None
    ) -> tuple[list[store_jobs.JobStatus], int | None]:
        """Jobs, the moving ones first, each part newest first (newest first with a ``state``), a page
        of ``limit``; pass the returned cursor as ``after`` for the next."""
        jobs, nxt = store_console.find_jobs(self.engine, state=state, limit=limit, after=after)
        store_waiting.explain(self.engine, jobs)
        return jobs, nxt

    def items(
        self,
        job_id: int,
        *,
        state: str | None = None,
        lane: str | None = None,
        limit: int = 100,
        after: int | None = None,
    ) -> tuple[list[store_listing.ItemRow], int | None]:
        """A job's items in id order (filtered by state and lane), a page and the next cursor."""
        return store_listing.list_items(self.engine, job_id, state=state, lane=lane, limit=limit, after=after)

    def failures(self, job_id: int, examples: int = 3) -> list[store_listing.FailureGroup]:
        """The job's failed and skipped items grouped by lane and reason class, biggest group first."""
        self.status(job_id)  # UnknownJob
        return store_listing.failure_groups(self.engine, job_id, examples=examples)

    def retry(self, job_id: int, lane: str | None = None, items: Collection[int] | None = None) -> int:
        """Failed and cancelled items (of ``lane``; only ``items`` when given) back to work, with the
        later lanes they held up; returns how many items changed; ``NotApplicable`` when there is
        nothing to retry."""
        if lane is not None and lane not in self.specs:
            raise UnknownLane(f"unknown lane {lane}; lanes are: {', '.join(self.specs)}")
        changed = store_retry.retry(self.engine, job_id, lane, items)
        ring_sweepers(self.settings.redis_url)
        return changed

    def _known_lane(self, lane: str) -> None:
        if lane not in self.specs:
            raise UnknownLane(f"unknown lane {lane}; lanes are: {', '.join(self.specs)}")

    def pause_lane(self, lane: str, by: str = "api") -> bool:
        """Pause ``lane`` across all jobs (``store.lane_control``): nothing of it starts until it is
        resumed, running items finish. False when it was paused already."""
        self._known_lane(lane)
        return store_lane_control.pause_lane(self.engine, lane, by)

    def resume_lane(self, lane: str, by: str = "api") -> bool:
        """Resume a paused lane; False when it was not paused."""
        self._known_lane(lane)
        changed = store_lane_control.resume_lane(self.engine, lane, by)
        ring_sweepers(self.settings.redis_url)  # its pending items are dispatched now
        return changed

    def lanes(self) -> list[dict[str, Any]]:
        """Every lane, in declaration order: ``{"lane", "paused", "paused_at"}``."""
        paused = store_lane_control.paused_lanes(self.engine)
        return [{"lane": n, "paused": n in paused, "paused_at": paused.get(n)} for n in self.specs]

    # -- the console (store.console) ----------------------------------------------------------------
    def find_jobs(
        self,
        *,
        state: str | None = None,
        search: str | None = None,
        limit: int = 20,
        after: int | None = None,
    ) -> tuple[list[store_jobs.JobStatus], int | None]:
        """Jobs filtered by state (through an index) and a search (id, lane, parameter, photo path),
        running ones first (``store.console.find_jobs``); a page of ``limit`` and the cursor of the
        next (None at the end). A search is
        bounded by ``PHOTOJOBS_SEARCH_TIMEOUT`` (3 s): ``SearchTooCostly``, ``SearchBusy``."""
        timeout = float(self.settings.env.get("PHOTOJOBS_SEARCH_TIMEOUT") or store_console.SEARCH_TIMEOUT)
        jobs, nxt = store_console.find_jobs(
            self.engine, state=state, query=search, limit=limit, after=after, timeout=timeout
        )
        store_waiting.explain(self.engine, jobs)
        return jobs, nxt

    def job_times(self, status: store_jobs.JobStatus) -> store_console.JobTimes:
        """Created, started, finished, durations and an ETA from the work left (``store.eta``)."""
        return store_console.job_times(self.engine, status, self.specs)

    def etas(self, jobs: Sequence[store_jobs.JobStatus]) -> dict[int, float | None]:
        """The ETA of each running job of a listing that something can move (``job_times``), for
        the jobs list; the others are not asked (a finished, paused or waiting job has none)."""
        return {
            st.job_id: self.job_times(st).eta
            for st in jobs
            if st.state == "running" and not st.waiting_for
        }

    def failure_group(self, job_id: int, lane: str, state: str, reason: str) -> list[int]:
        """The item ids of one failure group (lane, state, reason class) of a job."""
        return store_console.group_items(self.engine, job_id, lane, state, reason)

    def discard(self, job_id: int, items: Collection[int]) -> int:
        """Give up on failed items (they become ``skipped``; a retry no longer picks them up);
        ``NotApplicable`` when none of them is failed."""
        return store_console.discard(self.engine, job_id, items)

    def item_history(self, job_id: int, item_id: int) -> dict[str, Any]:
        """An item with its attempts (worker, times, outcome, error, traceback) and its events."""
        return store_console.item_history(self.engine, job_id, item_id)

    def feed(
        self,
        *,
        job_id: int | None = None,
        item_id: int | None = None,
        types: Collection[str] = (),
        limit: int = 50,
        after: int | None = None,
    ) -> list[store_events.EventRecord]:
        """Events filtered by job, item and types: the next ``limit`` after a cursor, or the newest."""
        return store_console.feed(
            self.engine, job_id=job_id, item_id=item_id, types=types, limit=limit, after=after
        )

    def bulk(self, action: str, job_ids: Collection[int]) -> dict[str, int]:
        """``action`` (``retry`` failed items, ``cancel``, ``discard`` failed items) on each of
        ``job_ids``, one job at a time (each job's own transaction, as the single actions):
        ``{"jobs": changed jobs, "items": items changed, "skipped": jobs it did not apply to}``."""
        done = {"jobs": 0, "items": 0, "skipped": 0}
        for job_id in job_ids:
            try:
                if action == "cancel":
                    n = self.control("cancel", job_id)
                else:
                    failed = store_console.failed_items(self.engine, job_id)
                    if not failed:
                        done["skipped"] += 1
                        continue
                    n = (
                        self.retry(job_id, items=failed)
                        if action == "retry"
                        else self.discard(job_id, failed)
                    )
            except (NotApplicable, UnknownJob):
                done["skipped"] += 1
                continue
            done["jobs"] += 1
            done["items"] += n
        return done

    def lane_overview(self, *, window: float = 3600.0, bucket: float = 60.0) -> dict[str, Any]:
        """Every lane: pause state, queue depth by state, live workers serving it and items finished
        per ``bucket`` over the last ``window`` seconds (server-side, from the event log)."""
        depths = store_console.lane_depths(self.engine)
        start, series = store_console.lane_throughput(self.engine, window=window, bucket=bucket)
        entries = self.lanes()
        store_counters.fold(self.engine)  # the events so far in the histograms, as /metrics does
        times = store_histograms.lane_quantiles(
            store_counters.read(self.engine).histograms, [entry["lane"] for entry in entries]
        )
        workers = [w for w in self.workers() if w["state"] == "live"]
        n = max(1, int(window // bucket))
        lanes = []
        for entry in entries:
            name = entry["lane"]
            serving = [w for w in workers if name in w["lanes"]]
            counts = series.get(name, [0] * n)
            lanes.append(
                {
                    **entry,
                    "depth": _lane_depth(depths.get(name, {}), entry["paused"]),
                    # Per lane: the items each worker holds of it (leased, a batch's waiting ones
                    # too) and the threads running one of it now.
                    "workers": [
                        {
                            **{k: w[k] for k in ("id", "host", "pid", "threads")},
                            "held": w["held_by_lane"].get(name, 0),
                            "running": sum(1 for r in w["running"] if r["lane"] == name),
                        }
                        for w in serving
                    ],
                    "running_now": sum(1 for w in workers for r in w["running"] if r["lane"] == name),
                    "finished": counts,
                    "finished_total": sum(counts),
                    # an attempt's run time and queue wait, p50 and p95 in seconds, since the start
                    # (the counters' histograms, folded from the event log: store.histograms)
                    **times.get(name, {}),
                }
            )
        return {"start": start, "bucket": bucket, "window": window, "lanes": lanes}

    def workers(self) -> list[dict[str, Any]]:
        """Workers (``store.listing.workers``): host, pid, lanes, items held, last heartbeat, state
        (live, stale, stopped), idle ones included."""
        return store_listing.workers(self.engine)

    def prune(self, older_than: float | str) -> store_retention.Pruned:
        """Delete finished jobs and events older than ``older_than`` (seconds, or ``"30d"``), and the
        idempotency keys older than ``PHOTOJOBS_IDEMPOTENCY_KEEP``."""
        seconds = store_retention.parse_age(older_than) if isinstance(older_than, str) else older_than
        return store_retention.prune(self.engine, seconds, self.settings.idempotency_keep)

    # -- history and undo (issue 31; store.history, actors.undo) ------------------------------------
    def photo_history(
        self, photo: int | str, *, limit: int = 100, after: int | None = None
    ) -> dict[str, Any]:
        """``{"photo", "path", "history": [...], "next"}`` of a photo id or path (``UnknownPhoto``):
        ``limit`` entries (1-1000) oldest first after effect ``after``; ``next`` is the ``after`` of
        the next page, None on the last."""
        return photo_history(self.engine, photo, limit=limit, after=after)

    def undo(
        self,
        job_id: int,
        *,
        lane: str | None = None,
        uploads: bool = False,
        photos: Iterable[str] | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Submit the undo of ``job_id``: ``{"job": UNDO_JOB_ID, "items": N}``, or ``{"job": None,
        "items": 0, "note": why}`` when nothing of it is in effect (``UnknownJob``, ``ValueError``).
        ``photos``: only these photos (their current paths; ``NotInJob``, a ``ValueError``, names a
        path that is none of the job's). ``dry_run``: ``{"dry_run": True, "job": None, "plan":
        [{"path", "action": "restore"|"refuse", "reason"}, …]}``, nothing changed or submitted."""
        return submit_undo(self, job_id, lane=lane, uploads=uploads, photos=photos, dry_run=dry_run)

    def restore(
        self, photo: int | str, *, to_effect: int | None = None, before_job: int | None = None
    ) -> dict[str, Any]:
        """Bring back a kept version of a photo changed since (by hand, on purpose): the version
        effect ``to_effect`` left, or the one before job ``before_job``. A job of one item:
        ``{"job", "items", "sha256", "version"}``; the version it replaces is kept (``undo`` the job
        to go back). ``UnknownPhoto``; ``ValueError`` naming why not (a version not kept …)."""
        return submit_restore(self, photo, to_effect=to_effect, before_job=before_job)

    def prune_history(self, keep: float | str | None = None) -> int:
        """Remove displaced originals kept longer than ``keep`` (``PHOTOJOBS_HISTORY_KEEP``, 30d)."""
        return prune_history(self, keep)

    def destinations(self, status: store_jobs.JobStatus) -> dict[str, str]:
        """Where the job's files go (upload target, archive root), from its parameters."""
        keys = {"upload": "upload.target", "archive": "archive.root"}
        return {lane: str(status.params[k]) for lane, k in keys.items() if k in status.params}


# Local destinations a job may name; each must resolve inside the photo or output roots when confined.
DESTINATIONS = ("upload.target", "archive.root")


def _replayed(earlier: store_idempotency.Replay) -> SubmittedJob:
    """The answer of an earlier submission with the same key (its job; its counts once it landed)."""
    answer = earlier.response or {}
    job_id = earlier.job_id if earlier.job_id is not None else -1
    skipped = dict(answer.get("skipped") or {})
    return SubmittedJob(job_id, int(answer.get("items", 0)), int(answer.get("photos", 0)), skipped, [], True)


def _pick_named_target(clean: dict[str, Any], named: Mapping[str, NamedTarget]) -> None:
    """``upload.target_name`` -> the operator's ``upload.target`` (and ``upload.endpoint``)."""
    name = clean.get("upload.target_name")
    if name is None:
        return
    if name not in named:
        listing = ", ".join(sorted(named)) or f"none are configured ({UPLOAD_TARGETS_ENV} is empty)"
        raise BadParameter(
            f"parameter upload.target_name={name!r}: no such upload target; targets: {listing}"
        )
    clean["upload.target"] = named[name].target
    if named[name].endpoint:
        clean["upload.endpoint"] = named[name].endpoint


def _local_targets(named: Mapping[str, NamedTarget]) -> list[Path]:
    """The operator's named local upload folders (allowed destinations, whatever the roots)."""
    return [Path(t.target).expanduser().absolute() for t in named.values() if "://" not in t.target]


def _confine_destinations(
    clean: dict[str, Any], given: set[str], photo_roots: list[Path], output_roots: list[Path]
) -> None:
    for key in DESTINATIONS:
        value = clean.get(key)
        if isinstance(value, str) and "://" not in value:
            clean[key] = confine_destination(key, value, photo_roots, output_roots, default=key not in given)


def _lane_depth(counts: dict[str, int], lane_paused: bool) -> dict[str, int]:
    """A lane's items not finished, by state; ``paused`` also counts the pending and queued items a
    paused lane holds (they stay ``pending``, but nothing of them moves until the lane resumes)."""
    depth = {st: counts.get(st, 0) for st in store_console.DEPTH_STATES}
    if lane_paused:
        depth["paused"] = depth.get("paused", 0) + depth.get("pending", 0) + depth.get("queued", 0)
    return depth


def _photo_input(path: str) -> store_jobs.PhotoInput:
    """The photo with its size and modification time at submission (rename's fallback time)."""
    try:
        st = os.stat(path)
    except OSError:
        return store_jobs.PhotoInput(path)
    return store_jobs.PhotoInput(path, st.st_size, st.st_mtime)
