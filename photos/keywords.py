"""Keywords: what a file's keyword list is, and where an edit of it is written.

**The XMP list is the truth** (``dc:subject``, and ``lr:hierarchicalSubject`` for hierarchical
keywords): its entries come first, in their spelling. IPTC ``Keywords`` and EXIF ``XPKeywords`` are
derived from the list, rewritten whole from it whenever it changes; they are lossy copies and never
read back as keywords of their own: IPTC cuts a keyword at 64 bytes, and ``XPKeywords`` is UCS-2
(``🏖️`` comes back as ``\\uf3d6\\ufe0f``). A keyword that only IPTC or ``XPKeywords`` holds (a
tool that writes only there: Picasa, Windows) is kept, added after XMP's, unless it is a lossy copy
of another keyword (the file's list never loses a keyword, never gains a mangled one).

Keywords compare **case-insensitively** (``Beach`` and ``beach`` are one keyword, the first
spelling kept, as Lightroom does). A hierarchical keyword ``Places|Ireland|Dublin`` goes whole to
``lr:hierarchicalSubject`` and its leaf ``Dublin`` to the flat lists. A removal takes the keyword out
of every store that lists keywords: the flat lists, ``lr:hierarchicalSubject``, and the lists other
tools keep beside them (``MicrosoftPhoto:LastKeywordXMP``/``LastKeywordIPTC``,
``mediapro:CatalogSets``, ``digiKam:TagsList``), which are otherwise left as they are. So N jobs that
add and remove keywords leave exactly what one job with the same net change would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from photos.errors import InvalidParameter
from photos.iptc import iptc_cut

#: Separator of a hierarchical keyword (``Places|Ireland|Dublin``), as Lightroom and digiKam write it.
HIERARCHY = "|"
KEYWORD_MODES = ("add", "replace")
#: The keyword stores read before an edit (``-j -G1 -a``), beside ``-IPTC:all`` and ``-EXIF:all``.
KEYWORD_TAGS = (
    "-XMP-dc:Subject",
    "-XMP-lr:HierarchicalSubject",
    "-XMP-microsoft:LastKeywordXMP",
    "-XMP-microsoft:LastKeywordIPTC",
    "-XMP-mediapro:CatalogSets",
    "-XMP-digiKam:TagsList",
)
#: Lists of keywords other tools keep (and their level separator): a removal removes from them too.
OTHER_LISTS = (
    ("XMP-microsoft:LastKeywordXMP", "/"),
    ("XMP-microsoft:LastKeywordIPTC", "/"),
    ("XMP-mediapro:CatalogSets", "|"),
    ("XMP-digiKam:TagsList", "/"),
)
_EXIF_GROUPS = ("IFD0", "IFD1", "ExifIFD", "SubIFD", "GPS", "InteropIFD")


def clean_keywords(name: str, keywords: Any) -> list[str]:
    """Stripped, non-empty keywords in their order, without case-insensitive duplicates (the first
    spelling kept); a hierarchical one as ``a|b|c``."""
    if isinstance(keywords, str) or not isinstance(keywords, (list, tuple)):
        raise InvalidParameter(f"{name} must be a list of strings, got {keywords!r}")
    cleaned: list[str] = []
    for raw in keywords:
        if not isinstance(raw, str):
            raise InvalidParameter(f"{name} must be a list of strings, got {keywords!r}")
        kw = raw.strip()
        if not kw:
            continue
        if ";" in kw or has_control(kw, allow_newline=False):
            raise InvalidParameter(f"keyword {kw!r} may not contain ';' or control characters")
        if HIERARCHY in kw:
            parts = [part.strip() for part in kw.split(HIERARCHY)]
            if not all(parts):
                raise InvalidParameter(
                    f"hierarchical keyword {kw!r} has an empty level "
                    "(write the levels as 'Places|Ireland|Dublin')"
                )
            kw = HIERARCHY.join(parts)
        cleaned.append(kw)
    return unique(cleaned)


def has_control(text: str, *, allow_newline: bool) -> bool:
    allowed = {"\n", "\r", "\t"} if allow_newline else set()
    return any((ord(c) < 32 or ord(c) == 127) and c not in allowed for c in text)


def same(a: str, b: str) -> bool:
    """One keyword, whatever the case."""
    return a.casefold() == b.casefold()


def unique(values: list[str]) -> list[str]:
    """``values`` in order without empty ones and case-insensitive duplicates (first spelling kept)."""
    out: list[str] = []
    seen: set[str] = set()
    for value in values:
        if value and value.casefold() not in seen:
            seen.add(value.casefold())
            out.append(value)
    return out


def leaf(keyword: str, separator: str = HIERARCHY) -> str:
    return keyword.rsplit(separator, 1)[-1].strip()


def ucs2(text: str) -> str:
    """``text`` as EXIF ``XPKeywords`` (UCS-2) gives it back: characters beyond U+FFFF lose their
    high bits (``🏖`` U+1F3D6 becomes U+F3D6)."""
    return "".join(chr(ord(c) & 0xFFFF) if ord(c) > 0xFFFF else c for c in text)


def beyond_ucs2(text: str) -> bool:
    """True when ``text`` holds a character beyond U+FFFF (an emoji such as ``🏖``): exiftool writes
    ``XPKeywords`` as UCS-2 and would store junk for it, so such a keyword is left out of
    ``XPKeywords`` (XMP and IPTC hold it; the item's result names it)."""
    return any(ord(c) > 0xFFFF for c in text)


def lossy_copies(keyword: str) -> set[str]:
    """The (case-folded) forms a keyword takes in IPTC (64-byte cut) and ``XPKeywords`` (UCS-2)
    that differ from it: never a keyword of their own."""
    cut = iptc_cut("Keywords", keyword)
    forms = {cut, ucs2(keyword), iptc_cut("Keywords", ucs2(keyword)), ucs2(cut)}
    return {f.casefold() for f in forms if f} - {keyword.casefold()}


def in_group(family1: str, group: str) -> bool:
    """Whether exiftool's family-1 group ``family1`` (``IFD0``, ``XMP-dc``) is ``group`` (``EXIF``
    stands for every EXIF IFD)."""
    if group == "EXIF":
        return family1 in _EXIF_GROUPS or family1.startswith(("IFD", "SubIFD"))
    return family1 == group


def listed(value: Any) -> list[str]:
    if value in (None, ""):
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def existing(current: Mapping[str, Any], group: str, name: str) -> list[str]:
    """The values of ``group:name`` in ``current`` (``-j -G1 -a``; ``EXIF`` is any EXIF IFD)."""
    return [
        v
        for key, value in current.items()
        if key.split(":", 1)[-1] == name and in_group(key.split(":", 1)[0], group)
        for v in listed(value)
    ]


def _xp_keywords(current: Mapping[str, Any]) -> list[str]:
    return [k.strip() for v in existing(current, "EXIF", "XPKeywords") for k in v.split(";") if k.strip()]


def file_keywords(current: Mapping[str, Any]) -> list[str]:
    """The file's keywords: XMP ``dc:subject`` first (its spelling wins), then those only IPTC
    ``Keywords`` or ``XPKeywords`` hold (tools that write only there: Picasa, Windows), each once
    whatever its case, less every entry that is a lossy copy (64-byte cut, UCS-2) of another."""
    xmp, iptc = existing(current, "XMP-dc", "Subject"), existing(current, "IPTC", "Keywords")
    candidates = unique([*xmp, *iptc, *_xp_keywords(current)])
    lossy = set().union(*(lossy_copies(c) for c in candidates)) if candidates else set()
    return [c for c in candidates if c.casefold() not in lossy]


def _without(entries: list[str], separator: str, flat: set[str], paths: set[str]) -> list[str]:
    """``entries`` less those naming a removed keyword: a flat one (case-folded, in ``flat``) as
    the entry or its leaf, a hierarchical one (``a|b``, in ``paths``) as the whole path."""
    kept = []
    for entry in entries:
        path = HIERARCHY.join(part.strip() for part in entry.split(separator)).casefold()
        if entry.casefold() in flat or leaf(entry, separator).casefold() in flat or path in paths:
            continue
        kept.append(entry)
    return kept


def keyword_writes(
    keywords: list[str] | None,
    keywords_remove: list[str] | None,
    mode: str,
    current: Mapping[str, Any],
    *,
    iptc: bool,
    has_exif: bool,
) -> list[tuple[str, list[str] | str]]:
    """Where the new keyword lists go, only the stores whose list changes (``(tag, values)``): the
    flat list (leaves of hierarchical keywords) to XMP-dc:Subject, IPTC:Keywords (``iptc``) and
    EXIF:XPKeywords (``has_exif``), the hierarchical paths to XMP-lr:HierarchicalSubject, and the
    other tools' lists (:data:`OTHER_LISTS`) less what was removed."""
    before = file_keywords(current)
    hier_now = unique(existing(current, "XMP-lr", "HierarchicalSubject"))
    flat, hier = ([], []) if mode == "replace" else (list(before), list(hier_now))
    for kw in keywords or []:
        if HIERARCHY in kw:
            hier = unique([*hier, kw])
        flat = unique([*flat, leaf(kw)])
    removed_flat: set[str] = set()
    removed_paths: set[str] = set()
    for kw in keywords_remove or []:
        if HIERARCHY in kw:
            removed_paths.add(kw.casefold())
            hier = [h for h in hier if not same(h, kw)]
            if not any(same(leaf(h), leaf(kw)) for h in hier):
                removed_flat.add(leaf(kw).casefold())
        else:
            removed_flat.add(kw.casefold())
            hier = [h for h in hier if not same(leaf(h), kw)]
    flat = [k for k in flat if k.casefold() not in removed_flat]
    if mode == "replace":  # what the new list leaves out is removed from every store
        removed_flat |= {k.casefold() for k in before} - {k.casefold() for k in flat}
        removed_paths |= {h.casefold() for h in hier_now} - {h.casefold() for h in hier}

    writes: list[tuple[str, list[str] | str]] = []
    if flat != existing(current, "XMP-dc", "Subject"):
        writes.append(("XMP-dc:Subject", flat))
    if hier != existing(current, "XMP-lr", "HierarchicalSubject"):
        writes.append(("XMP-lr:HierarchicalSubject", hier))
    if iptc and [iptc_cut("Keywords", k) for k in flat] != existing(current, "IPTC", "Keywords"):
        writes.append(("IPTC:Keywords", flat))
    xp = [k for k in flat if not beyond_ucs2(k)]  # exiftool writes UCS-2: an emoji would be junk
    if has_exif and ";".join(xp) != ";".join(existing(current, "EXIF", "XPKeywords")):
        writes.append(("EXIF:XPKeywords", ";".join(xp)))
    if removed_flat or removed_paths:
        for tag, separator in OTHER_LISTS:
            group, name = tag.split(":", 1)
            entries = existing(current, group, name)
            kept = _without(entries, separator, removed_flat, removed_paths)
            if kept != entries:
                writes.append((tag, kept))
    return writes
