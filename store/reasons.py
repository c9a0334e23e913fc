"""Reason classes: an item error with its paths, numbers and ids normalised away, so failures
that are "the same" (one missing tool, one corrupt format) group together whatever the photo."""

from __future__ import annotations

import re
from collections.abc import Iterable

# A path: optional drive / ~ / . / .. prefix, then at least one slash-separated part.
_PATH = re.compile(r"(?:(?<=\s)|(?<=^)|(?<=[('\"=\[]))(?:[A-Za-z]:)?(?:~|\.{1,2})?/[^\s'\",;:)\]]*")
_BYTES = re.compile(r"b'(?:[^'\\]|\\.)*'|b\"(?:[^\"\\]|\\.)*\"")
_QUOTED_PATH = re.compile(r"'[^']*/[^']*'|\"[^\"]*/[^\"]*\"")
_HEX = re.compile(r"\b(?:0x)?[0-9a-fA-F]{8,}\b")
_NUMBER = re.compile(r"(?<![A-Za-z_])[-+]?\d+(?:[.,]\d+)*(?:[eE][-+]?\d+)?")
_SPACES = re.compile(r"\s+")


def reason_class(error: str | None, paths: Iterable[str | None] = ()) -> str:
    """``"/p/a.jpg: truncated at byte 1234"`` -> ``"<path>: truncated at byte <n>"``.

    Known paths (the item's photo) are replaced first, so a path with spaces is recognised whole;
    then byte strings (a file's first bytes), quoted and bare paths, long hex ids (hashes, uuids),
    and numbers.
    """
    text = (error or "unknown error").strip() or "unknown error"
    for p in sorted((p for p in paths if p), key=len, reverse=True):
        text = text.replace(p, "<path>")
    text = _BYTES.sub("<bytes>", text)
    text = _QUOTED_PATH.sub("<path>", text)
    text = _PATH.sub("<path>", text)
    text = _HEX.sub("<id>", text)
    text = _NUMBER.sub("<n>", text)
    text = _SPACES.sub(" ", text)
    return text[:300]
