"""The Python API for the web app and the CLI: submit, status, events, cancel, pause, resume."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from photojobs.config import Settings
from photojobs.lanes import all_lanes, parse_lanes
from photojobs.params import validate_params
from store import events as store_events
from store import jobs as store_jobs
from store.engine import make_engine
from store.errors import BacklogFull, SubmissionError, UnknownJob
from store.schema import upgrade

__all__ = [
    "BacklogFull",
    "SubmissionError",
    "UnknownJob",
    "Client",
    "collect_photos",
]

PHOTO_SUFFIXES = {".jpg", ".jpeg", ".png", ".tif", ".tiff", ".heic", ".heif", ".webp"}


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
    """Expand files and folders (recursively) into absolute photo paths, sorted; also return the roots.

    Folders contribute files with a photo suffix (or every file with ``any_file``); a file named
    explicitly is always taken. A path that does not exist raises ``SubmissionError``. Hidden files
    and photojobs' own temp files are left out.
    """
    paths = list(paths)
    roots = photo_roots(paths)
    photos: list[Path] = []
    for raw in paths:
        p = Path(raw).expanduser().resolve()
        if p.is_dir():
            for dirpath, dirnames, filenames in os.walk(p):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
                for name in sorted(filenames):
                    if name.startswith("."):
                        continue
                    f = Path(dirpath) / name
                    if any_file or f.suffix.lower() in PHOTO_SUFFIXES:
                        photos.append(f)
        else:
            photos.append(p)
    return sorted(set(photos)), roots


@dataclass(frozen=True)
class Plan:
    lanes: list[str]
    params: dict[str, Any]
    photos: list[store_jobs.PhotoInput]
    roots: list[str]
    fingerprint: str


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
    ) -> Plan:
        """Check a job before submitting it: lanes, parameters (with defaults filled in), photos, roots."""
        names = parse_lanes(list(lanes) if not isinstance(lanes, str) else lanes)
        clean = validate_params(names, dict(params or {}))
        paths_list = list(paths)
        photos, roots = collect_photos(paths_list, any_file=names == ["noop"])
        if roots:
            base = roots[0]
            if "upload" in names:
                clean.setdefault("upload.target", f"{base}-uploads")
            if "archive" in names:
                clean.setdefault("archive.root", f"{base}-archive")
                clean.setdefault("archive.bundle", "none")
        inputs = [store_jobs.PhotoInput(str(p), _size(p)) for p in photos]
        # "The same job" is the same command: the paths as given (resolved), lanes and params; not the
        # files found, since a rename or archive moves them out of the way.
        given = [str(Path(p).expanduser().resolve()) for p in paths_list]
        fingerprint = store_jobs.job_fingerprint(names, given, clean)
        return Plan(names, clean, inputs, [str(r) for r in roots], fingerprint)

    def submit(
        self,
        lanes: str | Sequence[str],
        paths: Iterable[str | Path],
        params: Mapping[str, Any] | None = None,
        *,
        plan: Plan | None = None,
    ) -> store_jobs.Submitted:
        """Write the job, its photos and items (in short chunks; see ``store.jobs.submit``) and return
        its id; raise ``BacklogFull`` past a bound, before anything is written."""
        plan = plan or self.plan(lanes, paths, params)
        return store_jobs.submit(
            self.engine,
            [self.specs[n] for n in plan.lanes],
            plan.photos,
            params=plan.params,
            roots=plan.roots,
            fingerprint=plan.fingerprint,
            bundle_lanes=["archive"] if plan.params.get("archive.bundle", "none") != "none" else [],
        )

    def find_same_job(self, plan: Plan) -> int | None:
        """The newest job with the same paths, lanes and params (``photojobs run`` resumes it)."""
        return store_jobs.find_job_by_fingerprint(self.engine, plan.fingerprint)

    def status(self, job_id: int | None = None) -> store_jobs.JobStatus:
        if job_id is None:
            jobs = store_jobs.list_jobs(self.engine, limit=1)
            if not jobs:
                raise UnknownJob(0)
            return jobs[0]
        return store_jobs.job_status(self.engine, job_id)

    def events(
        self, *, after: int = 0, job_id: int | None = None, limit: int = 1000
    ) -> list[store_events.EventRecord]:
        return store_events.read_events(self.engine, after=after, job_id=job_id, limit=limit)

    def cancel(self, job_id: int) -> int:
        return store_jobs.cancel(self.engine, job_id)

    def pause(self, job_id: int) -> int:
        return store_jobs.pause(self.engine, job_id)

    def resume(self, job_id: int) -> int:
        return store_jobs.resume(self.engine, job_id)


def _size(p: Path) -> int | None:
    try:
        return p.stat().st_size
    except OSError:
        return None
