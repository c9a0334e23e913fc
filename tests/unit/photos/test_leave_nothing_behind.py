"""Leave nothing behind (issue 40): a worker process's exiftool configuration and its folder of pins
are gone from the temp folder when the process ends -- also a forked Dramatiq-style worker process,
which ends through ``os._exit`` (no ``atexit``) -- and a killed process's are swept by the next one.

Real processes (forked as Dramatiq forks its worker processes, and killed with SIGKILL), a real
exiftool, real JPEGs."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from PIL import Image

from photos import containment, exiftool
from tests.support import unavailable

HERE = Path(__file__).resolve().parents[3]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(("pj-pin-", "photojobs-exiftool-")))


def _work_in_child(tmp: str, photo: str, file_config: bool, die: bool) -> None:
    """A worker process's photo work: pin the photo, run exiftool on it (with the config as a file
    when ``file_config``); then end as a forked worker ends (``os._exit``) or killed."""
    tempfile.tempdir = tmp
    if file_config:
        exiftool.config_path()
    with containment.pin_inside(photo, [str(Path(photo).parent)]) as pinned:
        exiftool.ExifTool.shared().execute("-j", "-FileSize", os.path.abspath(pinned.name))
    if die:
        os.kill(os.getpid(), signal.SIGKILL)


def run_forked(tmp: Path, photo: Path, *, file_config: bool = False, die: bool = False) -> int | None:
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_work_in_child, args=(str(tmp), str(photo), file_config, die))
    child.start()
    child.join(60)
    return child.exitcode


@pytest.fixture
def photo(tmp_path: Path) -> Path:
    folder = tmp_path / "photos"
    folder.mkdir()
    Image.new("RGB", (64, 48), (200, 120, 40)).save(folder / "IMG_0001.jpg", "JPEG")
    return folder / "IMG_0001.jpg"


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    folder = tmp_path / "temp"
    folder.mkdir()
    return folder


@pytest.mark.parametrize("file_config", [False, True], ids=["config-in-memory", "config-file"])
def test_a_forked_worker_process_leaves_no_config_and_no_pins(
    tmp: Path, photo: Path, file_config: bool
) -> None:
    # Given a forked worker process that pins a photo and runs exiftool on it
    # When it ends as a Dramatiq worker process ends (multiprocessing: os._exit, no atexit)
    code = run_forked(tmp, photo, file_config=file_config)
    # Then it worked, and neither its exiftool config nor its pin folder is left in its temp folder
    assert code == 0
    assert leftovers(tmp) == []


def test_a_process_ending_at_interpreter_exit_leaves_nothing(tmp: Path, photo: Path) -> None:
    # Given a plain process (interpreter exit: atexit) that made a config file, pinned and ran exiftool
    script = (
        "import sys; from photos import containment, exiftool\n"
        "exiftool.config_path()\n"
        f"with containment.pin_inside({str(photo)!r}, [{str(photo.parent)!r}]) as p:\n"
        "    exiftool.ExifTool.shared().execute('-j', '-FileSize', str(p.name))\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(HERE)}
    # When it exits
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    # Then nothing of it is left
    assert done.returncode == 0, done.stderr
    assert leftovers(tmp) == []


def test_a_killed_process_s_config_and_pins_are_swept_by_the_next(
    tmp: Path, photo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker process killed (SIGKILL) after it made its config file and pinned a photo
    code = run_forked(tmp, photo, file_config=True, die=True)
    assert code == -signal.SIGKILL
    left = leftovers(tmp)
    assert any(n.startswith("pj-pin-") for n in left)
    assert any(n.startswith("photojobs-exiftool-") for n in left)
    # and a live process's config beside it
    live = tmp / f"{exiftool.CONFIG_PREFIX}{os.getpid()}-live.config"
    live.write_text("1;\n")
    # When the next process makes its own (its first pin and config sweep the dead ones')
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setattr(containment, "_swept", set())
    swept = exiftool.sweep_dead_configs(str(tmp))
    containment._sweep_dead_pins()
    # Then the dead process's are gone, the live one's stays
    assert len(swept) == 1
    assert leftovers(tmp) == [live.name]


@pytest.fixture(autouse=True)
def _needs_exiftool() -> None:
    if not exiftool.available():
        unavailable("needs exiftool")
