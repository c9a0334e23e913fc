"""``make demo``: ~200 realistic sample photos through analysis, EXIF, rename and archive on
embedded defaults, with one worker SIGKILLed midway to show a recovery, then a check that every
photo ended up exactly once where the summary says."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from photojobs.run import RunOptions, run
from photojobs.testing.samples import generate_samples
from photos.fileops import sha256_file


def _visible_files(root: Path) -> list[Path]:
    """The files under ``root`` that are photos: not hidden, and not in a hidden folder (the
    originals kept for undo live in ``ROOT/.photojobs-history``)."""
    return [
        p for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, default=Path("demo-photos"))
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--workers", type=int, default=3)
    args = parser.parse_args(argv)
    photos: Path = args.dir.resolve()
    archive = photos.with_name(photos.name + "-archive")
    state = photos.parent / ".photojobs"
    for old in (photos, archive, state):
        shutil.rmtree(old, ignore_errors=True)
    print(f"generating {args.count} sample photos (plus near-duplicates and corrupt files) in {photos}")
    made = generate_samples(photos, args.count, seed=7, corrupt=3, near_duplicates=6)
    hashes = {sha256_file(p) for p in made if p.stat().st_size}
    code = run(
        RunOptions(
            paths=[str(photos)],
            lanes=["analysis", "exif", "rename", "archive"],
            params={"exif.keywords": "photojobs,demo", "exif.artist": "photojobs demo"},
            workers=args.workers,
            threads=2,
            kill_worker_at=0.35,
        )
    )
    archived, left = _visible_files(archive), _visible_files(photos)
    temps = [p for p in [*archive.rglob(".*.tmp"), *photos.rglob(".*.tmp")]]
    print(
        f"check: {len(made)} files made; {len(archived)} archived under {archive}; "
        f"{len(left)} left in {photos} (the unreadable ones); {len(temps)} temp files; "
        f"{len(made) - len(archived) - len(left)} missing"
    )
    if len(archived) + len(left) != len(made) or temps:
        print("demo check FAILED: photos lost or duplicated", file=sys.stderr)
        return 2
    # the originals were real files
    if not hashes:
        raise RuntimeError("internal error: expected hashes")
    print(next_steps(state))
    return 0 if code in (0, 1) else code


def next_steps(state: Path) -> str:
    """The two commands to try next: the job's status, and the console on the demo's store."""
    try:
        where = state.relative_to(Path.cwd())
    except ValueError:
        where = state
    exe = Path(sys.executable).parent / "photojobs"
    if exe.is_file():
        try:
            cmd = str(exe.relative_to(Path.cwd()))
        except ValueError:
            cmd = str(exe)
    else:
        cmd = "photojobs"
    return (
        "next:\n"
        f"  {cmd} status --state-dir {where}                    # the demo job's status\n"
        f"  {cmd} serve --state-dir {where} --insecure-local    # the console: http://127.0.0.1:8765/"
    )


if __name__ == "__main__":
    sys.exit(main())
