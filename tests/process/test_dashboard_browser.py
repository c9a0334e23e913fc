"""The dashboard in a real Chromium (Debian's ``chromium`` driven by Playwright for Python) against a
real ``photojobs serve`` process and real workers: log in, submit, watch a lane reach 100 %, pause
and resume, retry a failed photo. Screenshots go to the test's temp dir; assertions are on the DOM.

Set ``PHOTOJOBS_DASHBOARD_SCREENSHOT=docs/dashboard.png`` to also save the README's screenshot.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from photojobs.testing.samples import generate_samples
from tests.support import Fleet, make_files
from tests.web_support import TIMEOUT_MS, TOKEN, WebServer, browser, serving  # noqa: F401 - browser: a fixture


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    root = tmp_path / "photos"
    generate_samples(root / "album", 4, size=(320, 240))
    (root / "album" / "broken.jpg").write_bytes(b"this is not a JPEG")
    (root / "album" / "notes.txt").write_text("not a photo")
    make_files(root / "slow", 6)
    return root


@pytest.fixture
def server(env: dict[str, str], tmp_path: Path, photos: Path) -> Iterator[WebServer]:
    with serving(env, tmp_path, [photos]) as srv:
        yield srv


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_dashboard_login_submit_progress_pause_resume_retry(
    browser: Any,  # noqa: F811 - the fixture imported above
    server: WebServer,
    fleet: Fleet,
    photos: Path,
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    fleet.start_worker(["analysis", "noop"], threads=2)
    fleet.start_sweeper()
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    # Given the dashboard, which asks for the token first
    page.goto(server.url + "/")
    expect(page.locator("#login")).to_be_visible()
    page.screenshot(path=str(shots / "01-login.png"))
    # When the operator logs in with the token
    page.fill("#token", TOKEN)
    page.click("#login-form button[type=submit]")
    # Then the dashboard shows, with the live stream connected
    expect(page.locator("#main")).to_be_visible()
    expect(page.locator("#live")).to_have_text("live")
    # When a job is submitted through the form (folded below the jobs) over four photos, one broken
    # file and one text file
    page.click("#submit-panel summary")
    page.fill("#lanes", "analysis")
    page.fill("#paths", "album")
    page.click("#submit-form button[type=submit]")
    expect(page.locator("#submit-result")).to_contain_text("submitted: 5 item(s); left out: 1 not a photo")
    job_id = page.locator("#submit-result").get_attribute("data-job")
    # Then the analysis lane's progress bar reaches 100 % live, and the job is partial (one failed)
    lane = page.locator(f'#jobs .job[data-job="{job_id}"] .lane[data-lane="analysis"]')
    expect(lane).to_have_attribute("data-percent", "100")
    expect(page.locator(f'#jobs .job[data-job="{job_id}"]')).to_have_attribute("data-state", "partial")
    expect(lane.locator(".counts")).to_contain_text("1 failed")
    page.screenshot(path=str(shots / "02-partial.png"), full_page=True)
    # When the operator opens the job's page (a link): the failure is grouped by reason with a Retry button
    page.locator(f'#jobs .job[data-job="{job_id}"] a.title').click()
    expect(page.locator("#view-job")).to_be_visible()
    assert page.url.endswith(f"#/jobs/{job_id}")
    group = page.locator('#failures .failure[data-lane="analysis"]')
    expect(group).to_have_attribute("data-count", "1")
    expect(group.locator(".reason")).to_contain_text("<path>")
    expect(group.locator("ul")).to_contain_text("broken.jpg")
    expect(group.locator("ul a").first).to_have_attribute("href", re.compile(r"^#/jobs/\d+/items/\d+$"))
    # and sees what the folder scan left out
    expect(page.locator("#skipped")).to_contain_text("1 not a photo")
    page.screenshot(path=str(shots / "03-failures.png"), full_page=True)
    readme_shot = os.environ.get("PHOTOJOBS_DASHBOARD_SCREENSHOT")
    if readme_shot:
        page.screenshot(path=readme_shot)
    # And fixes the photo and clicks Retry
    generate_samples(tmp_path / "fixed", 1, size=(320, 240), seed=7)
    (photos / "album" / "broken.jpg").write_bytes(next((tmp_path / "fixed").glob("*.jpg")).read_bytes())
    group.locator("button.act-retry").click()
    # Then the job succeeds: every photo analysed, no failures left
    card = page.locator(f'#job-card .job[data-job="{job_id}"]')
    expect(card).to_have_attribute("data-state", "succeeded")
    expect(card.locator('.lane[data-lane="analysis"]')).to_have_attribute("data-percent", "100")
    expect(card.locator(".counts")).not_to_contain_text("failed")
    expect(page.locator("#failures")).to_contain_text("No failures.")
    expect(page.locator('#job-events li[data-type="item_retried"]').first).to_be_attached()
    page.screenshot(path=str(shots / "04-retried.png"), full_page=True)
    # When the operator goes back to the jobs, and a slow job is submitted, paused from its card and resumed
    page.click("#nav-jobs")
    expect(page.locator("#view-home")).to_be_visible()
    expect(page.locator("#submit-panel")).to_have_attribute("open", "")  # still unfolded
    page.fill("#lanes", "noop")
    page.fill("#paths", "slow")
    page.fill("#params", "noop.sleep=2")
    page.click("#submit-form button[type=submit]")
    expect(page.locator("#submit-result")).to_contain_text("submitted: 6 item(s)")
    slow_id = page.locator("#submit-result").get_attribute("data-job")
    assert slow_id and job_id and int(slow_id) > int(job_id)
    slow = page.locator(f'#jobs .job[data-job="{slow_id}"]')
    slow.locator("button.act-pause").click()
    expect(slow).to_have_attribute("data-state", "paused")
    expect(slow.locator("button.act-resume")).to_be_enabled()
    expect(slow.locator("button.act-pause")).to_be_disabled()
    page.screenshot(path=str(shots / "05-paused.png"), full_page=True)
    slow.locator("button.act-resume").click()
    # Then it finishes: the noop lane's bar reaches 100 %
    expect(slow).to_have_attribute("data-state", "succeeded")
    expect(slow.locator('.lane[data-lane="noop"]')).to_have_attribute("data-percent", "100")
    page.screenshot(path=str(shots / "06-done.png"), full_page=True)
    # And the page is usable at a phone's width: nothing wider than the screen
    page.set_viewport_size({"width": 390, "height": 844})
    expect(slow.locator("button.act-retry")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.screenshot(path=str(shots / "07-phone.png"), full_page=True)
    assert errors == []
    assert len(list(shots.glob("*.png"))) == 7
