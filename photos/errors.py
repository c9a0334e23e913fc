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
