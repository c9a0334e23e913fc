"""What a job may name: photo roots, output roots, named upload targets, and the diagnostics switch.

``PHOTOJOBS_PHOTO_ROOTS`` (``:``-separated): the folders a web submission's photos may be in.
``PHOTOJOBS_OUTPUT_ROOTS`` (same syntax): further folders a job may write into (upload target,
archive root); a destination must resolve inside a photo root or an output root.
``PHOTOJOBS_UPLOAD_TARGETS``: ``name=s3://bucket/prefix[@https://endpoint]`` or ``name=/folder``,
several separated by spaces or commas; a request picks one by name (``upload.target_name``).
``PHOTOJOBS_DIAGNOSTICS=1``: the web API accepts the noop lane's fault parameters.

A path is refused (``OutsideRoots``, HTTP 403) when it has a ``..`` part, is absolute and not under
a root, or resolves (through symlinks) outside every root — checked for the paths given and again
for every file found under them, before anything is written. The containment test itself is
``photos.containment`` (the workers use the same one at the moment of use).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from photos.containment import is_within, real_roots
from photos.errors import InvalidParameter
from store.errors import SubmissionError

ROOTS_ENV = "PHOTOJOBS_PHOTO_ROOTS"
OUTPUT_ROOTS_ENV = "PHOTOJOBS_OUTPUT_ROOTS"
UPLOAD_TARGETS_ENV = "PHOTOJOBS_UPLOAD_TARGETS"
DIAGNOSTICS_ENV = "PHOTOJOBS_DIAGNOSTICS"

_TARGET_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class OutsideRoots(SubmissionError):
    """A submitted path lies outside the configured photo roots."""

    def __init__(self, path: str, why: str) -> None:
        self.path = path
        super().__init__(f"{path}: {why}")


class ConfinementError(SubmissionError):
    """A configuration of roots or named targets is malformed (names the variable)."""


def parse_roots(text: str | None) -> list[Path]:
    """``"/photos:/mnt/more"`` -> the roots as given, made absolute (empty parts ignored)."""
    return [Path(part).expanduser().absolute() for part in (text or "").split(":") if part.strip()]


def _within(p: Path, roots: Iterable[Path]) -> bool:
    return is_within(p, roots)


def confine(paths: Sequence[str], roots: Sequence[Path]) -> list[str]:
    """The submitted paths as absolute paths inside ``roots``; a relative path is taken relative to
    the first root. Raises ``OutsideRoots`` or ``SubmissionError`` (empty path, no roots)."""
    if not roots:
        raise OutsideRoots(
            ", ".join(paths) or "(no paths)",
            f"no photo roots are configured; set {ROOTS_ENV} to the folders jobs may use",
        )
    resolved_roots = real_roots(roots)
    out = []
    for raw in paths:
        if not isinstance(raw, str) or not raw.strip():
            raise SubmissionError("an empty path was given")
        if "\x00" in raw:
            raise SubmissionError(f"{raw!r}: a path cannot contain a NUL byte")
        if ".." in PurePosixPath(raw).parts:
            raise OutsideRoots(raw, "'..' is not allowed in a submitted path")
        p = Path(raw).expanduser()
        p = p if p.is_absolute() else roots[0] / p
        if not _within(p, roots) and not _within(p, resolved_roots):
            raise OutsideRoots(raw, f"not inside the photo roots ({':'.join(str(r) for r in roots)})")
        if p.exists() and not _within(p.resolve(), resolved_roots):
            raise OutsideRoots(raw, "resolves (through a symlink) outside the photo roots")
        out.append(str(p))
    return out


def check_found(photos: Iterable[Path], roots: Sequence[Path]) -> None:
    """Every file found under the submitted folders must resolve inside a root (a symlink inside a
    root may point anywhere)."""
    resolved_roots = real_roots(roots)
    for photo in photos:
        if not _within(photo.resolve(), resolved_roots):
            raise OutsideRoots(str(photo), "resolves (through a symlink) outside the photo roots")


def confine_destination(
    param: str,
    value: str,
    photo_roots: Sequence[Path],
    output_roots: Sequence[Path],
    *,
    default: bool = False,
) -> str:
    """The real path of a local destination (``upload.target``, ``archive.root``) when it resolves
    inside a photo root or an output root; a relative one is taken relative to the first photo root.
    ``OutsideRoots`` otherwise, saying what to configure."""
    text = str(value).strip()
    if "\x00" in text:
        raise SubmissionError(f"parameter {param}: a path cannot contain a NUL byte")
    if ".." in PurePosixPath(text).parts:
        raise OutsideRoots(text, f"parameter {param}: '..' is not allowed in a destination")
    allowed = [*photo_roots, *output_roots]
    p = Path(text).expanduser()
    if not p.is_absolute():
        if not photo_roots:
            raise OutsideRoots(text, f"parameter {param}: give an absolute folder (no photo roots are set)")
        p = photo_roots[0] / p
    real = p.resolve()
    if allowed and _within(real, real_roots(allowed)):
        return str(real)
    configured = ":".join(str(r) for r in output_roots) or "not set"
    raise OutsideRoots(
        text,
        f"{param}{' (its default)' if default else ''} is outside the photo roots and the output "
        f"roots ({OUTPUT_ROOTS_ENV}: {configured}); add a folder that holds it to {OUTPUT_ROOTS_ENV}"
        f" or give a {param} inside them",
    )


@dataclass(frozen=True)
class NamedTarget:
    """An upload target the operator configured: a local folder or ``s3://`` with its endpoint."""

    name: str
    target: str
    endpoint: str | None


def parse_upload_targets(text: str | None) -> dict[str, NamedTarget]:
    """``"backup=s3://b/p@https://s3.example.com, local=/srv/up"`` -> the named targets.

    Entries are separated by spaces or commas; ``@`` followed by an ``http(s)://`` URL at the end
    of an ``s3://`` target is its endpoint. A malformed entry raises ``ConfinementError`` naming
    ``PHOTOJOBS_UPLOAD_TARGETS``."""
    from photos.upload import parse_target

    out: dict[str, NamedTarget] = {}
    for entry in re.split(r"[\s,]+", text or ""):
        if not entry:
            continue
        name, sep, spec = entry.partition("=")
        if not sep or not _TARGET_NAME_RE.fullmatch(name) or not spec:
            raise ConfinementError(
                f"{UPLOAD_TARGETS_ENV}: {entry!r} is not NAME=s3://bucket/prefix[@https://endpoint] "
                "or NAME=/folder (names: letters, digits, '_', '.', '-')"
            )
        endpoint: str | None = None
        head, at, tail = spec.rpartition("@")
        if at and spec.startswith("s3://") and re.match(r"https?://", tail):
            spec, endpoint = head, tail
        try:
            parse_target(spec, endpoint)
        except InvalidParameter as exc:
            raise ConfinementError(f"{UPLOAD_TARGETS_ENV}: target {name}: {exc}") from None
        if name in out:
            raise ConfinementError(f"{UPLOAD_TARGETS_ENV}: the name {name} is given twice")
        out[name] = NamedTarget(name, spec, endpoint)
    return out


def diagnostics_on(env: Mapping[str, str]) -> bool:
    """``PHOTOJOBS_DIAGNOSTICS`` is 1/true/yes/on."""
    raw = (env.get(DIAGNOSTICS_ENV) or "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ConfinementError(f"{DIAGNOSTICS_ENV} must be 1/true/on or 0/false/off, not {raw!r}")
