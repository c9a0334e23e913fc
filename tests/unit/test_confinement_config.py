"""photojobs.roots and photos.params: the settings and checks that confine what a job names."""

from __future__ import annotations

from pathlib import Path

import pytest

from photojobs.roots import (
    ConfinementError,
    NamedTarget,
    OutsideRoots,
    confine_destination,
    diagnostics_on,
    parse_upload_targets,
)
from photos.errors import InvalidParameter
from photos.params import ALLOWED_ROOTS_KEY, refuse_untrusted, validate_params


def test_named_upload_targets_are_separated_by_spaces_or_commas() -> None:
    # Given targets with and without an endpoint, separated both ways
    text = "backup=s3://photos/backup@https://s3.example.com, local=/srv/up  cold=s3://cold"
    # When parsed / Then each has its target and endpoint
    assert parse_upload_targets(text) == {
        "backup": NamedTarget("backup", "s3://photos/backup", "https://s3.example.com"),
        "local": NamedTarget("local", "/srv/up", None),
        "cold": NamedTarget("cold", "s3://cold", None),
    }


@pytest.mark.parametrize(
    "text, says",
    [
        ("backup", "is not NAME="),
        ("=s3://b/p", "is not NAME="),
        ("a=s3://B/p", "bucket name"),
        ("a=ftp://host/p", "not supported"),
        ("a=s3://photos/x a=s3://photos/y", "given twice"),
    ],
)
def test_a_malformed_upload_target_names_the_setting(text: str, says: str) -> None:
    with pytest.raises(ConfinementError) as caught:
        parse_upload_targets(text)
    assert "PHOTOJOBS_UPLOAD_TARGETS" in str(caught.value) and says in str(caught.value)


def test_a_request_may_not_name_an_endpoint_a_raw_s3_target_or_diagnostics() -> None:
    # Given what a web request could ask for
    asks = [
        {"upload.target": "s3://b/p", "upload.endpoint": "http://127.0.0.1:9911/"},
        {"upload.target": "s3://bucket/p"},
        {"noop.crash_if": "f001"},
        {"noop.spin": 5},
    ]
    # When checked as untrusted without diagnostics / Then every one is refused, naming the fix
    for params in asks:
        with pytest.raises(InvalidParameter) as caught:
            refuse_untrusted(params, diagnostics=False)
        assert "PHOTOJOBS_UPLOAD_TARGETS" in str(caught.value) or "PHOTOJOBS_DIAGNOSTICS=1" in str(
            caught.value
        )
    # And with diagnostics on, the fault parameters pass (the remote ones never do)
    refuse_untrusted({"noop.crash_if": "f001"}, diagnostics=True)
    with pytest.raises(InvalidParameter):
        refuse_untrusted({"upload.target": "s3://bucket/p"}, diagnostics=True)


def test_the_internal_roots_key_can_never_come_from_a_request() -> None:
    with pytest.raises(InvalidParameter):
        validate_params(["upload"], {ALLOWED_ROOTS_KEY: ["/"]})


def test_a_destination_must_resolve_inside_the_photo_or_output_roots(tmp_path: Path) -> None:
    # Given a photo root, an output root holding a symlink to elsewhere
    photos, out, elsewhere = tmp_path / "photos", tmp_path / "out", tmp_path / "elsewhere"
    for d in (photos, out, elsewhere):
        d.mkdir()
    (out / "escape").symlink_to(elsewhere, target_is_directory=True)
    # When destinations are checked / Then inside ones come back as real paths, relative ones are
    # taken under the first photo root, and the rest are refused saying what to configure
    assert confine_destination("upload.target", str(out / "up"), [photos], [out]) == str(out / "up")
    assert confine_destination("archive.root", "arch", [photos], [out]) == str(photos / "arch")
    for bad in (str(elsewhere), str(out / "escape" / "x")):
        with pytest.raises(OutsideRoots) as caught:
            confine_destination("upload.target", bad, [photos], [out])
        assert "PHOTOJOBS_OUTPUT_ROOTS" in str(caught.value)
    with pytest.raises(OutsideRoots, match="'..' is not allowed"):
        confine_destination("upload.target", str(out / ".." / "elsewhere"), [photos], [out])


@pytest.mark.parametrize("raw, on", [("", False), ("0", False), ("off", False), ("1", True), ("yes", True)])
def test_diagnostics_switch(raw: str, on: bool) -> None:
    assert diagnostics_on({"PHOTOJOBS_DIAGNOSTICS": raw}) is on


def test_a_bad_diagnostics_value_is_named() -> None:
    with pytest.raises(ConfinementError, match="PHOTOJOBS_DIAGNOSTICS"):
        diagnostics_on({"PHOTOJOBS_DIAGNOSTICS": "maybe"})
