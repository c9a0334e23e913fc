"""photos.containment: the one root-containment check, at submission and at the moment of use."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from photos import containment
from photos.analyze import analyze
from photos.containment import check_relative, open_inside, resolve_inside
from photos.errors import OutsideRoot, UnreadableImage, describe_content
from photos.fileops import sha256_file

SECRET = b"TOPSECRET-PASSWORD=hunter2\n"


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_bytes(SECRET)
    return root, outside


def test_a_path_inside_resolves_to_its_real_path(layout: tuple[Path, Path]) -> None:
    # Given a file inside the root, and a symlink inside the root pointing at it
    root, _ = layout
    (root / "a.jpg").write_bytes(b"x")
    (root / "link.jpg").symlink_to(root / "a.jpg")
    # When / Then both resolve inside
    assert resolve_inside(root / "a.jpg", [root]) == (root / "a.jpg").resolve()
    assert resolve_inside(root / "link.jpg", [root]) == (root / "a.jpg").resolve()


def test_a_symlink_out_of_the_root_is_refused_without_saying_where_it_leads(
    layout: tuple[Path, Path],
) -> None:
    # Given a photo path that is a symlink to a file outside the root
    root, outside = layout
    (root / "photo.jpg").symlink_to(outside / "secret.txt")
    # When it is checked / Then it is refused "outside the photo roots", naming neither the target
    # nor any of its content
    with pytest.raises(OutsideRoot) as caught:
        resolve_inside(root / "photo.jpg", [root])
    assert "outside the photo roots" in str(caught.value)
    assert str(outside) not in str(caught.value)
    assert "TOPSECRET" not in str(caught.value)


def test_recorded_roots_are_not_resolved_again(layout: tuple[Path, Path]) -> None:
    # Given a job root recorded (resolved) at submission, later swapped for a symlink to elsewhere
    root, outside = layout
    (outside / "p.jpg").write_bytes(b"x")
    os.rename(root, root.with_name("moved"))
    root.symlink_to(outside, target_is_directory=True)
    # When a photo under it is checked against the recorded root / Then it is refused (resolving
    # the root again would have carried the check along with the symlink)
    with pytest.raises(OutsideRoot):
        resolve_inside(root / "p.jpg", [root], resolve_roots=False)
    assert resolve_inside(root / "p.jpg", [root]) == (outside / "p.jpg").resolve()


def test_open_inside_checks_the_file_actually_opened(layout: tuple[Path, Path]) -> None:
    # Given a photo inside the root, and another that is a symlink to an outside file
    root, outside = layout
    (root / "ok.jpg").write_bytes(b"fine")
    (root / "swapped.jpg").symlink_to(outside / "secret.txt")
    # When each is opened through the check
    fd = open_inside(root / "ok.jpg", [root])
    with os.fdopen(fd, "rb") as fh:
        assert fh.read() == b"fine"
    # Then the swapped one is refused before a byte is read, and a hash through it too
    with pytest.raises(OutsideRoot):
        open_inside(root / "swapped.jpg", [root])
    with pytest.raises(OutsideRoot):
        sha256_file(root / "swapped.jpg", roots=[root.resolve()])


def test_open_inside_checks_the_descriptor_not_the_path_swapped_between_open_and_check(
    layout: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a photo path that is a symlink to an outside file, and a harmless photo inside the root
    root, outside = layout
    (root / "ok.jpg").write_bytes(b"fine")
    link = root / "photo.jpg"
    link.symlink_to(outside / "secret.txt")

    def swap_back(path: object, fd: int) -> None:
        # When the symlink is swapped to the inside photo right after the open, before the check
        tmp = root / "photo.jpg.swap"
        tmp.symlink_to(root / "ok.jpg")
        os.replace(tmp, link)

    monkeypatch.setattr(containment, "_opened", swap_back)
    # Then the file actually opened (outside) is refused, although the path now resolves inside
    with pytest.raises(OutsideRoot):
        open_inside(link, [root])
    assert link.resolve() == (root / "ok.jpg").resolve()


def test_check_relative_keeps_a_target_under_its_root(layout: tuple[Path, Path]) -> None:
    # Given a folder inside the root that is a symlink to outside it
    root, outside = layout
    (root / "2024").symlink_to(outside, target_is_directory=True)
    # When targets are planned / Then one through the symlink is refused, a plain one is kept
    with pytest.raises(OutsideRoot):
        check_relative(root, "2024/a.jpg")
    assert check_relative(root, "2025/a.jpg") == root.resolve() / "2025" / "a.jpg"


@pytest.mark.parametrize(
    "data, looks",
    [
        (b"", "empty file"),
        (SECRET * 3, "text, not an image"),
        (bytes(range(256)) * 2, "512 bytes, not a recognised image format"),
    ],
)
def test_a_file_that_is_not_an_image_is_described_never_quoted(data: bytes, looks: str) -> None:
    # Given some content / When it is described / Then the description holds none of it
    said = describe_content(data[:512], len(data))
    assert said == looks


def test_analysis_of_a_text_file_does_not_quote_it(tmp_path: Path) -> None:
    # Given a text file named like a photo
    photo = tmp_path / "x.jpg"
    photo.write_bytes(SECRET * 2)
    # When it is analysed / Then the error says what it looks like, not what it says
    with pytest.raises(UnreadableImage) as caught:
        analyze(photo)
    assert "text, not an image" in str(caught.value)
    assert "TOPSECRET" not in str(caught.value) and "hunter2" not in str(caught.value)
