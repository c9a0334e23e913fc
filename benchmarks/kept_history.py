"""What the history store keeps (issue 39): kept bytes against the photos' bytes, with the delta
store (``photos.history``: the displaced version as a zstd delta against the version that replaced
it) and without it (every displaced version kept whole, the hard link of before), in the same run.

Real files, ExifTool and each lane's own code, run item by item through a SQLite store
(``tests.inline_lanes``), as the integration tests do. Prints:

- a keyword job (``exif.keywords``) over N photos: kept bytes / photo bytes after the job, and after
  its undo; the job's and the undo's time, with and without deltas (the cost of building them);
- 20 keyword edits of one photo (20 jobs): kept bytes / the photo's size;
- kept bytes per edited photo by format (JPEG, PNG, TIFF, HEIC, a raw's XMP sidecar).

Goals (issue 39): the job's history <= 10 % of the photos' bytes, <= 20 % after its undo, 20 edits
of one photo <= 2x its size.

    .venv/bin/python -m benchmarks.kept_history [--photos 40] [--size 1600x1200]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.testing.samples import generate_samples
from photos import history
from store.engine import make_engine
from store.models import Item, Job
from tests.inline_lanes import run_item

KEYWORDS = {"exif.keywords": "holiday,beach,family"}


def photo_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and history.FOLDER not in p.parts)


def kept_bytes(folder: Path) -> int:
    """The store's bytes, less the files that are a photo's own inode (a delta's base link)."""
    store = folder / history.FOLDER
    if not store.exists():
        return 0
    photos = {p.stat().st_ino for p in folder.rglob("*") if p.is_file() and history.FOLDER not in p.parts}
    kept = {p.stat().st_ino: p.stat().st_size for p in store.rglob("*") if p.is_file()}
    return sum(size for ino, size in kept.items() if ino not in photos)


class Store:
    """A fresh SQLite store and client in ``where``; jobs run inline, lane by lane."""

    def __init__(self, where: Path) -> None:
        url = f"sqlite:///{where / 'photojobs.db'}"
        self.engine = make_engine(url)
        self.client = Client(Settings.from_env({"PHOTOJOBS_DATABASE_URL": url}), engine=self.engine)

    def run(self, job: int) -> float:
        """Every item of ``job`` lane after lane; seconds taken. Raises on a refusal."""
        from sqlalchemy import select
        from sqlalchemy.orm import Session

        started = time.perf_counter()
        with Session(self.engine) as s:
            lanes = list(s.get(Job, job).lanes or [])  # type: ignore[union-attr]
            items = list(s.execute(select(Item).where(Item.job_id == job).order_by(Item.id)).scalars())
            for item in items:
                s.expunge(item)
        for lane in lanes:
            for item in (i for i in items if i.lane == lane):
                run_item(self.engine, item, fail_refused=True)
        return time.perf_counter() - started

    def job(self, folder: Path, params: dict[str, Any]) -> tuple[int, float]:
        job = self.client.submit(["exif"], [folder], params).job_id
        return job, self.run(job)

    def undo(self, job: int) -> tuple[int, float]:
        out = self.client.undo(job)
        return out["job"], self.run(out["job"])

    def close(self) -> None:
        self.engine.dispose()


def whole_copies(enabled: bool) -> Callable[[], None]:
    """Keep every displaced version whole (no delta: the store of before) while ``enabled``."""
    saved = history.DELTA_MAX_BYTES
    history.DELTA_MAX_BYTES = -1 if enabled else saved

    def restore() -> None:
        history.DELTA_MAX_BYTES = saved

    return restore


def keyword_job(base: Path, photos: int, size: tuple[int, int], whole: bool) -> dict[str, float]:
    folder = base / "photos"
    generate_samples(folder, photos, seed=39, size=size)
    total = photo_bytes(folder)
    store = Store(base)
    restore = whole_copies(whole)
    try:
        job, job_s = store.job(folder, KEYWORDS)
        after_job = kept_bytes(folder)
        _, undo_s = store.undo(job)
        after_undo = kept_bytes(folder)
    finally:
        restore()
        store.close()
    return {"photo_bytes": total, "after_job": after_job / total, "after_undo": after_undo / total,
            "job_s": job_s, "undo_s": undo_s}  # fmt: skip


def repeated_edits(base: Path, edits: int, size: tuple[int, int], whole: bool) -> float:
    folder = base / "photos"
    generate_samples(folder, 1, seed=20, size=size)
    store = Store(base)
    restore = whole_copies(whole)
    try:
        for n in range(edits):
            store.job(folder, {"exif.keywords": f"edit{n}"})
    finally:
        restore()
        store.close()
    return kept_bytes(folder) / photo_bytes(folder)


def by_format(base: Path, size: tuple[int, int], whole: bool) -> dict[str, float]:
    """Kept bytes per edited photo / its size, one photo per format."""
    sample = generate_samples(base / "sample", 1, seed=5, size=size)[0]
    out: dict[str, float] = {}
    for fmt, ext in (("JPEG", ".jpg"), ("PNG", ".png"), ("TIFF", ".tif"), ("HEIC", ".heic"), ("XMP", ".NEF")):
        where = base / fmt
        folder = where / "photos"
        folder.mkdir(parents=True)
        try:
            if fmt == "XMP":  # a raw with its sidecar: the edit goes into the sidecar
                from tests.raw_support import make_raw, make_xmp_sidecar

                raw = make_raw(folder / "DSC_0001.NEF")
                make_xmp_sidecar(raw.with_suffix(".xmp"), keywords=("old",), rating=2)
                measured = raw.with_suffix(".xmp")
            else:
                measured = folder / f"IMG_0001{ext}"
                if fmt == "HEIC":
                    from pillow_heif import register_heif_opener

                    register_heif_opener()
                Image.open(sample).convert("RGB").save(measured, format="HEIF" if fmt == "HEIC" else fmt)
            before = measured.stat().st_size
            store = Store(where)
            restore = whole_copies(whole)
            try:
                store.job(folder, KEYWORDS)
            finally:
                restore()
                store.close()
            out[fmt] = kept_bytes(folder) / before
        except Exception as exc:  # noqa: BLE001 - a format this machine cannot write: said, not fatal
            print(f"  {fmt}: not measured ({type(exc).__name__}: {exc})")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=40)
    parser.add_argument("--size", default="1600x1200")
    parser.add_argument("--edits", type=int, default=20)
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.split("x"))
    assert len(size) == 2
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="pj-kept-") as tmp:  # ExifTool started, caches warm
        repeated_edits(Path(tmp), 1, (64, 48), False)
    for name, whole in (("whole copies (before)", True), ("deltas", False)):
        with tempfile.TemporaryDirectory(prefix="pj-kept-") as tmp:
            base = Path(tmp)
            job = keyword_job(base / "job", args.photos, size, whole)  # type: ignore[arg-type]
            edits = repeated_edits(base / "edits", args.edits, size, whole)  # type: ignore[arg-type]
            formats = by_format(base / "formats", size, whole)  # type: ignore[arg-type]
            shutil.rmtree(base, ignore_errors=True)
        results[name] = {**job, "edits": edits, "formats": formats}
    mb = results["deltas"]["photo_bytes"] / 1e6
    print(f"keyword job over {args.photos} photos ({args.size}, {mb:.1f} MB); "
          f"{args.edits} edits of one photo")  # fmt: skip
    head = f"{'after job':>10} {'after undo':>11} {f'{args.edits} edits':>10} {'job s':>7} {'undo s':>7}"
    print(f"{'':24} {head}")
    for name, r in results.items():
        print(f"{name:24} {r['after_job']:>9.1%} {r['after_undo']:>10.1%} {r['edits']:>9.2f}x "
              f"{r['job_s']:>7.2f} {r['undo_s']:>7.2f}")  # fmt: skip
    d, w = results["deltas"], results["whole copies (before)"]
    job_ratio, undo_ratio = d["job_s"] / w["job_s"], d["undo_s"] / w["undo_s"]
    undo_job = d["undo_s"] / d["job_s"]
    print(f"deltas / whole: job time {job_ratio:.2f}x, undo time {undo_ratio:.2f}x; "
          f"undo / job (deltas) {undo_job:.2f}x")  # fmt: skip
    print("kept bytes per edited photo / its size:")
    for fmt in d["formats"]:
        whole = w["formats"].get(fmt, float("nan"))
        print(f"  {fmt:5} deltas {d['formats'][fmt]:>7.1%}   whole {whole:>7.1%}")
    goals = d["after_job"] <= 0.10 and d["after_undo"] <= 0.20 and d["edits"] <= 2.0
    print(f"goals (<= 10 % after the job, <= 20 % after its undo, {args.edits} edits <= 2x): "
          f"{'met' if goals else 'NOT met'}")  # fmt: skip


if __name__ == "__main__":
    main()
