"""A folder scan takes AVIF and JPEG XL as photos, counts a JPEG's Lightroom sidecar as its photo's,
and names every file it left out with its reason (not only counts), down to the submission result."""

from __future__ import annotations

from pathlib import Path

from photojobs.api import Client, scan_photos
from photojobs.config import Settings


def test_a_folder_scan_names_every_file_it_left_out_and_takes_avif_and_jxl(tmp_path: Path) -> None:
    # Given a phone folder: AVIF, JPEG XL, HEIC, a JPEG with a Lightroom IMG_1.xmp, an orphan sidecar,
    # a note, a hidden file and a hidden folder
    folder = tmp_path / "phone"
    folder.mkdir()
    for name in ("IMG_1.jpg", "IMG_2.avif", "IMG_3.JXL", "IMG_4.heic", "notes.txt", ".DS_Store"):
        (folder / name).write_bytes(b"x")
    (folder / "IMG_1.xmp").write_text("<x/>")
    (folder / "IMG_2.avif.xmp").write_text("<x/>")
    (folder / "gone.xmp").write_text("<x/>")
    (folder / ".thumbs").mkdir()
    (folder / ".thumbs" / "t.jpg").write_bytes(b"x")
    # When it is scanned and submitted
    scan = scan_photos([folder])
    client = Client(Settings.from_env({"PHOTOJOBS_DATABASE_URL": f"sqlite:///{tmp_path / 'db'}"}))
    submitted = client.submit(["analysis"], [folder])
    # Then AVIF and JXL are photos, sidecars belong to their photos, and every left-out file is named
    assert [p.name for p in scan.photos] == ["IMG_1.jpg", "IMG_2.avif", "IMG_3.JXL", "IMG_4.heic"]
    named = [
        {"path": str(folder / ".DS_Store"), "reason": "hidden file"},
        {"path": str(folder / ".thumbs"), "reason": "hidden folder"},
        {"path": str(folder / "IMG_1.xmp"), "reason": "sidecar of a photo"},
        {"path": str(folder / "IMG_2.avif.xmp"), "reason": "sidecar of a photo"},
        {"path": str(folder / "gone.xmp"), "reason": "sidecar without its photo"},
        {"path": str(folder / "notes.txt"), "reason": "not a photo"},
    ]
    assert scan.left_out == named
    assert scan.skipped == {
        "hidden file": 1, "hidden folder": 1, "not a photo": 1, "sidecar of a photo": 2,
        "sidecar without its photo": 1,
    }  # fmt: skip
    assert submitted.left_out == named and submitted.items == 4
