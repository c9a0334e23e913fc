"""``photojobs sync`` and ``photojobs watch`` with real workers, Redis and both stores (issue 38).

- A library synced, then synced again unchanged, then changed by hand (a photo added, one edited,
  one moved into a new folder, one deleted): the second sync makes no job, the third exactly the
  new and the changed photo's items, and ``photojobs history NEWPATH`` shows the moved photo's id
  with its move.
- A watcher over a folder where a photo is written slowly, in chunks, and then its sidecar: the
  photo is submitted once, whole, with its sidecar (its analysis reads the capture time from it).
- A burst of 2,000 files into a watched folder is a handful of jobs, each file in exactly one.

One worker (analysis, noop) and one sweeper per store for the whole file's promises of a store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.testing.samples import generate_samples, make_png
from photos.fileops import sha256_file
from store.models import Item, Job, Photo
from tests.support import ROOT, Fleet, photojobs, wait_for, wait_job_done

pytestmark = pytest.mark.timeout(400)


def sync_cli(env: dict[str, str], folder: Path, lanes: str = "analysis") -> dict[str, Any]:
    done = photojobs(env, "sync", "--lanes", lanes, "--json", str(folder))
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def sync(env: dict[str, str], folder: Path, lanes: str = "analysis") -> dict[str, Any]:
    """``Client.sync`` in this process (what the command runs; cheaper than a process per sync)."""
    return dict(Client(Settings.from_env(env)).sync(lanes, [folder]).as_dict())


def item_paths(engine: Engine, job: int) -> list[str]:
    with Session(engine) as s:
        return sorted(
            s.execute(select(Photo.path).join(Item, Item.photo_id == Photo.id).where(Item.job_id == job))
            .scalars()
            .all()
        )


def analysis_results(engine: Engine, jobs: list[int]) -> list[tuple[str, dict[str, Any] | None, str]]:
    """(path, result, state) of every item of ``jobs``."""
    with Session(engine) as s:
        rows = s.execute(
            select(Photo.path, Item.result, Item.state)
            .join(Item, Item.photo_id == Photo.id)
            .where(Item.job_id.in_(jobs))
            .order_by(Item.id)
        ).all()
    return [(p, r, st) for p, r, st in rows]


def test_sync_submits_only_what_changed_and_a_moved_photo_keeps_its_id_and_history(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a library of real photos, synced once and analysed by a real worker
    folder = tmp_path / "library"
    files = generate_samples(folder, 6, seed=38, size=(320, 240))
    fleet.start_sweeper()
    fleet.start_worker(["analysis"], threads=2)
    first = sync_cli(env, folder)
    assert (first["new"], first["unchanged"], first["job"] is not None) == (6, 0, True)
    wait_job_done(engine, first["job"])
    # When it is synced again with nothing changed
    again = sync(env, folder)
    # Then no job and no item
    assert again["job"] is None and (again["new"], again["changed"], again["unchanged"]) == (0, 0, 6)
    with Session(engine) as s:
        assert s.execute(select(Job.id)).scalars().all() == [first["job"]]
    # When a photo is added, one edited, one moved into a new folder by hand, one deleted
    (fresh,) = generate_samples(tmp_path / "more", 1, seed=99, size=(320, 240))
    added = folder / "ajoutée.jpg"
    os.replace(fresh, added)
    files[1].write_bytes(generate_samples(tmp_path / "edit", 2, seed=7, size=(320, 240))[1].read_bytes())
    moved = folder / "2024 juin" / files[2].name
    moved.parent.mkdir()
    with Session(engine) as s:
        photo_id = s.execute(select(Photo.id).where(Photo.path == str(files[2]))).scalar_one()
    os.rename(files[2], moved)
    files[3].unlink()
    changed = sync(env, folder)
    # Then exactly the new and the changed photo get items, and they are analysed as they are now
    assert {k: changed[k] for k in ("new", "changed", "unchanged", "moved", "missing")} == {
        "new": 1, "changed": 1, "unchanged": 3, "moved": 1, "missing": 1,
    }  # fmt: skip
    assert item_paths(engine, changed["job"]) == sorted([str(added), str(files[1])])
    wait_job_done(engine, changed["job"])
    results = {p: (r, st) for p, r, st in analysis_results(engine, [changed["job"]])}
    assert results[str(files[1])][1] == "succeeded"
    assert results[str(files[1])][0]["sha256"] == sha256_file(files[1])  # type: ignore[index]
    # And the moved photo kept its id and its history, which shows the move
    shown = photojobs(env, "history", str(moved))
    assert shown.returncode == 0, shown.stderr
    head, entry = shown.stdout.splitlines()  # the move is its only entry, on one line
    assert head == f"photo {photo_id}: {moved}"
    assert "found by sync" in entry and f"moved outside photojobs {files[2]} -> {moved}" in entry, entry
    # And a last sync finds nothing new: the moved photo is not analysed again
    last = sync(env, folder)
    assert last["job"] is None and last["missing"] == 1 and last["moved"] == 0


class Watch:
    """A ``photojobs watch --json`` process; its reports are the JSON lines of its output."""

    def __init__(self, fleet: Fleet, env: dict[str, str], folder: Path, lanes: str, *extra: str) -> None:
        self.out = fleet.logdir / f"watch-{folder.name}.out"
        log = open(fleet.logdir / f"watch-{folder.name}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "photojobs", "watch", "--lanes", lanes, "--json", *extra, str(folder)],
            cwd=ROOT,
            env=env,
            stdout=open(self.out, "wb"),  # noqa: SIM115
            stderr=log,
            start_new_session=True,
        )
        fleet.procs.append(self.proc)
        # Ready once its first sync (of the folder as it is) reported
        wait_for(lambda: self.reports(), 60, what=f"the watcher of {folder.name} to start")

    def reports(self) -> list[dict[str, Any]]:
        assert self.proc.poll() is None, self.out.read_text()
        lines = self.out.read_text().splitlines() if self.out.exists() else []
        return [json.loads(line) for line in lines if line.startswith("{")]

    def jobs(self) -> list[int]:
        return [j for r in self.reports() for j in r["jobs"]]


def xmp_with_date(taken: str) -> bytes:
    return (
        '<?xpacket begin="" id="W5M0MpCehiHzreSzNTczkc9d"?>\n'
        '<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
        '<rdf:Description rdf:about="" xmlns:exif="http://ns.adobe.com/exif/1.0/" '
        f'exif:DateTimeOriginal="{taken}"/></rdf:RDF></x:xmpmeta>\n<?xpacket end="w"?>'
    ).encode()


def write_slowly(path: Path, data: bytes, parts: int, pause: float) -> None:
    """Write ``data`` in ``parts`` chunks, ``pause`` seconds apart (a copy over a slow link)."""
    import time

    step = -(-len(data) // parts)
    with open(path, "wb") as out:
        for start in range(0, len(data), step):
            out.write(data[start : start + step])
            out.flush()
            os.fsync(out.fileno())
            time.sleep(pause)  # the stimulus: a writer pausing between chunks, within the debounce


def test_a_watched_folder_submits_a_slowly_written_photo_once_whole_with_its_sidecar_and_a_burst_in_few_jobs(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given two watched folders (analysis on one, noop on the other) and a worker for both
    slow, burst = tmp_path / "incoming", tmp_path / "burst"
    slow.mkdir()
    burst.mkdir()
    fleet.start_sweeper()
    fleet.start_worker(["analysis", "noop"], threads=2)
    photo_watch = Watch(fleet, env, slow, "analysis", "--debounce", "2.5", "--batch-wait", "0.5")
    burst_watch = Watch(fleet, env, burst, "noop", "--debounce", "1", "--batch-wait", "1")
    # When a photo without a capture time of its own is written in chunks (each within the debounce
    # of the one before), and then its sidecar holding the capture time, also in chunks
    source = make_png(tmp_path / "source.png", size=(900, 700), taken=None)
    data = source.read_bytes()
    photo = slow / "IMG_0001.png"
    write_slowly(photo, data, parts=5, pause=0.5)
    write_slowly(slow / "IMG_0001.png.xmp", xmp_with_date("2019:08:07 06:05:04"), parts=2, pause=0.5)
    # Then one job analyses it, once, from its final bytes, with the sidecar's capture time
    wait_for(lambda: photo_watch.jobs(), 60, what="the watcher's job for the photo")
    jobs = photo_watch.jobs()
    assert len(jobs) == 1, f"the photo was submitted before it was whole: jobs {jobs}"
    job = jobs[0]
    wait_job_done(engine, job)
    ((path, result, state),) = analysis_results(engine, [job])
    assert (path, state) == (str(photo), "succeeded"), result
    assert result is not None and result["sha256"] == sha256_file(photo)
    assert result["taken"].startswith("2019-08-07T06:05:04") and result["taken_from"].startswith("sidecar")
    # When 2,000 files land in the other folder at once
    for n in range(2000):
        (burst / f"IMG_{n:05d}.jpg").write_bytes(b"burst %d" % n)
    # Then they are a handful of jobs, each file in exactly one item
    wait_for(lambda: sum(r["new"] for r in burst_watch.reports()) >= 2000, 120, what="2,000 files synced")
    burst_jobs = burst_watch.jobs()
    assert 1 <= len(burst_jobs) <= 5, burst_jobs
    per_path = Counter(p for j in burst_jobs for p in item_paths(engine, j))
    assert len(per_path) == 2000 and set(per_path.values()) == {1}
    # And the photo watcher, shown one more photo afterwards (a sentinel: its sync follows every
    # earlier one), never submitted the slow photo again
    make_png(slow / "IMG_0002.png")
    wait_for(lambda: len(photo_watch.jobs()) == 2, 60, what="the sentinel's job")
    later = photo_watch.jobs()[1]
    assert item_paths(engine, later) == [str(slow / "IMG_0002.png")]
    assert [p for p, _, _ in analysis_results(engine, photo_watch.jobs())].count(str(photo)) == 1
    for j in burst_jobs:
        wait_job_done(engine, j)
