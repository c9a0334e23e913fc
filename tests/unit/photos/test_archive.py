"""Unit tests for photos.archive: dated paths, zip/tar bundles with manifest, verification."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import zipfile
from datetime import datetime
from pathlib import Path

import pytest

from photos.archive import (
    MANIFEST_NAME,
    archive_relpath,
    build_bundle,
    parse_bundle_kind,
    verify_bundle,
)
from photos.errors import InvalidParameter, PhotoError
from photos.rootfs import Roots

Members = list[tuple[Path, str]]


@pytest.fixture
def photos(tmp_path: Path) -> list[tuple[Path, str]]:
    src = tmp_path / "src"
    src.mkdir()
    members = []
    for i, name in enumerate(["IMG_0001.jpg", "Été à Paris.jpg", "big.heic"]):
        path = src / name
        path.write_bytes(os.urandom(1000 + i * 300_000))
        members.append((path, f"2024/2024-03-0{i + 1}/{name}"))
    return members


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------------------------- relpath


def test_archive_relpath_uses_capture_date() -> None:
    facts = {"taken": "2024-03-09T14:05:06"}
    assert archive_relpath(facts, Path("/in/IMG 1.JPG"), 0.0) == "2024/2024-03-09/IMG 1.JPG"


def test_archive_relpath_falls_back_to_file_time() -> None:
    mtime = 1_600_000_000.0
    day = datetime.fromtimestamp(mtime)
    assert archive_relpath({"taken": None}, Path("/in/a.png"), mtime) == f"{day:%Y}/{day:%Y-%m-%d}/a.png"


def test_archive_relpath_sanitises_the_name() -> None:
    assert archive_relpath({"taken": "2024-01-01T00:00:00"}, Path("/in/..evil\n.jpg"), 0.0) == (
        "2024/2024-01-01/evil.jpg"
    )


# -------------------------------------------------------------------------------------------- kind


@pytest.mark.parametrize(
    ("value", "kind"), [("zip", "zip"), (" TAR ", "tar"), ("none", "none"), (None, "none"), ("", "none")]
)
def test_parse_bundle_kind(value: str | None, kind: str) -> None:
    assert parse_bundle_kind(value) == kind


def test_parse_bundle_kind_refuses_unknown_and_lists_valid() -> None:
    with pytest.raises(InvalidParameter) as caught:
        parse_bundle_kind("rar")
    assert "'rar'" in str(caught.value) and "none, tar, zip" in str(caught.value)


# ------------------------------------------------------------------------------------------ bundles


@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_bundle_round_trip_with_manifest(tmp_path: Path, photos: list[tuple[Path, str]], kind: str) -> None:
    # Given three photos and a staged output path
    out = tmp_path / f".bundle.{kind}.pj-x.tmp"
    # When a bundle is built
    manifest = build_bundle(photos, out, kind, within=Roots([tmp_path]))
    # Then the manifest lists each member with its real hash, size and original path
    assert manifest["kind"] == kind
    assert [m["arcname"] for m in manifest["members"]] == [arc for _, arc in photos]
    for (src, _), member in zip(photos, manifest["members"], strict=True):
        assert member["sha256"] == sha(src)
        assert member["size"] == src.stat().st_size
        assert member["original"] == str(src)
    # and the bundle verifies against it
    verify_bundle(out, manifest)
    # and the embedded MANIFEST.json equals the returned manifest
    if kind == "zip":
        with zipfile.ZipFile(out) as zf:
            embedded = json.loads(zf.read(MANIFEST_NAME))
            assert all(info.compress_type == zipfile.ZIP_STORED for info in zf.infolist())
            assert zf.read(photos[1][1]) == photos[1][0].read_bytes()
    else:
        with tarfile.open(out) as tf:
            embedded = json.loads(tf.extractfile(MANIFEST_NAME).read())  # type: ignore[union-attr]
            assert tf.extractfile(photos[1][1]).read() == photos[1][0].read_bytes()  # type: ignore[union-attr]
    assert embedded == manifest


def _flip_byte_of(path: Path, needle: bytes) -> None:
    data = bytearray(path.read_bytes())
    index = data.find(needle)
    assert index >= 0, "member data not found in bundle"
    data[index + len(needle) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_tampered_member_data_is_detected(tmp_path: Path, photos: list[tuple[Path, str]], kind: str) -> None:
    # Given a verified bundle
    out = tmp_path / f"b.{kind}"
    manifest = build_bundle(photos, out, kind, within=Roots([tmp_path]))
    # When one byte of a member's data is changed in place
    _flip_byte_of(out, photos[2][0].read_bytes()[5000:5064])
    # Then verification fails naming the bundle (tar: hash mismatch; zip: its CRC or our hash)
    with pytest.raises(PhotoError) as caught:
        verify_bundle(out, manifest)
    assert str(out) in str(caught.value)
    if kind == "tar":
        assert photos[2][1] in str(caught.value) and "sha256" in str(caught.value)


@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_bundle_with_swapped_content_is_detected(tmp_path: Path, photos: Members, kind: str) -> None:
    # Given the manifest of one bundle
    out = tmp_path / f"b.{kind}"
    manifest = build_bundle(photos, out, kind, within=Roots([tmp_path]))
    # When the bundle is rebuilt with different bytes for one member (same names)
    photos[0][0].write_bytes(b"other bytes")
    build_bundle(photos, out, kind, within=Roots([tmp_path]))
    # Then verifying it against the first manifest fails
    with pytest.raises(PhotoError) as caught:
        verify_bundle(out, manifest)
    assert "MANIFEST.json differs" in str(caught.value)


@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_manifest_tampering_with_hash_is_detected(tmp_path: Path, photos: Members, kind: str) -> None:
    # Given a bundle and a manifest whose recorded hash was changed
    out = tmp_path / f"b.{kind}"
    manifest = build_bundle(photos, out, kind, within=Roots([tmp_path]))
    manifest["members"][0]["sha256"] = "0" * 64
    # When verified / Then refused
    with pytest.raises(PhotoError):
        verify_bundle(out, manifest)


def test_truncated_bundle_is_reported_as_corrupt(tmp_path: Path, photos: list[tuple[Path, str]]) -> None:
    out = tmp_path / "b.zip"
    manifest = build_bundle(photos, out, "zip", within=Roots([tmp_path]))
    out.write_bytes(out.read_bytes()[:-200])
    with pytest.raises(PhotoError) as caught:
        verify_bundle(out, manifest)
    assert "corrupt" in str(caught.value) or "missing" in str(caught.value)


def test_missing_member_fails_and_leaves_no_partial_bundle(tmp_path: Path, photos: Members) -> None:
    # Given a member that does not exist
    missing = tmp_path / "gone.jpg"
    out = tmp_path / "b.tar"
    # When bundling
    with pytest.raises(PhotoError) as caught:
        build_bundle([*photos, (missing, "gone.jpg")], out, "tar", within=Roots([tmp_path]))
    # Then the error names the file and no output is left
    assert str(missing) in str(caught.value)
    assert not out.exists()


@pytest.mark.parametrize(
    ("arcname", "expected"),
    [("../x.jpg", "'..'"), ("/abs.jpg", "absolute"), (MANIFEST_NAME, "reserved"), ("dup.jpg", "used twice")],
)
def test_bad_member_names_are_refused(tmp_path: Path, photos: list[tuple[Path, str]], arcname: str,
                                      expected: str) -> None:
    members = [(photos[0][0], "dup.jpg"), (photos[1][0], arcname)]
    with pytest.raises(InvalidParameter) as caught:
        build_bundle(members, tmp_path / "b.zip", "zip", within=Roots([tmp_path]))
    assert expected in str(caught.value)


def test_kind_none_builds_nothing(tmp_path: Path, photos: list[tuple[Path, str]]) -> None:
    with pytest.raises(InvalidParameter):
        build_bundle(photos, tmp_path / "b", "none", within=Roots([tmp_path]))
    assert not (tmp_path / "b").exists()


def test_existing_staged_file_is_replaced(tmp_path: Path, photos: list[tuple[Path, str]]) -> None:
    # Given a stale staged file from an interrupted attempt
    out = tmp_path / ".b.zip.pj-1.tmp"
    out.write_bytes(b"stale garbage" * 1000)
    # When the bundle is built again / Then it is complete and valid
    verify_bundle(out, build_bundle(photos, out, "zip", within=Roots([tmp_path])))
