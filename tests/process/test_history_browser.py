"""The console's photo page and Undo button in a real browser (Chromium through Playwright): a job's
item row links to its photo's history, Undo (clicked twice: no native dialog) runs the undo job,
and the photo page names both effects and the undo; axe finds no serious violation."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from photojobs.testing.samples import generate_samples
from photos.fileops import sha256_file
from tests.support import Fleet, wait_for
from tests.web_support import TIMEOUT_MS, TOKEN, browser, serving  # noqa: F401 - browser: a fixture

from .test_console_browser import _axe, _job


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_photo_page_shows_its_history_and_the_job_page_undoes_the_job(
    browser: Any,  # noqa: F811 - the fixture imported above
    fleet: Fleet,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    root = tmp_path / "photos"
    made = generate_samples(root / "album", 3, size=(160, 120), seed=5)
    before = {p.name: sha256_file(p) for p in made}
    fleet.start_worker(["exif", "rename"], threads=2)
    fleet.start_sweeper()
    with serving(env, tmp_path, [root]) as server:
        http = server.client()
        # Given a job that shifted and renamed three photos
        r = http.post(
            "/api/jobs",
            json={"lanes": ["exif", "rename"], "paths": ["album"],
                  "params": {"exif.shift": "+1h", "rename.pattern": "{taken:%Y%m%d_%H%M%S}{ext}"}},
        )  # fmt: skip
        job = r.json()["job"]
        wait_for(lambda: _job(http, job)["state"] == "succeeded", 120, what="the job to succeed")
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("dialog", lambda d: errors.append(f"native dialog: {d.message}"))
        page.goto(server.url + "/")
        page.fill("#token", TOKEN)
        page.click("#login-form button[type=submit]")
        # When the operator opens the job and clicks Undo (then confirms)
        page.goto(f"{server.url}/#/jobs/{job}")
        undo = page.locator("#job-card .act-undo")
        expect(undo).to_be_enabled()
        undo.click()
        expect(undo).to_have_text("Confirm undo")
        undo.click()
        # Then the console shows the undo job, which puts the photos back
        expect(page).to_have_url(f"{server.url}/#/jobs/{job + 1}")
        wait_for(lambda: _job(http, job + 1)["state"] == "succeeded", 120, what="the undo to succeed")
        assert {p.name: sha256_file(p) for p in (root / "album").iterdir() if p.is_file()} == before
        # When the operator follows an item row's photo to its page
        page.reload()
        link = page.locator("#items tbody tr a[href^='#/photos/']").first
        expect(link).to_be_visible()
        link.click()
        # Then it lists the edit, the rename and their undo, with the time before and after
        rows = page.locator("#photo-history tbody tr")
        expect(rows).to_have_count(4)
        expect(page.locator('#photo-history tr[data-undone="yes"]')).to_have_count(2)
        expect(page.locator('#photo-history li[data-tag="EXIF:DateTimeOriginal"]').first).to_be_visible()
        shots = tmp_path / "shots"
        shots.mkdir()
        page.screenshot(path=str(shots / "photo.png"), full_page=True)
        readme = os.environ.get("PHOTOJOBS_DASHBOARD_SCREENSHOT")
        if readme:
            shutil.copy(shots / "photo.png", Path(readme).parent / "console-photo.png")
        assert _axe(page, "photo page") == []
        # And at 390 px (a phone) the page folds: its table becomes labelled cards, nothing wider
        # than the screen (it was 762 px wide), still axe-clean
        page.set_viewport_size({"width": 390, "height": 800})
        expect(rows.first).to_be_visible()
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"the photo page is {width} px wide at 390 px"
        page.screenshot(path=str(shots / "photo-390.png"), full_page=True)
        assert _axe(page, "photo page at 390 px") == []
        assert errors == []
