"""The watcher's stability rule and batches on real files, with a clock the test moves (issue 38):
a photo settles once it and its sidecars stayed unchanged for the debounce interval."""

from __future__ import annotations

import os
from pathlib import Path

from photojobs.watch import Batcher, Settled, Stability, network_mount, wanted_name


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_photo_written_in_chunks_settles_only_after_its_last_chunk_stayed_for_the_debounce(
    tmp_path: Path,
) -> None:
    # Given a photo being written in chunks, each within the debounce interval of the last
    clock = Clock()
    rule = Stability(3.0, clock)
    photo = tmp_path / "IMG_1.jpg"
    with open(photo, "wb") as out:
        for _ in range(5):
            out.write(b"x" * 1000)
            out.flush()
            rule.touch(str(photo))
            clock.now += 2.0
            # Then it never settles while it grows
            assert rule.tick() == Settled()
    # When it stays as it is for the debounce interval
    clock.now += 1.0
    assert rule.tick() == Settled()  # the first look after the last event starts the interval
    clock.now += 3.0
    # Then it settles, once
    assert rule.tick() == Settled(photos=[str(photo)])
    clock.now += 10.0
    assert rule.tick() == Settled() and len(rule) == 0


def test_a_change_seen_by_stat_alone_restarts_the_interval(tmp_path: Path) -> None:
    # Given a photo named by one event (a polling observer may report a write late, or never)
    clock = Clock()
    rule = Stability(3.0, clock)
    photo = tmp_path / "IMG_1.jpg"
    photo.write_bytes(b"part")
    rule.touch(str(photo))
    rule.tick()
    clock.now += 2.5
    # When it grows without another event
    photo.write_bytes(b"part and more")
    assert rule.tick() == Settled()
    clock.now += 2.5
    # Then the interval counts from the change the tick saw
    assert rule.tick() == Settled()
    clock.now += 0.6
    assert rule.tick() == Settled(photos=[str(photo)])


def test_a_photo_waits_for_its_sidecar_and_a_sidecar_event_makes_its_photo_wait(tmp_path: Path) -> None:
    # Given a raw that has settled but whose sidecar is being written
    clock = Clock()
    rule = Stability(3.0, clock)
    raw = tmp_path / "DSC_1.NEF"
    raw.write_bytes(b"raw")
    sidecar = tmp_path / "DSC_1.NEF.xmp"
    rule.touch(str(raw))
    rule.tick()
    clock.now += 2.0
    sidecar.write_bytes(b"<x/>")
    rule.touch(str(sidecar))  # the sidecar's event is the photo's: it waits again
    assert rule.tick() == Settled()
    assert list(rule.entries) == [str(raw)]
    clock.now += 0.5
    assert rule.tick() == Settled()  # the photo looked at again, its sidecar with it
    clock.now += 2.0
    sidecar.write_bytes(b"<x>more</x>")  # its sidecar changes again, without an event this time
    assert rule.tick() == Settled()
    clock.now += 1.1  # the photo itself has not changed for 3.1 s, its sidecar for 1.1 s
    assert rule.tick() == Settled()
    clock.now += 2.0
    # Then the photo settles once its sidecar stayed whole for the interval too
    assert rule.tick() == Settled(photos=[str(raw)])


def test_a_folder_that_appears_settles_file_by_file_and_a_gone_path_settles_as_gone(tmp_path: Path) -> None:
    clock = Clock()
    rule = Stability(1.0, clock)
    folder = tmp_path / "import"
    (folder / "day 1").mkdir(parents=True)
    for name in ("a.jpg", "b.CR2", "b.CR2.xmp", ".hidden.jpg", "notes.txt"):
        (folder / "day 1" / name).write_bytes(name.encode())
    os.symlink(tmp_path, folder / "loop")
    rule.touch(str(folder))
    rule.touch(str(tmp_path / "deleted.jpg"))
    rule.tick()  # the folder becomes its photos and sidecars; no symlink followed
    assert sorted(os.path.basename(p) for p in rule.entries) == ["a.jpg", "b.CR2", "b.CR2.xmp", "deleted.jpg"]
    settled = Settled()
    for _ in range(4):  # the sidecar joins its raw, then each settles
        clock.now += 0.5
        found = rule.tick()
        settled.photos += found.photos
        settled.gone += found.gone
    assert sorted(os.path.basename(p) for p in settled.photos) == ["a.jpg", "b.CR2"]
    assert settled.gone == [str(tmp_path / "deleted.jpg")] and len(rule) == 0


def test_a_burst_is_one_batch_and_a_trickle_is_flushed_by_the_longest_wait() -> None:
    clock = Clock()
    batch = Batcher(wait=1.0, most=5000, max_wait=10.0, clock=clock)
    # A burst of 10,000 settled photos over two seconds: two batches of at most 5,000
    flushed = []
    for n in range(10_000):
        batch.add(Settled(photos=[f"/p/{n}.jpg"]))
        if n % 100 == 0:
            clock.now += 0.02
        if batch.due():
            flushed.append(len(batch.take()[0]))
    clock.now += 1.0
    if batch.due():
        flushed.append(len(batch.take()[0]))
    assert flushed == [5000, 5000]
    # A trickle (one photo every half second) is flushed once its first waited 10 s
    sizes = []
    for n in range(30):
        batch.add(Settled(photos=[f"/t/{n}.jpg"]))
        clock.now += 0.5
        if batch.due():
            sizes.append(len(batch.take()[0]))
    assert sizes == [20]


def test_the_watcher_follows_photos_and_sidecars_only() -> None:
    names = ("a.JPG", "b.nef", "b.NEF.xmp", "b.xmp")
    assert [wanted_name(n) for n in names] == ["photo", "photo", "sidecar", "sidecar"]
    assert [wanted_name(n) for n in (".a.jpg", ".IMG.jpg.pj-1.tmp", "x.txt", "a\udcff.jpg")] == [None] * 4
    assert network_mount("/proc") is None
