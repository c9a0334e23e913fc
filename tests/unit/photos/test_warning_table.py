"""The README's warning table is the policy the code follows (issue 40): every warning the table
names as an example is classified by ``photos.exiftool_messages.classify`` the way its row says --
written and listed in ``exiftool_fixed``, written and listed in ``exiftool_warned``, left unshifted,
or refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from photos.exiftool_messages import Messages, classify

README = Path(__file__).resolve().parents[3] / "README.md"


def warning_table() -> list[tuple[str, str]]:
    """The rows (exiftool says, photojobs does) of the README's warning table."""
    lines = README.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "| exiftool says | photojobs |")
    rows = []
    for line in lines[start + 2 :]:
        if not line.strip().startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        rows.append((cells[0], cells[1]))
    return rows


def examples(said: str) -> list[str]:
    """The warnings a row names, as exiftool writes them (``[minor]`` where the row says so)."""
    minor = "`[minor]`" in said
    found = []
    for text in re.findall(r"`([^`]+)`", said):
        if text == "[minor]" or " " not in text:
            continue  # the word itself, or a name (darktable's `history`)
        text = text.replace("GROUP:TAG … isn't", "GROUP:TAG doesn't exist or isn't").replace("…", "Text")
        found.append(f"[minor] {text}" if minor and not text.startswith("[minor]") else text)
    return found


def outcome(said: Messages) -> str:
    if said.refusal(allowed_unwritable={"GROUP:TAG"}) is None and said.unwritable:
        return "unshifted"
    if said.refusal():
        return "refused"
    if said.recovered:
        return "exiftool_warned"
    return "exiftool_fixed" if said.fixed else "nothing"


def expected(does: str) -> str:
    for word in ("unshifted", "exiftool_warned", "exiftool_fixed"):
        if f"`{word}`" in does:
            return word
    assert does.startswith("refused"), does
    return "refused"


CASES = [(ex, expected(does)) for said, does in warning_table() for ex in examples(said)]


def test_the_readme_has_the_warning_table_with_every_kind() -> None:
    # Given the README's warning table / Then it names examples of every outcome
    assert {want for _, want in CASES} == {"exiftool_fixed", "exiftool_warned", "unshifted", "refused"}
    assert any("IPTCDigest is not current" in ex for ex, _ in CASES)


@pytest.mark.parametrize(("warning", "want"), CASES, ids=[ex[:40] for ex, _ in CASES])
def test_each_warning_the_readme_names_is_classified_as_its_row_says(warning: str, want: str) -> None:
    # Given a warning the table names, as exiftool prints it for a file
    line = f"Warning: {warning} - /photos/IMG_0001.jpg"
    # When it is classified / Then the outcome is the row's
    assert outcome(classify([line], "/photos/IMG_0001.jpg")) == want
