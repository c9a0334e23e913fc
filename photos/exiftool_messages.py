"""exiftool's warnings, classified the same way whether a file is read or written.

- a ``[minor]`` warning saying exiftool *fixed* something by itself (``[minor] Fixed incorrect URI
  for xmlns:MicrosoftPhoto``, ``Entries in IFD0 were out of sequence. Fixed.``, ``Adjusted
  MakerNotes base by 8``), and the JPEG XL codestream it wraps in its container when asked to:
  not a refusal; the item's result records it (``exiftool_fixed``).
- any other ``[minor]`` warning (``Maker notes could not be parsed``: exiftool could not fix their
  offsets) refuses a write as a serious one does; reading a file that is never written (a raw,
  for its capture time) only needs the serious ones absent.
- ``Sorry, GROUP:TAG doesn't exist or isn't writable``: a tag exiftool reads but cannot write (a
  vendor's clock such as ``Samsung:TimeStamp``). A clock the shift asked for is left as it is and
  reported (``unshifted``); any other tag is a refusal.
- anything else (``Bad IFD0 directory``, ``Invalid date/time``, …): what the file says cannot be
  read or written safely, so nothing is written (PhotoError naming the file).

exiftool's ``Error:`` lines never reach here: :class:`photos.exiftool.ExifTool` raises them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MINOR = "[minor]"
#: What a warning says when exiftool fixed the problem itself (after ``[minor]``).
_FIXED = re.compile(
    r"^(?:\[minor\] )?(?:Fixed |Entries in .* were out of sequence\. Fixed|Adjusted .* by |"
    r"Possibly incorrect maker notes offsets \(fixed by|Will wrap JXL codestream|Wrapped JXL codestream)",
    re.IGNORECASE,
)
_PREFIX = re.compile(r"^(?:Warning|Error):\s*")
_UNWRITABLE = re.compile(r"^Sorry, (\S+?) (?:doesn't exist or isn't writable|is not writable)\b")


@dataclass
class Messages:
    """One command's warnings, by kind (each without ``Warning:`` and the trailing file name)."""

    fixed: list[str] = field(default_factory=list)  # [minor]: exiftool fixed or worked around it
    minor: list[str] = field(default_factory=list)  # other [minor]: a write could lose something
    unwritable: list[str] = field(default_factory=list)  # tags (GROUP:TAG) exiftool cannot write
    serious: list[str] = field(default_factory=list)  # anything else: nothing is written

    def refusal(self, allowed_unwritable: frozenset[str] | set[str] = frozenset()) -> str | None:
        """Why the file is refused, or None: a serious warning, or an unwritable tag that is not
        one of ``allowed_unwritable`` (the clocks a shift may leave alone)."""
        blocking = [*self.serious, *self.minor]
        blocking += [
            f"Sorry, {tag} isn't writable" for tag in self.unwritable if tag not in allowed_unwritable
        ]
        return "; ".join(blocking) or None


def _text(line: str, paths: tuple[str, ...]) -> str:
    text = _PREFIX.sub("", line.strip())
    for path in paths:
        text = text.removesuffix(f" - {path}")
    return text


def classify(warnings: list[str], *paths: str) -> Messages:
    """Sort exiftool's ``Warning:`` lines; ``paths`` are file names exiftool appends (`` - PATH``),
    stripped from the text. The same warning said twice (read, then write) is kept once."""
    out = Messages()
    for line in warnings:
        text = _text(line, paths)
        if not text:
            continue
        unwritable = _UNWRITABLE.match(text)
        if _FIXED.match(text):
            target = out.fixed
        elif MINOR in text.lower():
            target = out.minor
        elif unwritable:
            text, target = unwritable.group(1), out.unwritable
        else:
            target = out.serious
        if text not in target:
            target.append(text)
    return out
