"""The pinned ExifTool install (.ci/install_exiftool.py, run by `make`): a tarball whose sha512 is not
the pinned one installs nothing; the pinned one is unpacked into the virtualenv and linked as
``bin/exiftool``, which photos.exiftool then prefers; a second run changes nothing."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import os
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

from photos import exiftool

ROOT = Path(__file__).resolve().parents[2]


def _installer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("install_exiftool", ROOT / ".ci" / "install_exiftool.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _distribution(path: Path, version: str) -> str:
    """A tarball laid out as exiftool-vendored.pl (package/bin/exiftool and its lib/); its integrity."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data, mode in (
            ("package/bin/exiftool", f"#!/bin/sh\necho {version}\n".encode(), 0o755),
            ("package/bin/lib/Image/ExifTool.pm", b"1;\n", 0o644),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return "sha512-" + base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()


def test_only_the_pinned_tarball_is_installed_and_then_preferred(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a tarball of the distribution, and a pin of it
    installer = _installer()
    tarball = tmp_path / "exiftool-vendored.pl-13.59.3.tgz"
    integrity = _distribution(tarball, "13.59")
    url = "https://registry.npmjs.org/exiftool-vendored.pl/-/exiftool-vendored.pl-13.59.3.tgz"
    monkeypatch.setenv("PHOTOJOBS_EXIFTOOL_TARBALL", str(tarball))
    venv = tmp_path / "venv"
    # When the pin names another digest / Then nothing is installed
    wrong = {"version": "13.59", "tarball": url, "integrity": "sha512-" + "A" * 86 + "=="}
    monkeypatch.setattr(installer, "pin", lambda: wrong)
    with pytest.raises(SystemExit):
        installer.main(str(venv))
    assert not (venv / "bin" / "exiftool").exists() and not (venv / "opt").exists()
    # When the pin is the tarball's digest / Then it is unpacked and linked, and answers its version
    pinned = {"version": "13.59", "tarball": url, "integrity": integrity}
    monkeypatch.setattr(installer, "pin", lambda: pinned)
    installer.main(str(venv))
    link = venv / "bin" / "exiftool"
    assert link.is_symlink() and installer.installed_version(link) == "13.59"
    # and a second run leaves it as it is
    before = os.lstat(link).st_mtime_ns
    installer.main(str(venv))
    assert os.lstat(link).st_mtime_ns == before
    # and photos.exiftool prefers the one next to the interpreter, unless PHOTOJOBS_EXIFTOOL says
    monkeypatch.setattr(sys, "prefix", str(venv))
    monkeypatch.delenv(exiftool.ENV, raising=False)
    assert exiftool.executable() == str(venv / "bin" / "exiftool")
    monkeypatch.setenv(exiftool.ENV, "/no/such/exiftool")
    assert exiftool.executable() is None and not exiftool.available()
