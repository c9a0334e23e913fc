"""exiftool's warnings, classified the same way whether a file is read or written: a policy, not
a blanket refusal (the README's warning table is this one).

===========================================  ================================================
warning                                      what photojobs does
===========================================  ================================================
``[minor]`` saying exiftool *fixed* it        written; the item's result lists it
(``Fixed incorrect URI for xmlns:…``,        (``exiftool_fixed``)
``Entries in IFD0 were out of sequence.
Fixed.``, ``Adjusted MakerNotes base by 8``,
``… found after PNG IDAT (fixed)``, the JXL
codestream wrapped)
``IPTCDigest is not current. XMP may be out   written: the edit's fields go to IPTC and XMP alike
of sync`` (another app touched the file       and the digest is renewed (as Lightroom does); the
after Photoshop)                             result lists it (``exiftool_fixed``)
any other ``[minor]`` warning exiftool        written as exiftool writes it; the result lists it
recovers from (an empty XMP list such as      (``exiftool_warned``)
darktable's ``history``, PNG text after the
image data, a duplicate XMP property, an
IPTC value over its length)
``[minor]`` about maker notes or a bad       refused: exiftool could not keep their offsets,
directory (``Maker notes could not be        the camera's notes (or that directory) would be
parsed``, ``Bad MakerNoteNikon directory``)  lost
``Sorry, GROUP:TAG … isn't writable``         a clock the shift asked for: left as it is and
                                             named (``unshifted``); any other tag: refused
anything else (``Bad IFD0 directory``,        refused: what the file says cannot be read or
``Invalid date/time``, …)                     written safely, nothing is written (PhotoError)
===========================================  ================================================

Reading a file that is never written (a raw, for its capture time) only needs the serious ones
absent. exiftool's ``Error:`` lines never reach here: :class:`photos.exiftool.ExifTool` raises them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MINOR = "[minor]"
#: What a warning says when exiftool fixed the problem itself (after ``[minor]``).
_FIXED = re.compile(
    r"^(?:\[minor\] )?(?:Fixed |Entries in .* were out of sequence\. Fixed|Adjusted .* by |"
    r"Possibly incorrect maker notes offsets \(fixed by|Will wrap JXL codestream|Wrapped JXL codestream|"
    r".*\(fixed\)$)",
    re.IGNORECASE,
)
#: [minor] warnings that still refuse: exiftool could not keep the maker notes (their offsets), or
#: found a directory it cannot read (``[minor] Bad MakerNoteNikon directory``): a write would lose it.
_MINOR_REFUSED = re.compile(r"maker ?note|\bBad .* directory", re.IGNORECASE)
#: Photoshop's digest of the IPTC block no longer matches it: renewed by the write.
STALE_DIGEST = re.compile(r"^IPTCDigest is not current", re.IGNORECASE)
_PREFIX = re.compile(r"^(?:Warning|Error):\s*")
_UNWRITABLE = re.compile(r"^Sorry, (\S+?) (?:doesn't exist or isn't writable|is not writable)\b")


@dataclass
class Messages:
    """One command's warnings, by kind (each without ``Warning:`` and the trailing file name)."""

    fixed: list[str] = field(default_factory=list)  # [minor]: exiftool fixed or worked around it
    recovered: list[str] = field(default_factory=list)  # other [minor]: written as exiftool writes it
    minor: list[str] = field(default_factory=list)  # [minor] about maker notes: a write would lose them
    stale_digest: bool = False  # "IPTCDigest is not current": the write renews it
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
        elif STALE_DIGEST.match(text):
            out.stale_digest = True
            text, target = "IPTCDigest was not current (XMP may have been out of sync): renewed", out.fixed
        elif MINOR in text.lower():
            target = out.minor if _MINOR_REFUSED.search(text) else out.recovered
        elif unwritable:
            text, target = unwritable.group(1), out.unwritable
        else:
            target = out.serious
        if text not in target:
            target.append(text)
    return out
