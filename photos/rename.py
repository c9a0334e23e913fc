"""Rename patterns: validate a pattern, render it for one photo, and plan collision-free names.

Everything here is pure except :func:`resolve_target`, which only reads the file system (to resolve
symlinks of existing parent directories). Moving files is the caller's job: it plans the names with
:func:`render` and :func:`plan_targets`, records them, then applies them atomically.

A pattern is a relative path with ``{fields}``::

    {taken:%Y/%m/%Y-%m-%d_%H%M%S}_{camera}{ext}

Each substituted value is sanitised (no path separators, NUL, control characters or leading dots;
unicode letters and spaces are kept), so a value can never add a directory level or leave the root;
only the literal text of the pattern and the strftime spec of ``{taken}`` may contain ``/``.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from photos.capture_time import FILE_TIME, CaptureTime, read_capture_time
from photos.capture_time import NONE as NONE_TAKEN
from photos.containment import check_relative
from photos.errors import OutsideRoot, PatternError, PhotoError

#: Valid ``{fields}`` and what they are replaced with.
FIELDS: dict[str, str] = {
    "taken": "capture time, format spec is strftime (default %Y-%m-%d_%H%M%S); falls back to file time",
    "camera": "make and model as a slug, e.g. canon-eos-r5 (unknown-camera if absent)",
    "make": "camera make as recorded",
    "model": "camera model as recorded",
    "lens": "lens model as recorded",
    "stem": "original file name without its extension",
    "name": "original file name with its extension",
    "ext": "lower-case extension with the dot, .jpeg becomes .jpg",
    "sha8": "first 8 hex digits of the content sha256",
    "width": "image width in pixels as displayed (orientations 5-8 swap the stored width and height)",
    "height": "image height in pixels as displayed",
}

EXAMPLE_PATTERN = "{taken:%Y/%m/%Y-%m-%d_%H%M%S}_{camera}{ext}"
DEFAULT_TAKEN_FORMAT = "%Y-%m-%d_%H%M%S"
UNKNOWN_CAMERA = "unknown-camera"
NOTE_FILE_TIME = "no capture time: used file time"
NOTE_UNKNOWN_CAMERA = f"no camera make/model: used {UNKNOWN_CAMERA}"

# strftime directives that give the same characters on every platform and never contain '/'.
_STRFTIME_OK = set("aAbBdHIjmMpSUwWyYGuVfz")
_INT_FIELDS = {"width", "height"}
_MAX_VALUE_CHARS = 64
_MAX_STEM_CHARS = 150
_MAX_COMPONENT_BYTES = 255
_ZERO_WIDTH_JOINERS = {"\u200c", "\u200d"}
_EXT_ALIASES = {".jpeg": ".jpg", ".jpe": ".jpg"}
_FORMAT_EXT = {
    "JPEG": ".jpg", "MPO": ".jpg", "PNG": ".png", "TIFF": ".tif", "WEBP": ".webp",
    "GIF": ".gif", "HEIF": ".heic", "HEIC": ".heic", "AVIF": ".avif", "BMP": ".bmp",
}

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class RenderResult:
    """A rendered relative path (posix separators, NFC) and notes about fallbacks that were used."""

    relpath: str
    notes: list[str] = field(default_factory=list)
    #: which source ``{taken}`` came from (``photos.capture_time``; "file time"), None without it
    taken_from: str | None = field(default=None, compare=False)


# --------------------------------------------------------------------------------------------- validate


def _valid_fields() -> str:
    return ", ".join("{" + name + "}" for name in sorted(FIELDS))


def _parse(pattern: str) -> list[tuple[str, str | None, str]]:
    """Split ``pattern`` into (literal, field, spec) triples, raising PatternError on any defect."""
    if not isinstance(pattern, str) or not pattern.strip():
        raise PatternError(f"rename pattern is empty; example: {EXAMPLE_PATTERN}")
    try:
        items = list(string.Formatter().parse(pattern))
    except ValueError as exc:
        raise PatternError(
            f"pattern {pattern!r}: {exc} (write '{{{{' and '}}}}' for literal braces)"
        ) from None
    parts: list[tuple[str, str | None, str]] = []
    for literal, name, spec, conversion in items:
        if name is None:
            parts.append((literal, None, ""))
            continue
        if name == "":
            raise PatternError(f"pattern {pattern!r}: empty field '{{}}'; valid fields: {_valid_fields()}")
        if name not in FIELDS:
            hint = " (collisions get _1, _2 suffixes automatically)" if name == "seq" else ""
            raise PatternError(
                f"pattern {pattern!r}: unknown field {{{name}}}{hint}; valid fields: {_valid_fields()}"
            )
        if conversion:
            raise PatternError(f"pattern {pattern!r}: field {{{name}}} has a '!{conversion}' conversion; "
                               "conversions are not supported")
        spec = spec or ""
        _check_spec(pattern, name, spec)
        parts.append((literal, name, spec))
    _check_skeleton(pattern, parts)
    return parts


def _check_spec(pattern: str, name: str, spec: str) -> None:
    if "{" in spec or "}" in spec:
        raise PatternError(f"pattern {pattern!r}: field {{{name}}} has a nested field in its format spec")
    if name == "taken":
        if not spec:
            return
        i = 0
        while i < len(spec):
            if spec[i] == "%":
                directive = spec[i + 1: i + 2]
                if directive not in _STRFTIME_OK or not directive:
                    raise PatternError(
                        f"pattern {pattern!r}: {{taken:{spec}}} has an unsupported strftime directive "
                        f"'%{directive}'; use one of: " + " ".join("%" + d for d in sorted(_STRFTIME_OK))
                    )
                i += 2
            else:
                i += 1
        if "%" not in spec:
            raise PatternError(f"pattern {pattern!r}: {{taken:{spec}}} has no strftime directive such as %Y")
        return
    sample: Any = 4000 if name in _INT_FIELDS else "sample"
    try:
        format(sample, spec)
    except (ValueError, TypeError) as exc:
        kind = "an integer" if name in _INT_FIELDS else "a string"
        raise PatternError(
            f"pattern {pattern!r}: bad format spec {spec!r} for {{{name}}} ({kind}): {exc}"
        ) from None


def _check_skeleton(pattern: str, parts: list[tuple[str, str | None, str]]) -> None:
    """Check the path shape with every field replaced by a placeholder (taken's spec kept)."""
    pieces: list[str] = []
    for literal, name, spec in parts:
        pieces.append(literal)
        if name == "taken":
            pieces.append(re.sub(r"%.", "0", spec or DEFAULT_TAKEN_FORMAT))
        elif name is not None:
            pieces.append("x")
    skeleton = "".join(pieces)
    literal_percent = next((lit for lit, _, _ in parts if "%" in lit), None)
    if literal_percent is not None:
        raise PatternError(
            f"pattern {pattern!r}: '%' is allowed only in {{taken:…}}'s strftime directives such as %Y "
            "(a '%' in a name is read as a format code by tools such as exiftool)"
        )
    bad = [c for c in skeleton if unicodedata.category(c) == "Cc"]
    if bad:
        raise PatternError(f"pattern {pattern!r}: contains control character {bad[0]!r}")
    if "\\" in skeleton:
        raise PatternError(f"pattern {pattern!r}: contains a backslash; use '/' to separate folders")
    if skeleton.startswith("/"):
        raise PatternError(f"pattern {pattern!r}: is absolute; it must be relative to the output root")
    if skeleton.startswith("~"):
        raise PatternError(f"pattern {pattern!r}: starts with '~'; it must be relative to the output root")
    for component in skeleton.split("/"):
        if component == "..":
            raise PatternError(f"pattern {pattern!r}: has a '..' component; it must stay inside the root")
        if component == ".":
            raise PatternError(f"pattern {pattern!r}: has a '.' component; remove it")
        if component == "":
            raise PatternError(f"pattern {pattern!r}: has an empty path component ('//' or a trailing '/')")


def validate_pattern(pattern: str) -> None:
    """Raise :class:`PatternError` unless ``pattern`` is a valid rename/key pattern.

    Refused: empty patterns, absolute paths, ``..``/``.``/empty components, backslashes, control
    characters, a ``%`` outside ``{taken:…}``'s strftime directives (``%%`` too), unknown fields
    (the message lists the valid ones), conversions, nested fields,
    strftime directives outside a portable set, format specs that do not apply to the field.
    """
    _parse(pattern)


# ------------------------------------------------------------------------------------------- sanitise


def sanitize_value(value: str, max_chars: int = _MAX_VALUE_CHARS) -> str:
    """Make ``value`` safe to use inside one path component.

    Unicode letters, digits, punctuation and single spaces are kept (NFC-normalised); ``/`` and
    ``\\`` become ``-``; NUL, control and line-separator characters become spaces; invisible format
    characters (bidi overrides) are dropped; whitespace runs collapse; leading dots and spaces and
    trailing spaces are stripped; the result is cut to ``max_chars``. May return ``""``.
    """
    text = unicodedata.normalize("NFC", value)
    out: list[str] = []
    for ch in text:
        category = unicodedata.category(ch)
        if ch in "/\\":
            out.append("-")
        elif category in ("Cc", "Zl", "Zp"):
            out.append(" ")
        elif category == "Cf" and ch not in _ZERO_WIDTH_JOINERS:
            continue
        else:
            out.append(ch)
    cleaned = re.sub(r"\s+", " ", "".join(out)).strip().lstrip(". ")
    return cleaned[:max_chars].rstrip(" ")


def camera_slug(make: str | None, model: str | None) -> str | None:
    """Slug of make and model (``Canon``, ``Canon EOS R5`` → ``canon-eos-r5``), or None if both absent.

    The make is dropped when the model already starts with the make's first word
    (``NIKON CORPORATION`` + ``NIKON Z 6`` → ``nikon-z-6``).
    """
    make = (make or "").strip()
    model = (model or "").strip()
    if make and model:
        first = make.split()[0].casefold()
        text = model if model.casefold().startswith(first) else f"{make} {model}"
    else:
        text = make or model
    slug = re.sub(r"[\W_]+", "-", unicodedata.normalize("NFC", text).casefold()).strip("-")
    return slug[:_MAX_VALUE_CHARS].strip("-") or None


def normalize_ext(original: Path | str, fmt: str | None = None) -> str:
    """Lower-case extension with the dot (``.JPEG`` → ``.jpg``); from ``fmt`` if the name has none."""
    body = _ext_body(PurePosixPath(str(original).replace("\\", "/")).suffix).lower()
    if body:
        return _EXT_ALIASES.get("." + body, "." + body)
    return _FORMAT_EXT.get((fmt or "").upper(), "")


def _ext_body(suffix: str) -> str:
    """The sanitised extension of a ``Path.suffix`` without its dot ("" if none)."""
    return sanitize_value(suffix[1:], 16) if suffix.startswith(".") else ""


def _text_fact(facts: Mapping[str, Any], key: str) -> str | None:
    value = facts.get(key)
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    text = sanitize_value(str(value))
    return text or None


def capture_time(facts: Mapping[str, Any], file_mtime: float) -> tuple[datetime, list[str]]:
    """The capture time from ``facts['taken']`` (ISO or EXIF ``YYYY:MM:DD HH:MM:SS``), else the file time.

    The file time is converted to local time (cameras record local time too). Returns the time and
    the notes about the fallback (empty when the capture time was used).
    """
    raw = facts.get("taken")
    if raw:
        text = str(raw).strip()
        for parse in (datetime.fromisoformat, lambda s: datetime.strptime(s, "%Y:%m:%d %H:%M:%S")):
            try:
                return parse(text), []
            except ValueError:
                continue
        note = f"unreadable capture time {text!r}: used file time"
    else:
        note = NOTE_FILE_TIME
    return datetime.fromtimestamp(file_mtime), [note]


def taken_now(
    path: Path | str, default: str | None = None, *, located: Path | str | None = None
) -> str | None:
    """The capture time the photo's own file (and sidecar) says now, ISO, or None: see
    :func:`capture_taken_now`."""
    return capture_taken_now(path, default, located=located).taken


def capture_taken_now(
    path: Path | str, default: str | None = None, *, located: Path | str | None = None
) -> CaptureTime:
    """The capture time the photo says now, from every source in ``photos.capture_time``'s priority.

    One clock per photo: a lane that names or files a photo by its time reads it here, after every
    earlier lane of the job (an exif shift) wrote the file, not from an analysis made before. Only
    headers are read (no pixels are decoded). ``path`` is where its bytes are read (a pinned name),
    ``located`` its real path (where its sidecars are). ``taken`` None (source "file time") when no
    source has one; ``default`` (what the caller knew) when the file's metadata cannot be read."""
    try:
        return read_capture_time(path, located=located)
    except Exception:  # unreadable metadata: keep what the caller knew
        return CaptureTime(default, None, "analysis") if default else NONE_TAKEN


# --------------------------------------------------------------------------------------------- render


class _Values:
    """Computes field values for one photo on demand and collects notes about fallbacks."""

    def __init__(self, facts: Mapping[str, Any], original: Path, file_mtime: float) -> None:
        self.facts = facts
        self.original = Path(original)
        self.file_mtime = file_mtime
        self.notes: list[str] = []
        self.taken_from: str | None = None

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def get(self, name: str, spec: str) -> str:
        if name == "taken":
            taken, notes = capture_time(self.facts, self.file_mtime)
            for text in notes:
                self.note(text)
            self.taken_from = FILE_TIME if notes else str(self.facts.get("taken_from") or "analysis")
            return taken.strftime(spec or DEFAULT_TAKEN_FORMAT)
        if name in _INT_FIELDS:
            value = displayed(self.facts, name)
            if isinstance(value, bool) or not isinstance(value, int):
                self.note(f"no {name}: used unknown-{name}")
                return f"unknown-{name}"
            return sanitize_value(format(value, spec))
        if name == "ext":  # built from a sanitised body; a file without an extension has none
            return format(self._text(name), spec).replace("/", "-")
        return sanitize_value(format(self._text(name), spec)) or self._missing(name)

    def _missing(self, name: str) -> str:
        if name == "camera":
            self.note(NOTE_UNKNOWN_CAMERA)
            return UNKNOWN_CAMERA
        self.note(f"no {name}: used unknown-{name}")
        return f"unknown-{name}"

    def _text(self, name: str) -> str:
        facts, original = self.facts, self.original
        if name == "camera":
            return camera_slug(_text_fact(facts, "make"), _text_fact(facts, "model")) or ""
        if name in ("make", "model", "lens"):
            return _text_fact(facts, name) or ""
        if name == "stem":
            return sanitize_value(original.stem, _MAX_STEM_CHARS) or ""
        if name == "name":
            body = _ext_body(original.suffix)
            stem = sanitize_value(original.stem if body else original.name, _MAX_STEM_CHARS)
            return (stem + ("." + body if body else "")) if stem else ""
        if name == "ext":
            return normalize_ext(original, facts.get("format"))
        if name == "sha8":
            sha = str(facts.get("sha256") or "")
            if not re.fullmatch(r"[0-9a-fA-F]{64}", sha):
                raise PhotoError(
                    original, f"analysis has no valid sha256 (got {sha!r}); cannot render {{sha8}}"
                )
            return sha[:8].lower()
        raise AssertionError(f"unhandled field {name}")  # pragma: no cover - FIELDS and this agree


def check_relpath(relpath: str) -> None:
    """Raise :class:`PatternError` unless ``relpath`` is a safe relative posix path.

    Safe means: non-empty, not absolute, no backslash or control character, no empty, ``.`` or
    ``..`` component, and every component at most 255 bytes in UTF-8.
    """
    if not relpath:
        raise PatternError("path is empty")
    if relpath.startswith("/"):
        raise PatternError(f"path {relpath!r} is absolute; it must be relative to the root")
    if "\\" in relpath:
        raise PatternError(f"path {relpath!r} contains a backslash")
    if any(unicodedata.category(c) == "Cc" for c in relpath):
        raise PatternError(f"path {relpath!r} contains a control character")
    for component in relpath.split("/"):
        if component in ("", ".", ".."):
            raise PatternError(f"path {relpath!r} has a {component or 'empty'!r} component")
        if len(component.encode("utf-8")) > _MAX_COMPONENT_BYTES:
            raise PatternError(f"path {relpath!r}: component {component[:40]!r}... is longer than 255 bytes")


def render(pattern: str, facts: Mapping[str, Any], original: Path, file_mtime: float) -> RenderResult:
    """Render ``pattern`` for one photo.

    ``facts`` is the analysis dict (``taken`` ISO string or None, ``make``, ``model``, ``lens``,
    ``sha256``, ``width``, ``height``, ``format``); ``original`` is the photo's current path and
    ``file_mtime`` its modification time (used when there is no capture time). Missing values fall
    back (``taken`` → file time, ``camera`` → ``unknown-camera``, others → ``unknown-<field>``) with
    a note each. Raises :class:`PatternError` for a bad pattern and :class:`PhotoError` when the
    result would not be a safe relative path (e.g. a component longer than 255 bytes).
    """
    parts = _parse(pattern)
    values = _Values(facts, Path(original), file_mtime)
    pieces: list[str] = []
    for literal, name, spec in parts:
        pieces.append(literal)
        if name is not None:
            pieces.append(values.get(name, spec))
    relpath = unicodedata.normalize("NFC", "".join(pieces))
    try:
        check_relpath(relpath)
    except PatternError as exc:
        raise PhotoError(original, f"pattern {pattern!r} rendered an unusable path: {exc}") from None
    return RenderResult(relpath=relpath, notes=values.notes, taken_from=values.taken_from)


def displayed(facts: Mapping[str, Any], name: str) -> Any:
    """``width`` or ``height`` as the photo is shown: ``display_width``/``display_height`` where the
    facts have them, else the stored size swapped for orientations 5-8 (facts recorded before)."""
    shown = facts.get(f"display_{name}")
    if shown is not None:
        return shown
    if facts.get("orientation") in (5, 6, 7, 8):
        return facts.get("height" if name == "width" else "width")
    return facts.get(name)


# ------------------------------------------------------------------------------------- targets / plan


def resolve_target(root: Path, relpath: str) -> Path:
    """The absolute target for ``relpath`` under ``root``, refusing anything that leaves ``root``.

    Symlinks of the root and of existing parent directories are resolved; if the result is not
    inside the resolved root, :class:`OutsideRoot` is raised. The returned path has resolved
    parents and the unresolved final name. A symlink created after this check is not detected
    here: the caller re-checks at apply time.
    """
    try:
        check_relpath(relpath)
    except PatternError as exc:
        raise OutsideRoot(relpath, f"not a safe relative path: {exc}") from None
    return check_relative(root, relpath)


_EXT_RE = re.compile(r"^(?P<base>.+?)(?P<ext>\.[A-Za-z0-9]{1,5})$")


def with_suffix(relpath: str, n: int) -> str:
    """Collision name ``n`` for ``relpath``: ``a/x_canon.jpg`` → ``a/x_canon_1.jpg`` (``n=0``: unchanged).

    The suffix goes before the last extension (a final ``.`` part of 1-5 ASCII letters/digits) or at
    the end of the name when there is none.
    """
    if n < 0:
        raise ValueError(f"collision number must be >= 0, got {n}")
    if n == 0:
        return relpath
    head, sep, name = relpath.rpartition("/")
    match = _EXT_RE.match(name)
    name = f"{match['base']}_{n}{match['ext']}" if match else f"{name}_{n}"
    return f"{head}{sep}{name}"


def _fold(name: str, case_insensitive: bool) -> str:
    name = unicodedata.normalize("NFC", name)
    return name.casefold() if case_insensitive else name


def plan_targets(
    entries: Iterable[tuple[K, str]], taken: Iterable[str], case_insensitive: bool = False
) -> dict[K, str]:
    """Assign each entry a collision-free relpath, deterministically.

    Entries are processed in key order (keys must be unique and mutually comparable), so the result
    does not depend on input order: the first entry keeps its name, later ones with the same name get
    ``_1``, ``_2`` … (:func:`with_suffix`), skipping any name already in ``taken`` (existing files or
    names reserved by earlier plans, in the same relpath form) or assigned to an earlier entry.
    Names compare after NFC normalisation; with ``case_insensitive`` also case-folded (for
    case-insensitive file systems).
    """
    ordered = sorted(entries, key=lambda item: item[0])
    used = {_fold(name, case_insensitive) for name in taken}
    plan: dict[K, str] = {}
    for key, relpath in ordered:
        if key in plan:
            raise ValueError(f"duplicate key {key!r} in plan_targets entries")
        n = 0
        while _fold(with_suffix(relpath, n), case_insensitive) in used:
            n += 1
        name = with_suffix(relpath, n)
        used.add(_fold(name, case_insensitive))
        plan[key] = name
    return plan


def burst_suffix(rank: int, free: Callable[[str], bool], relpath: str, limit: int = 10_000) -> int:
    """The collision number (:func:`with_suffix`) the ``rank``-th shot of a burst takes: the burst
    takes the names ``relpath``, ``_1``, ``_2`` … that are ``free`` (not held by a file outside the
    burst) in its sub-second order, whichever shot runs first. ``limit`` when there is none."""
    slot = 0
    for n in range(limit):
        if free(with_suffix(relpath, n)):
            if slot == rank:
                return n
            slot += 1
    return limit

