"""Install the pinned ExifTool into the virtualenv: ``python .ci/install_exiftool.py VENV``.

The pin is ``[tool.photojobs.exiftool]`` in pyproject.toml: the version, the npm registry's tarball
of Phil Harvey's Perl distribution (``exiftool-vendored.pl``, the unmodified ExifTool with its
``lib/``) and the tarball's sha512 ``integrity`` as ``npm view exiftool-vendored.pl@VERSION dist``
prints it. The tarball is downloaded (or taken from ``$PHOTOJOBS_EXIFTOOL_TARBALL`` on a machine
without network), its digest checked before anything is unpacked, unpacked (no links, no paths out
of the target) into ``VENV/opt/exiftool-VERSION`` and linked as ``VENV/bin/exiftool``, the name
``photos.exiftool`` prefers over PATH. Nothing happens when that version is already installed.
Needs ``perl`` (Debian's ``perl`` package). Exit status 1 with the reason on any failure.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pin() -> dict[str, str]:
    with open(ROOT / "pyproject.toml", "rb") as fh:
        return dict(tomllib.load(fh)["tool"]["photojobs"]["exiftool"])


def fail(message: str) -> None:
    print(f"install_exiftool: {message}", file=sys.stderr)
    raise SystemExit(1)


def installed_version(exe: Path) -> str | None:
    if not exe.exists():
        return None
    try:
        out = subprocess.run(  # noqa: S603 (the exiftool this script installed)
            [str(exe), "-ver"], capture_output=True, text=True, timeout=60, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def fetch(url: str, dest: Path) -> None:
    given = os.environ.get("PHOTOJOBS_EXIFTOOL_TARBALL")
    if given:
        shutil.copyfile(given, dest)
        return
    if not url.startswith("https://"):
        fail(f"refusing a non-https tarball URL {url!r}")
    try:
        with urllib.request.urlopen(url, timeout=120) as answer, open(dest, "wb") as out:  # noqa: S310
            shutil.copyfileobj(answer, out)
    except OSError as exc:
        fail(f"cannot download {url}: {exc} (offline? set PHOTOJOBS_EXIFTOOL_TARBALL to the tarball)")


def check_integrity(path: Path, integrity: str) -> None:
    algo, _, expected = integrity.partition("-")
    if algo != "sha512":
        fail(f"the pin's integrity must be sha512-..., got {integrity!r}")
    digest = base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()
    if digest != expected:
        fail(f"{path.name}: sha512 {digest} is not the pinned {expected}; nothing installed")


def main(venv: str) -> None:
    spec = pin()
    version, url, integrity = spec["version"], spec["tarball"], spec["integrity"]
    venv_dir = Path(venv).absolute()
    link = venv_dir / "bin" / "exiftool"
    target = venv_dir / "opt" / Path(url).name.removesuffix(".tgz")
    marker = target / ".integrity"
    if link.resolve() == (target / "exiftool").resolve() and marker.is_file():
        if marker.read_text().strip() == integrity and installed_version(link) == version:
            return  # this pin is installed and answers
    if shutil.which("perl") is None:
        fail("ExifTool is a Perl program: install perl (apt-get install perl)")
    with tempfile.TemporaryDirectory(prefix="exiftool-") as tmp:
        tarball = Path(tmp) / "exiftool.tgz"
        fetch(url, tarball)
        check_integrity(tarball, integrity)
        unpacked = Path(tmp) / "unpacked"
        with tarfile.open(tarball, "r:gz") as tar:
            tar.extractall(unpacked, filter="data")  # regular files and folders inside `unpacked` only
        source = unpacked / "package" / "bin"
        if not (source / "exiftool").is_file() or not (source / "lib" / "Image" / "ExifTool.pm").is_file():
            fail("the tarball has no package/bin/exiftool with its lib/: not the ExifTool distribution")
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, target)
    (target / "exiftool").chmod(0o755)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to(target / "exiftool")
    got = installed_version(link)
    if got != version:
        fail(f"{link} answers -ver with {got!r}, expected {version}")
    marker.write_text(integrity + "\n")
    print(f"install_exiftool: ExifTool {got} installed as {link}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        fail("usage: install_exiftool.py VENV")
    main(sys.argv[1])
