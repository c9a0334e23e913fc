"""Errors raised by the photo work. Each names the file and what was wrong with it."""

from __future__ import annotations

from pathlib import Path


class PhotoError(Exception):
    """A photo could not be processed. ``path`` is the file, ``reason`` says why.

    Raised for bad input (corrupt, missing, unreadable, too large, unsupported);
    the item fails with ``str(error)`` as its error and nothing on disk changes.
    """

    def __init__(self, path: str | Path | None, reason: str) -> None:
        self.path = str(path) if path is not None else None
        self.reason = reason
        super().__init__(f"{self.path}: {reason}" if self.path else reason)


class UnreadableImage(PhotoError):
    """The file is missing, empty, truncated, not an image, or a decompression bomb."""


class NeedsExiftool(PhotoError):
    """The format can only be written losslessly through exiftool, which is not installed."""


class InvalidParameter(ValueError):
    """A job parameter is unknown or malformed; the message lists the valid ones."""


class PatternError(InvalidParameter):
    """A rename/key pattern is malformed or would leave the job's root (``..``, absolute path)."""


class OutsideRoot(PhotoError):
    """A path resolved outside the roots the job was given."""


def describe_content(head: bytes, size: int) -> str:
    """What a file that is not an image looks like, without quoting any of it (an error must never
    carry a file's content): "empty file", "text, not an image" or "N bytes, not a recognised image
    format"."""
    if size == 0 or not head:
        return "empty file"
    sample = head[:512]
    printable = sum(1 for b in sample if 32 <= b < 127 or b in b"\t\r\n")
    if b"\x00" not in sample and printable >= 0.9 * len(sample):
        return "text, not an image"
    return f"{size} bytes, not a recognised image format"
