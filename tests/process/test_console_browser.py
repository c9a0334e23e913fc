"""The operator's console in a real Chromium (Playwright) against a real ``photojobs serve`` process and
real workers: job #1 among 60 reached by paging and by search; a job's page with two failure groups,
one retried (the other stays failed) and then discarded; the lanes page's throughput chart; a lane
paused (its queued work stops while another lane runs) and resumed; axe-core on every page at
1280×800 and 390×844, light and dark. Screenshots go to the test's temp dir (and, with
``PHOTOJOBS_DASHBOARD_SCREENSHOT=docs/dashboard.png``, beside that file as ``console-*.png``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from photojobs.testing.samples import generate_samples
from tests.support import Fleet, make_files, wait_for
from tests.web_support import TIMEOUT_MS, TOKEN, WebServer, browser, serving  # noqa: F401 - browser: a fixture

VIEWPORTS = {"desktop": (1280, 800), "phone": (390, 844)}
BLOCKING = ("serious", "critical")


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    root = tmp_path / "photos"
    make_files(root / "needle", 1, prefix="needle")
    for i in range(2, 61):
        make_files(root / f"batch{i:02d}", 1)
    # Two failure groups in one job (lanes analysis,noop with noop.fail_if=broken): a photo that
    # fails analysis (not a JPEG) and one that passes analysis and fails noop.
    generate_samples(root / "groups", 2, size=(160, 120))
    shots = sorted(p for p in (root / "groups").iterdir() if p.is_file())
    shots[1].rename(root / "groups" / "x-broken.jpg")
    (root / "groups" / "bad.jpg").write_bytes(b"this is not a JPEG")
    make_files(root / "slow", 40)
    generate_samples(root / "album", 3, size=(160, 120), seed=3)
    return root


@pytest.fixture
def server(env: dict[str, str], tmp_path: Path, photos: Path) -> Iterator[WebServer]:
    with serving(env, tmp_path, [photos]) as srv:
        yield srv


def _job(http: httpx.Client, job: int) -> dict[str, Any]:
    r = http.get(f"/api/jobs/{job}")
    assert r.status_code == 200, r.text
    return r.json()


def _axe(page: Any, where: str) -> list[str]:
    """The serious and critical axe-core violations on the page, as 'rule: n nodes' lines."""
    from axe_playwright_python.sync_playwright import Axe

    results = Axe().run(page)
    bad = [v for v in results.response["violations"] if v.get("impact") in BLOCKING]
    return [
        f"{where}: {v['id']} ({v['impact']}): {len(v['nodes'])} node(s) {v['nodes'][0]['target']}"
        for v in bad
    ]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_console_paging_search_group_retry_lane_pause_and_axe(
    browser: Any,  # noqa: F811 - the fixture imported above
    server: WebServer,
    fleet: Fleet,
    env: dict[str, str],
    photos: Path,
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    readme = os.environ.get("PHOTOJOBS_DASHBOARD_SCREENSHOT")

    def shot(page: Any, name: str) -> None:
        page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
        if readme:
            shutil.copy(shots / f"{name}.png", Path(readme).parent / f"console-{name}.png")

    # A narrow noop lane (2 messages of 1 item in Redis at most): a lane pause holds back the rest.
    env.update({"PHOTOJOBS_LANE_NOOP_BOUND": "2", "PHOTOJOBS_LANE_NOOP_BATCH": "1"})
    fleet.start_worker(["analysis", "noop"], threads=2)
    fleet.start_sweeper()
    http = server.client()
    # Given 60 jobs, job #1 over the folder "needle"
    for i in range(1, 61):
        folder = "needle" if i == 1 else f"batch{i:02d}"
        r = http.post("/api/jobs", json={"lanes": ["noop"], "paths": [folder]})
        assert r.status_code == 201 and r.json()["job"] == i, r.text
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("dialog", lambda d: errors.append(f"native dialog: {d.message}"))
    page.goto(server.url + "/")
    page.fill("#token", TOKEN)
    page.click("#login-form button[type=submit]")
    expect(page.locator("#live")).to_have_text("live")
    violations: list[str] = []

    # When the operator pages back through the job list (20 a page, newest first)
    expect(page.locator("#jobs .job").first).to_have_attribute("data-job", "60")
    expect(page.locator("#jobs .job")).to_have_count(20)
    page.click("#jobs-older")
    expect(page.locator("#jobs .job").first).to_have_attribute("data-job", "40")
    page.click("#jobs-older")
    # Then job #1 is on the third page, the last
    expect(page.locator('#jobs .job[data-job="1"]')).to_be_visible()
    expect(page.locator("#jobs-older")).to_be_disabled()
    violations += _axe(page, "jobs page 3")
    # When the operator pages newer while the job list answers slowly, Then both paging buttons
    # are off until that page has loaded (a second click would page from the page still shown and
    # land where the first did: seen once in a fresh clone)
    page.evaluate(
        """() => { const f = window.fetch; window.realFetch = f;
            window.fetch = (u, o) => String(u).includes("api/jobs?")
                ? new Promise((r) => setTimeout(r, 1500)).then(() => f(u, o)) : f(u, o); }"""
    )
    page.click("#jobs-newer")
    expect(page.locator("#jobs-newer")).to_be_disabled(timeout=1000)
    expect(page.locator("#jobs-older")).to_be_disabled(timeout=1000)
    expect(page.locator("#jobs .job").first).to_have_attribute("data-job", "40")
    expect(page.locator("#jobs-newer")).to_be_enabled()
    page.evaluate("() => { window.fetch = window.realFetch; }")
    # When the operator searches for the photo folder of job #1 from the first page
    page.click("#jobs-newer")
    expect(page.locator("#jobs .job").first).to_have_attribute("data-job", "60")
    page.fill("#job-search", "needle")
    page.click("#jobs-filter button[type=submit]")
    # Then job #1 is the only one found
    expect(page.locator("#jobs .job")).to_have_count(1)
    expect(page.locator("#jobs .job")).to_have_attribute("data-job", "1")
    # And by its id with a state filter too, once it has succeeded
    wait_for(lambda: _job(http, 1)["state"] == "succeeded", 120, 0.2, what="job 1 succeeded")
    page.fill("#job-search", "#1")
    page.select_option("#job-state", "succeeded")
    page.click("#jobs-filter button[type=submit]")
    expect(page.locator('#jobs .job[data-job="1"]')).to_be_visible()
    page.fill("#job-search", "")
    page.select_option("#job-state", "")
    page.click("#jobs-filter button[type=submit]")

    # When a job whose photos fail in two ways is submitted through the form (folded below the jobs)
    page.click("#submit-panel summary")
    page.fill("#lanes", "analysis,noop")
    page.fill("#paths", "groups")
    page.fill("#params", "noop.fail_if=broken")
    page.click("#submit-form button[type=submit]")
    expect(page.locator("#submit-result")).to_contain_text("submitted: 6 item(s)")
    job = page.locator("#submit-result").get_attribute("data-job")
    expect(page.locator(f'#jobs .job[data-job="{job}"]')).to_have_attribute("data-state", "partial")
    shot(page, "jobs")
    violations += _axe(page, "jobs")
    # And the operator opens its page
    page.locator(f'#jobs .job[data-job="{job}"] a.title').click()
    expect(page.locator("#view-job")).to_be_visible()
    # Then it shows its times, parameters, two failure groups and its items
    expect(page.locator("#job-times")).to_contain_text("Created")
    expect(page.locator("#job-times")).to_contain_text("Finished")
    expect(page.locator("#job-times time").first).to_have_attribute("title", _zone_pattern())
    expect(page.locator("#job-params")).to_contain_text("noop.fail_if")
    analysis = page.locator('#failures .failure[data-lane="analysis"][data-state="failed"]')
    noop = page.locator('#failures .failure[data-lane="noop"][data-state="failed"]')
    expect(analysis).to_have_attribute("data-count", "1")
    expect(noop).to_have_attribute("data-count", "1")
    expect(page.locator("#items tbody tr")).to_have_count(6)
    page.select_option("#item-state", "failed")
    page.click("#items-filter button[type=submit]")
    expect(page.locator("#items tbody tr")).to_have_count(2)
    shot(page, "job")
    violations += _axe(page, "job")
    # When the photo that failed analysis is fixed and only that group is retried
    generate_samples(tmp_path / "fixed", 1, size=(160, 120), seed=9)
    (photos / "groups" / "bad.jpg").write_bytes(next((tmp_path / "fixed").iterdir()).read_bytes())
    analysis.locator("button.act-retry").click()
    # Then the analysis group is gone (the photo then passes noop too) and the noop group stays failed
    expect(analysis).to_have_count(0)
    expect(noop).to_have_attribute("data-count", "1")
    expect(
        page.locator(f'#job-card .job[data-job="{job}"] .lane[data-lane="analysis"] .counts')
    ).not_to_contain_text("failed")
    st = wait_for(
        lambda: (s := _job(http, int(job or 0)))["lanes"]["noop"].get("succeeded") == 2 and s,
        120,
        0.2,
        what="the retried photo through both lanes",
    )
    assert st["lanes"]["noop"].get("failed") == 1 and st["lanes"]["analysis"].get("succeeded") == 3
    # And the noop group's item was never retried (only the analysis group's was, with its next lane)
    kept = int(noop.locator("li").first.get_attribute("data-item") or 0)
    retried = {
        e["item"]
        for e in http.get("/api/events", params={"job": job}).json()["events"]
        if e["type"] == "item_retried"
    }
    assert retried and kept not in retried
    # When the operator discards the noop group (and confirms)
    noop.locator("button.act-discard").click()
    expect(page.locator("#confirm-title")).to_contain_text("Discard 1 failed item(s)")
    page.click("#confirm-ok")
    # Then no failed group is left: the item is skipped (not retried by a retry of the job)
    expect(noop).to_have_count(0)
    expect(page.locator('#failures .failure[data-lane="noop"][data-state="skipped"]')).to_have_attribute(
        "data-count", "1"
    )
    expect(page.locator("#flash")).to_contain_text("discard")
    expect(page.locator('#job-events li[data-type="item_discarded"]').first).to_be_attached()

    # When the operator opens the lanes page
    page.click("#nav-lanes")
    noop_card = page.locator('#lane-cards .lane-card[data-lane="noop"]')
    # Then the noop lane's chart shows the jobs finished this hour
    expect(noop_card).to_be_visible()
    assert int(noop_card.locator("svg.chart").get_attribute("data-total") or 0) > 0
    assert noop_card.locator("svg.chart rect").count() >= 1
    shot(page, "lanes")
    violations += _axe(page, "lanes")

    # Given a slow noop job running
    slow = http.post(
        "/api/jobs", json={"lanes": ["noop"], "paths": ["slow"], "params": {"noop.sleep": 0.5}}
    ).json()["job"]
    wait_for(
        lambda: _job(http, slow)["lanes"]["noop"].get("succeeded", 0) >= 1, 120, 0.2, what="slow job started"
    )
    # When the operator pauses the noop lane (and confirms)
    noop_card.locator("button.act-lane-pause").click()
    page.click("#confirm-ok")
    expect(noop_card).to_have_attribute("data-paused", "true")
    # Then its running items finish and nothing more of it starts
    expect(noop_card).to_have_attribute("data-running", "0")
    expect(noop_card).to_have_attribute("data-queued", "0")
    held = _job(http, slow)["lanes"]["noop"]
    assert held.get("pending", 0) > 0, held
    # While another lane continues: an analysis job runs to the end
    other = http.post("/api/jobs", json={"lanes": ["analysis"], "paths": ["album"]}).json()["job"]
    wait_for(
        lambda: _job(http, other)["state"] == "succeeded", 120, 0.2, what="analysis job during the pause"
    )
    assert _job(http, slow)["lanes"]["noop"].get("succeeded", 0) == held.get("succeeded", 0)
    shot(page, "lane-paused")
    # When the lane is resumed, the slow job finishes
    noop_card.locator("button.act-lane-resume").click()
    expect(noop_card).to_have_attribute("data-paused", "false")
    wait_for(lambda: _job(http, slow)["state"] == "succeeded", 180, 0.3, what="slow job after the resume")

    # And every page is usable and axe-clean at a phone's width, and in the dark colour scheme
    page.set_viewport_size({"width": 390, "height": 844})
    for name, route in (("phone-jobs", "#/"), ("phone-job", f"#/jobs/{job}"), ("phone-lanes", "#/lanes")):
        page.goto(server.url + "/" + route)
        expect(page.locator("#main")).to_be_visible()
        view = {"#/": "#view-home", "#/lanes": "#view-lanes"}.get(route, "#view-job")
        expect(page.locator(view)).to_be_visible()
        assert page.evaluate("document.documentElement.scrollWidth") <= 390, name
        shot(page, name)
        violations += _axe(page, name)
    page.emulate_media(color_scheme="dark")
    page.set_viewport_size({"width": 1280, "height": 800})
    for name, route in (("dark-jobs", "#/"), ("dark-job", f"#/jobs/{job}"), ("dark-lanes", "#/lanes")):
        page.goto(server.url + "/" + route)
        expect(page.locator("#main")).to_be_visible()
        shot(page, name)
        violations += _axe(page, name)
    assert violations == []
    assert errors == []


def _zone_pattern() -> Any:
    import re

    return re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC[+-]\d\d:\d\d \(.+\)$")
