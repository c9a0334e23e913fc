"""Job parameters, named by lane (``exif.rating=5``): validated at submission against this list."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from photos.errors import InvalidParameter

# lane -> {parameter: description}
KNOWN: dict[str, dict[str, str]] = {
    "noop": {
        "sleep": "seconds each item waits, checking for stop requests (default 0)",
        "spin": "seconds of pure-Python CPU work per item",
        "crash_if": "items whose path contains this text kill their worker (diagnostics)",
        "fail_if": "items whose path contains this text raise an error (diagnostics)",
    },
}


def valid_names(lanes: Sequence[str]) -> list[str]:
    return sorted(f"{lane}.{name}" for lane in lanes for name in KNOWN.get(lane, {}))


def validate_params(lanes: Sequence[str], params: Mapping[str, Any]) -> dict[str, Any]:
    """Refuse unknown parameters (or ones for a lane not in the job), listing the valid ones."""
    allowed = set(valid_names(lanes))
    bad = [k for k in params if k not in allowed]
    if bad:
        listing = ", ".join(valid_names(lanes)) or "none"
        raise InvalidParameter(
            f"unknown parameter(s) {', '.join(sorted(bad))} for lanes {','.join(lanes)}; valid: {listing}"
        )
    return dict(params)


def parse_param_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """``["exif.rating=5", …]`` -> dict, refusing a pair without ``=``."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidParameter(f"parameter {pair!r} is not KEY=VALUE")
        out[key.strip()] = value
    return out
