"""The operator's console, round two (issue 33), in a real Chromium (Playwright) against a real
``photojobs serve`` process and real workers:

* a steady job (noop items of a fixed delay, one item a message): the ETA the job page shows is
  within 25 % of the real remaining time at 20 %, 50 % and 80 %; the workers view names the job and
  item each busy thread runs; ``/metrics`` scraped during the run has the duration histograms and
  the lane gauges;
* failures: a cascade of skips folded under its cause, an item's attempts with the traceback, a
  bulk retry of every failed job a filter matches (the count, a confirmation, nothing else
  touched), a deep link to a filtered, paged jobs list restoring the same view, and axe-core clean
  on every page at 1280 and 390 px, light and dark.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from photojobs.testing.samples import generate_samples
from tests.metrics_support import parse_scrape, sample
from tests.support import Fleet, make_files, wait_for
from tests.web_support import TIMEOUT_MS, TOKEN, WebServer, browser, serving, wait_job  # noqa: F401 - a fixture

BLOCKING = ("serious", "critical")
STEADY_ITEMS = 160
STEADY_SLEEP = 0.3  # seconds per item (over the 0.25 s histogram bucket): two threads finish ~6 a second


def _axe(page: Any, where: str) -> list[str]:
    from axe_playwright_python.sync_playwright import Axe

    results = Axe().run(page)
    return [
        f"{where}: {v['id']} ({v['impact']}): {len(v['nodes'])} node(s) {v['nodes'][0]['target']}"
        for v in results.response["violations"]
        if v.get("impact") in BLOCKING
    ]


@contextmanager
def _console(chromium: Any, server: WebServer) -> Iterator[tuple[Any, Any, list[str]]]:
    """A logged-in browser context and its first page; the page errors and native dialogs seen."""
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("dialog", lambda d: errors.append(f"native dialog: {d.message}"))
    page.goto(server.url + "/")
    # The login page shows no navigation
    expect(page.locator("#login")).to_be_visible()
    expect(page.locator("#nav")).to_be_hidden()
    page.fill("#token", TOKEN)
    page.click("#login-form button[type=submit]")
    expect(page.locator("#live")).to_have_text("live")
    try:
        yield context, page, errors
    finally:
        context.close()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_eta_of_a_steady_job_workers_view_and_metrics_during_the_run(
    browser: Any,  # noqa: F811 - the fixture imported above
    fleet: Fleet,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    # Given a steady job: 160 noop items of 0.3 s, one item a message, on one worker of 2 threads
    photos = tmp_path / "photos"
    make_files(photos / "steady", STEADY_ITEMS)
    env.update({"PHOTOJOBS_LANE_NOOP_BATCH": "1"})
    with serving(env, tmp_path, [photos]) as server, _console(browser, server) as (context, page, errors):
        fleet.start_worker(["noop"], threads=2)
        fleet.start_sweeper()
        http = server.client()
        wait_for(lambda: http.get("/api/workers").json()["workers"], 60, 0.2, what="the worker registered")
        job = http.post(
            "/api/jobs", json={"lanes": ["noop"], "paths": ["steady"], "params": {"noop.sleep": STEADY_SLEEP}}
        ).json()["job"]
        # When the operator watches its page
        page.goto(f"{server.url}/#/jobs/{job}")
        expect(page.locator("#job-title")).to_be_focused()
        lane = page.locator(f'#job-card .job[data-job="{job}"] .lane[data-lane="noop"]')
        readings: list[tuple[int, float, float]] = []
        for pct in (20, 50, 80):
            page.wait_for_function(
                f"""() => {{
                    const lane = document.querySelector('#job-card .lane[data-lane="noop"]');
                    const eta = document.querySelector('#eta');
                    return lane && Number(lane.dataset.percent) >= {pct} && eta && eta.dataset.eta !== "";
                }}""",
                timeout=TIMEOUT_MS,
            )
            eta = page.locator("#eta")
            readings.append(
                (
                    int(lane.get_attribute("data-percent") or 0),
                    float(eta.get_attribute("data-eta") or 0),
                    float(eta.get_attribute("data-now") or 0),
                )
            )
            if pct == 50:
                shot = os.environ.get("PHOTOJOBS_CONSOLE_SCREENSHOT")  # docs/console.png (README's tour)
                if shot:
                    page.screenshot(path=shot)
                # The workers view (another tab) names the job and item each busy thread runs
                workers = context.new_page()
                workers.goto(f"{server.url}/#/workers")
                threads = workers.locator(f'#workers .worker[data-state="live"] .thread[data-job="{job}"]')
                expect(threads).to_have_count(2)
                for i in range(2):
                    row = threads.nth(i)
                    item = row.get_attribute("data-item")
                    expect(row).to_contain_text(f"job #{job}")
                    expect(row).to_contain_text(f"item {item}")
                    expect(row.locator(f'a[href="#/jobs/{job}/items/{item}"]')).to_be_visible()
                    assert http.get(f"/api/jobs/{job}/items/{item}").json()["item"]["lane"] == "noop"
                # (reported by the worker's own heartbeat: each entry names its thread)
                running = wait_for(
                    lambda: (
                        (w := http.get("/api/workers").json()["workers"][0]["running"])
                        and len(w) == 2
                        and all(r["thread"] for r in w)
                        and w
                    ),
                    30,
                    0.1,
                    what="both threads named in /api/workers",
                )
                assert {"job", "item", "lane", "photo", "since"} <= set(running[0])
                workers.close()
                # And /metrics during the run has the histograms and the lane gauges
                scrape = parse_scrape(http.get("/metrics").text)
                assert sample(scrape, "photojobs_item_run_seconds_count", lane="noop") >= 10
                assert sample(scrape, "photojobs_item_run_seconds_bucket", lane="noop", le="0.25") == 0
                assert sample(scrape, "photojobs_item_queue_wait_seconds_count", lane="noop") >= 10
                assert sample(scrape, "photojobs_lane_paused", lane="noop") == 0
                assert sample(scrape, "photojobs_oldest_pending_age_seconds", lane="noop") >= 0
                assert sample(scrape, "photojobs_job_duration_seconds_count") == 0  # not finished yet
        finished = wait_job(http, job)
        assert finished["state"] == "succeeded"
        end = finished["times"]["finished_at"]
        # Then each ETA shown was within 25 % of the time the job really had left
        print(
            "ETA readings (percent done, ETA shown, real remaining):",
            [(p, round(e, 1), round(end - n, 1)) for p, e, n in readings],
        )
        for pct, eta, now in readings:
            real = end - now
            assert abs(eta - real) <= 0.25 * real, (pct, eta, real, readings)
        assert sample(parse_scrape(http.get("/metrics").text), "photojobs_job_duration_seconds_count") == 1
        assert errors == []


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_cascade_bulk_retry_deep_link_and_axe_everywhere(
    browser: Any,  # noqa: F811 - the fixture imported above
    fleet: Fleet,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    photos = tmp_path / "photos"
    # Three files that fail analysis (not JPEGs) among two good photos: their noop items are skipped
    generate_samples(photos / "cascade", 2, size=(160, 120))
    for i in range(3):
        (photos / "cascade" / f"bad{i}.jpg").write_bytes(b"this is not a JPEG")
    for name in ("a", "b", "c"):
        make_files(photos / "bulkset" / name, 1)
        if name != "c":  # the third job succeeds: it matches the search, not the state
            make_files(photos / "bulkset" / name, 1, prefix="broken")
    make_files(photos / "other", 1, prefix="broken")
    for i in range(23):
        make_files(photos / "deeplist" / f"d{i:02d}", 1)
    env.update({"PHOTOJOBS_LANE_NOOP_MAX_ATTEMPTS": "1"})
    with serving(env, tmp_path, [photos]) as server, _console(browser, server) as (context, page, errors):
        fleet.start_worker(["analysis", "noop"], threads=2)
        fleet.start_sweeper()
        http = server.client()
        fail = {"noop.fail_if": "broken"}
        bulk_jobs = [
            http.post(
                "/api/jobs", json={"lanes": ["noop"], "paths": [f"bulkset/{n}"], "params": fail}
            ).json()["job"]
            for n in ("a", "b", "c")
        ]
        other = http.post("/api/jobs", json={"lanes": ["noop"], "paths": ["other"], "params": fail}).json()[
            "job"
        ]
        deep = [
            http.post("/api/jobs", json={"lanes": ["noop"], "paths": [f"deeplist/d{i:02d}"]}).json()["job"]
            for i in range(23)
        ]
        cascade = http.post("/api/jobs", json={"lanes": ["analysis", "noop"], "paths": ["cascade"]}).json()[
            "job"
        ]
        for j in [*bulk_jobs, other, *deep, cascade]:
            wait_job(http, j)
        violations: list[str] = []

        # When the operator opens the job whose analysis failed for 3 files
        page.goto(f"{server.url}/#/jobs/{cascade}")
        # Then one group is shown: the analysis failure, the 3 noop skips folded under it
        groups = page.locator("#failures .failure")
        expect(groups).to_have_count(1)
        group = groups.first
        expect(group).to_have_attribute("data-lane", "analysis")
        expect(group).to_have_attribute("data-count", "3")
        expect(group.locator(".cascade")).to_have_attribute("data-skipped", "3")
        expect(group.locator(".cascade")).to_have_attribute("data-lanes", "1")
        expect(group.locator(".cascade")).to_contain_text("3 in noop")
        violations += _axe(page, "job")
        # And an example leads to the item's page: its attempt, with its error
        group.locator("li a").first.click()
        expect(page.locator("#item-title")).to_be_focused()
        expect(page.locator("#attempts .attempt")).to_have_count(1)
        expect(page.locator("#attempts .attempt").first).to_have_attribute("data-outcome", "failed")
        expect(page.locator("#attempts .attempt .error-text")).not_to_be_empty()
        violations += _axe(page, "item")
        # And an unexpected exception's attempt shows its traceback
        other_item = http.get(f"/api/jobs/{other}/items", params={"state": "failed"}).json()["items"][0]["id"]
        page.goto(f"{server.url}/#/jobs/{other}/items/{other_item}")
        expect(page.locator("#attempts .traceback")).to_have_count(1)
        page.locator("#attempts .traceback summary").click()
        expect(page.locator("#attempts .traceback pre")).to_contain_text("noop.fail_if matched")

        # When the operator filters partial jobs by "bulkset": two match (the third succeeded)
        page.goto(f"{server.url}/#/")
        page.fill("#job-search", "bulkset")
        page.select_option("#job-state", "partial")
        page.click("#jobs-filter button[type=submit]")
        expect(page.locator("#jobs .job")).to_have_count(2)
        expect(page.locator("#bulk")).to_have_attribute("data-count", "2")
        expect(page.locator("#bulk-count")).to_contain_text("2 job(s)")
        assert "state=partial" in page.url and "q=bulkset" in page.url
        violations += _axe(page, "jobs, filtered")
        # And asks to retry every failed item of them: the confirmation names the count; kept as is first
        page.click("#bulk-retry")
        expect(page.locator("#confirm")).to_be_visible()
        expect(page.locator("#confirm-title")).to_contain_text("2 job(s)")
        violations += _axe(page, "confirmation")
        page.click("#confirm-cancel")
        expect(page.locator("#confirm")).to_be_hidden()
        assert _retried(http, bulk_jobs[0]) == 0
        page.click("#bulk-retry")
        page.click("#confirm-ok")
        expect(page.locator("#flash")).to_contain_text("2 of 2 job(s) changed")
        # Then exactly the two matching jobs' failed items were retried, and nothing else
        wait_for(lambda: all(_retried(http, j) == 1 for j in bulk_jobs[:2]), 60, 0.2, what="both retried")
        for j in bulk_jobs[:2]:
            wait_job(http, j)
        assert (
            _retried(http, bulk_jobs[2]) == 0 and _retried(http, other) == 0 and _retried(http, cascade) == 0
        )
        assert http.get(f"/api/jobs/{other}").json()["state"] == "failed"
        assert http.get(f"/api/jobs/{bulk_jobs[2]}").json()["state"] == "succeeded"

        # When the operator pages to the second page of the succeeded "deeplist" jobs
        page.fill("#job-search", "deeplist")
        page.select_option("#job-state", "succeeded")
        page.click("#jobs-filter button[type=submit]")
        expect(page.locator("#jobs .job")).to_have_count(20)
        page.click("#jobs-older")
        expect(page.locator("#jobs-page")).to_contain_text("page 2")
        expect(page.locator("#jobs .job")).to_have_count(3)
        shown = [page.locator("#jobs .job").nth(i).get_attribute("data-job") for i in range(3)]
        assert shown == [str(j) for j in sorted(deep)[:3][::-1]]
        link = page.url
        # And opens that link in a new tab
        again = context.new_page()
        again.goto(link)
        # Then the same view is restored: the filter, the page and its jobs
        expect(again.locator("#jobs-page")).to_contain_text("page 2")
        expect(again.locator("#job-search")).to_have_value("deeplist")
        expect(again.locator("#job-state")).to_have_value("succeeded")
        expect(again.locator("#jobs .job")).to_have_count(3)
        assert [again.locator("#jobs .job").nth(i).get_attribute("data-job") for i in range(3)] == shown
        # And "Newer" leads back to the first page of the same filter
        again.click("#jobs-newer")
        expect(again.locator("#jobs .job")).to_have_count(20)
        again.close()

        # And the lanes chart has axes and a range choice kept in the URL
        page.goto(f"{server.url}/#/lanes")
        page.select_option("#lane-range", "21600")
        expect(page).to_have_url(re.compile(r"#/lanes\?range=21600$"))
        chart = page.locator('#lane-cards .lane-card[data-lane="noop"] svg.chart')
        expect(chart.locator("text.tick")).to_have_count(5)
        expect(chart).to_have_attribute("aria-label", re.compile(r"in the last 6 h 0 min"))
        # and the lane's run time and queue wait, p50 and p95 (the counters' histograms); none yet
        # for a lane no job used
        noop_card = page.locator('#lane-cards .lane-card[data-lane="noop"]')
        run_times = noop_card.locator('dd[data-times="run"]')
        expect(run_times).to_contain_text(re.compile(r"^p50 .* · p95 .* attempts\)$"))
        expect(noop_card.locator('dd[data-times="wait"]')).to_contain_text("p95")
        expect(page.locator('#lane-cards .lane-card[data-lane="upload"] dd[data-times="run"]')).to_have_text(
            "no attempt yet"
        )
        # And times can be shown in UTC; the page has an icon
        page.goto(f"{server.url}/#/jobs/{cascade}")
        page.select_option("#pref-times", "utc")
        expect(page.locator("#job-times time").first).to_have_text(
            re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$")
        )
        page.select_option("#pref-times", "")
        assert httpx.get(f"{server.url}/favicon.ico").status_code == 200
        assert page.locator('link[rel="icon"]').get_attribute("href") == "static/favicon.svg"
        # And a server that goes away is "unreachable, retrying", and the console comes back by itself
        server.stop()
        page.evaluate("location.hash = '#/workers'")
        expect(page.locator("#offline")).to_have_text("Server unreachable, retrying…")
        expect(page.locator("#flash")).not_to_contain_text("Failed to fetch")
        server.start()
        expect(page.locator("#offline")).to_be_hidden()
        expect(page.locator("#live")).to_have_text("live")
        expect(page.locator("#workers .worker").first).to_be_visible()

        # And every view is axe-clean at 1280 and 390 px, light and dark (the theme control)
        routes = {
            "jobs": "#/",
            "job": f"#/jobs/{cascade}",
            "item": f"#/jobs/{other}/items/{other_item}",
            "lanes": "#/lanes",
            "workers": "#/workers",
            "events": f"#/events?type=item_failed&job={other}",
        }
        for theme in ("light", "dark"):
            page.goto(f"{server.url}/#/")
            page.select_option("#pref-theme", theme)
            for width in (1280, 390):
                page.set_viewport_size({"width": width, "height": 844})
                for name, route in routes.items():
                    page.goto(f"{server.url}/{route}")
                    expect(page.locator(f"#view-{name if name != 'jobs' else 'home'}")).to_be_visible()
                    if name == "events":
                        expect(page.locator('#events li[data-type="item_failed"]')).to_have_count(1)
                        expect(page.locator("#events li a").first).to_be_visible()
                    assert page.evaluate("document.documentElement.scrollWidth") <= width, (name, width)
                    violations += _axe(page, f"{name} {width} {theme}")
        assert page.evaluate("document.documentElement.dataset.theme") == "dark"
        assert violations == []
        assert errors == []


def _retried(http: httpx.Client, job: int) -> int:
    events = http.get("/api/events", params={"job": job, "type": "item_retried", "tail": 100}).json()[
        "events"
    ]
    return len(events)
