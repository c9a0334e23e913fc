"""Job parameters, named by lane (``exif.rating=5``), checked and normalised at submission.

An unknown or malformed parameter is refused with the list of valid ones, before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from photos.archive import parse_bundle_kind
from photos.clocks import parse_shift
from photos.errors import InvalidParameter
from photos.rename import validate_pattern
from photos.upload import parse_target

DEFAULT_RENAME_PATTERN = "{taken:%Y/%m/%Y-%m-%d_%H%M%S}_{camera}{ext}"


def _float(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidParameter(f"expected a number, got {value!r}") from None
    if number < 0:
        raise InvalidParameter(f"expected a non-negative number, got {value!r}")
    return number


def _int(lo: int, hi: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        try:
            number = int(str(value).strip())
        except ValueError:
            raise InvalidParameter(f"expected a whole number {lo}-{hi}, got {value!r}") from None
        if not lo <= number <= hi:
            raise InvalidParameter(f"expected a whole number {lo}-{hi}, got {value!r}")
        return number

    return parse


def _text(value: Any) -> str:
    return str(value)


def _keywords(value: Any) -> list[str]:
    items = value if isinstance(value, list) else str(value).split(",")
    return [str(k).strip() for k in items if str(k).strip()]


def _keyword_mode(value: Any) -> str:
    text = str(value).strip().lower()
    if text not in ("add", "replace"):
        raise InvalidParameter(f"expected add or replace, got {value!r}")
    return text


def _shift(value: Any) -> str:
    parse_shift(str(value))
    return str(value)


def _pattern(value: Any) -> str:
    validate_pattern(str(value))
    return str(value)


def _upload_target(value: Any) -> str:
    parse_target(str(value))
    return str(value)


def _target_name(value: Any) -> str:
    text = str(value).strip()
    if not text:
        raise InvalidParameter("expected the name of a configured upload target, got an empty value")
    return text


def _bundle(value: Any) -> str:
    return parse_bundle_kind(str(value))


def _folder(value: Any) -> str:
    text = str(value).strip()
    if not text:
        raise InvalidParameter("expected a folder path, got an empty value")
    return text


# Recorded by the submission (never accepted from a request: no lane is called "job"): the real
# folders a confined job may read and write (photo roots and output roots); the workers re-check
# every destination against them at the moment of use.
ALLOWED_ROOTS_KEY = "job.allowed_roots"
#: The parameters naming a local folder a job writes into besides its photo roots.
DESTINATIONS = ("archive.root", "upload.target")


def job_roots(roots: Iterable[str], params: Mapping[str, Any]) -> list[Path]:
    """The real folders a job's file effects may change (``photos.rootfs.Roots``): its photo roots
    (recorded resolved at submission), its archive root and its local upload folder — recorded
    resolved for a confined job, resolved now for an operator's own (unconfined) one."""
    found = [Path(r) for r in roots]
    confined = ALLOWED_ROOTS_KEY in params
    for key in DESTINATIONS:
        value = params.get(key)
        if isinstance(value, str) and value and "://" not in value:
            found.append(Path(value) if confined else Path(value).expanduser().resolve())
    return found


# What the folder scan left out, by reason, recorded with the job (shown by status and the dashboard).
SKIPPED_KEY = "job.skipped"

# Parameters that can hurt or hog a worker: refused from the web API unless PHOTOJOBS_DIAGNOSTICS=1.
DIAGNOSTIC_PARAMS = ("noop.sleep", "noop.spin", "noop.crash_if", "noop.fail_if")


@dataclass(frozen=True)
class Param:
    parse: Callable[[Any], Any]
    help: str


KNOWN: dict[str, dict[str, Param]] = {
    "noop": {
        "sleep": Param(_float, "seconds each item waits, checking for stop requests (default 0)"),
        "spin": Param(_float, "seconds of pure-Python CPU work per item (diagnostics)"),
        "crash_if": Param(_text, "items whose path contains this text kill their worker (diagnostics)"),
        "fail_if": Param(_text, "items whose path contains this text raise an error (diagnostics)"),
    },
    "analysis": {
        "max_pixels": Param(_int(1, 2_000_000_000), "refuse images larger than this many pixels (200 MP)"),
        "dup_distance": Param(_int(0, 64), "phash distance for near-duplicate groups (default 6)"),
    },
    "exif": {
        "keywords": Param(
            _keywords, "comma-separated keywords, added to the photo's own (a|b|c is hierarchical)"
        ),
        "keywords_remove": Param(_keywords, "comma-separated keywords taken out of the photo's"),
        "keywords_mode": Param(
            _keyword_mode, "add (default) or replace: the photo's keywords become exactly exif.keywords"
        ),
        "description": Param(_text, "image description"),
        "rating": Param(_int(0, 5), "star rating 0-5"),
        "artist": Param(_text, "artist / creator"),
        "copyright": Param(_text, "copyright notice"),
        "shift": Param(_shift, "capture-time shift such as +1h, -30m, +1d2h"),
    },
    "rename": {
        "pattern": Param(
            _pattern, f"target path relative to the photo's root (default {DEFAULT_RENAME_PATTERN})"
        ),
    },
    "upload": {
        "target": Param(_upload_target, "a local folder (default <root>-uploads) or s3://bucket/prefix"),
        "endpoint": Param(_text, "S3-compatible endpoint URL (credentials from AWS_* environment)"),
        "target_name": Param(_target_name, "a target the operator named in PHOTOJOBS_UPLOAD_TARGETS"),
        "key": Param(_pattern, "key pattern (default: content-addressed {sha256[:2]}/{sha256}{ext})"),
    },
    "archive": {
        "root": Param(_folder, "archive folder (default <root>-archive); originals move into dated folders"),
        "bundle": Param(_bundle, "zip, tar or none (default): bundle the job's photos with a manifest"),
    },
}


def valid_names(lanes: Sequence[str]) -> list[str]:
    return sorted(f"{lane}.{name}" for lane in lanes for name in KNOWN.get(lane, {}))


def describe(lanes: Sequence[str]) -> str:
    return "; ".join(f"{lane}.{n}: {p.help}" for lane in lanes for n, p in KNOWN.get(lane, {}).items())


def validate_params(lanes: Sequence[str], params: Mapping[str, Any]) -> dict[str, Any]:
    """Refuse unknown parameters (or ones for a lane not in the job) and malformed values."""
    allowed = set(valid_names(lanes))
    bad = sorted(k for k in params if k not in allowed)
    if bad:
        listing = ", ".join(valid_names(lanes)) or "none for these lanes"
        raise InvalidParameter(
            f"unknown parameter(s) {', '.join(bad)} for lanes {','.join(lanes)}; valid: {listing}"
        )
    out: dict[str, Any] = {}
    for key, value in params.items():
        lane, _, name = key.partition(".")
        if not _is_text(value):
            raise InvalidParameter(
                f"parameter {key}={value!r}: holds a character that is not text (a byte that is not "
                "UTF-8, or a lone surrogate); it could be neither stored nor written to a photo"
            )
        try:
            out[key] = KNOWN[lane][name].parse(value)
        except InvalidParameter as exc:
            raise InvalidParameter(f"parameter {key}={value!r}: {exc}") from None
    if "upload.target_name" in out and ("upload.target" in out or "upload.endpoint" in out):
        raise InvalidParameter(
            "parameter upload.target_name names the whole target: drop upload.target and upload.endpoint"
        )
    if out.get("upload.endpoint") and not str(out.get("upload.target", "")).startswith("s3://"):
        raise InvalidParameter("parameter upload.endpoint needs an s3:// upload.target")
    return out


def _is_text(value: Any) -> bool:
    """Every string in ``value`` (a list's too) encodes as UTF-8 (the CLI's argv surrogate-escapes
    bytes that are not UTF-8; the web refuses lone surrogates before this, photojobs.web.text)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, list | tuple):
        return all(_is_text(v) for v in value)
    return True


def lane_params(params: Mapping[str, Any], lane: str) -> dict[str, Any]:
    """The parameters of one lane, without the lane prefix."""
    prefix = lane + "."
    return {k[len(prefix) :]: v for k, v in params.items() if k.startswith(prefix)}


def parse_param_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """``["exif.rating=5", …]`` -> dict, refusing a pair without ``=``."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidParameter(f"parameter {pair!r} is not KEY=VALUE")
        out[key.strip()] = value
    return out


def refuse_untrusted(params: Mapping[str, Any], *, diagnostics: bool) -> None:
    """What a web request may not ask for: an S3 endpoint or a raw ``s3://`` target (remote targets
    come from ``PHOTOJOBS_UPLOAD_TARGETS`` by name), and, unless ``diagnostics``, the fault
    parameters of the noop lane. Raises :class:`InvalidParameter` naming the parameter."""
    if "upload.endpoint" in params:
        raise InvalidParameter(
            "parameter upload.endpoint is not accepted over HTTP; the operator names remote targets "
            "in PHOTOJOBS_UPLOAD_TARGETS and a request picks one with upload.target_name"
        )
    target = str(params.get("upload.target", ""))
    if "://" in target or target.lower().startswith("s3:"):
        raise InvalidParameter(
            f"parameter upload.target={target!r}: remote targets are not accepted over HTTP; pick one "
            "the operator named in PHOTOJOBS_UPLOAD_TARGETS with upload.target_name"
        )
    asked = [k for k in DIAGNOSTIC_PARAMS if k in params]
    if asked and not diagnostics:
        raise InvalidParameter(
            f"parameter(s) {', '.join(asked)} are diagnostics, refused over HTTP unless the server "
            "runs with PHOTOJOBS_DIAGNOSTICS=1"
        )
