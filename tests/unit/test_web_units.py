"""Unit tests: reason classes, auth helpers, photo-root confinement, ages."""

from __future__ import annotations

from pathlib import Path

import pytest

from photojobs.roots import OutsideRoots, check_found, confine, parse_roots
from photojobs.web.auth import (
    bearer_token,
    make_session,
    origin_allowed,
    session_valid,
    token_matches,
)
from store.errors import SubmissionError
from store.reasons import reason_class
from store.retention import parse_age


def test_the_same_failure_on_different_photos_is_one_reason_class() -> None:
    # Given errors that differ only in paths, numbers and ids
    errors = [
        ("/photos/2024/IMG 0001.jpg: truncated JPEG at byte 18234", "/photos/2024/IMG 0001.jpg"),
        ("/photos/2023/b.jpg: truncated JPEG at byte 99", "/photos/2023/b.jpg"),
        ("/mnt/x/c.jpeg: truncated JPEG at byte 7", None),
    ]
    # When they are classed
    classes = {reason_class(e, [p]) for e, p in errors}
    # Then they group as one, with the path and number normalised away
    assert classes == {"<path>: truncated JPEG at byte <n>"}


def test_reason_classes_keep_different_failures_apart_and_normalise_ids() -> None:
    # Given different kinds of failure, and errors carrying hashes and quoted paths
    a = reason_class("exiftool is not installed; install libimage-exiftool-perl")
    b = reason_class("/p/a.png: exiftool is needed to write PNG metadata", ["/p/a.png"])
    c = reason_class("upload of 'bucket/prefix/ab/abcdef0123456789.jpg' failed: HTTP 503 after 3 tries")
    d = reason_class("lease lost: token 12 != 13 (worker host:4242:a1b2c3)")
    # Then each is distinct and readable
    assert a == "exiftool is not installed; install libimage-exiftool-perl"
    assert b == "<path>: exiftool is needed to write PNG metadata"
    assert c == "upload of <path> failed: HTTP <n> after <n> tries"
    assert d == "lease lost: token <n> != <n> (worker host:<n>:a1b2c3)"
    assert reason_class(None) == reason_class("  ") == "unknown error"
    e1 = reason_class(
        "/a/x.jpg: not an image file Pillow can read (starts with b'this is not')", ["/a/x.jpg"]
    )
    e2 = reason_class("/b/y.jpg: not an image file Pillow can read (starts with b'\\x00\\x01')", ["/b/y.jpg"])
    assert e1 == e2 == "<path>: not an image file Pillow can read (starts with <bytes>)"


def test_bearer_tokens_are_parsed_and_compared_exactly() -> None:
    # Given a configured token
    token = "s3cret-token"
    # Then only an exact bearer token matches
    assert bearer_token(f"Bearer {token}") == token and bearer_token(f"bearer  {token} ") == token
    assert (
        bearer_token(f"Basic {token}") is None
        and bearer_token("Bearer") is None
        and bearer_token(None) is None
    )
    assert token_matches(token, token)
    assert (
        not token_matches(token + "x", token)
        and not token_matches("", token)
        and not token_matches(None, token)
    )
    assert not token_matches("s3cret-tokeN", token)


def test_session_cookies_are_signed_by_the_token_and_expire() -> None:
    # Given a session made at t=1000 for 60 s
    value = make_session("tok", now=1000, ttl=60)
    expires, nonce, sig = value.split(".")
    # Then it is valid before expiry with the same token only, and any tampering invalidates it
    assert session_valid(value, "tok", now=1059)
    assert not session_valid(value, "tok", now=1061)
    assert not session_valid(value, "other-token", now=1000)
    assert not session_valid(f"{int(expires) + 999}.{nonce}.{sig}", "tok", now=1000)
    assert not session_valid(f"{expires}.{nonce}.{sig[:-1]}0", "tok", now=1000) or sig.endswith("0")
    assert (
        not session_valid("garbage", "tok")
        and not session_valid(None, "tok")
        and not session_valid("", "tok")
    )
    assert make_session("tok", now=1000) != make_session("tok", now=1000)  # fresh nonce


def test_origin_must_be_the_apps_own_or_configured() -> None:
    own = "http://127.0.0.1:8765"
    assert origin_allowed("http://127.0.0.1:8765", own)
    assert origin_allowed("http://127.0.0.1:8765/", own)
    assert not origin_allowed("http://127.0.0.1:8766", own)
    assert not origin_allowed("https://evil.example", own)
    assert not origin_allowed(None, own) and not origin_allowed("null", own)
    assert origin_allowed("https://app.example", own, ["https://app.example"])


def test_paths_are_confined_to_the_roots(tmp_path: Path) -> None:
    # Given a root with a photo, a folder symlink out of it and a file symlink out of it
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "a" / "p.jpg").write_bytes(b"x")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "q.jpg").write_bytes(b"y")
    (root / "link").symlink_to(tmp_path / "out", target_is_directory=True)
    (root / "a" / "f.jpg").symlink_to(tmp_path / "out" / "q.jpg")
    roots = [root]
    # Then paths inside pass (relative ones taken from the first root) and escapes raise OutsideRoots
    assert confine(["a", str(root / "a" / "p.jpg")], roots) == [str(root / "a"), str(root / "a" / "p.jpg")]
    for bad in ("../out", "a/../../out", str(tmp_path / "out"), "link", "a/f.jpg", str(tmp_path / "rootx")):
        with pytest.raises(OutsideRoots):
            confine([bad], roots)
    with pytest.raises(OutsideRoots):
        check_found([root / "a" / "f.jpg"], roots)
    check_found([root / "a" / "p.jpg"], roots)
    with pytest.raises(OutsideRoots, match="no photo roots are configured"):
        confine(["a"], [])
    with pytest.raises(SubmissionError, match="empty path"):
        confine([""], roots)
    assert issubclass(OutsideRoots, SubmissionError)
    assert parse_roots(f"{root}::{tmp_path}") == [root, tmp_path]


def test_ages_parse_with_units() -> None:
    assert parse_age("30d") == 30 * 86400 and parse_age("12h") == 43200 and parse_age("90m") == 5400
    assert parse_age("45") == 45 and parse_age("2w") == 14 * 86400 and parse_age("1.5h") == 5400
    for bad in ("soon", "-1d", "", "d"):
        with pytest.raises(ValueError):
            parse_age(bad)
