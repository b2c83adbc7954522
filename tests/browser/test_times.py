"""Times in headless Chromium set to a zone that is not the server's (UTC): every time on the job
page and the job list reads in the viewer's zone, names it, and reads the same before and after a
live update."""
from zoneinfo import ZoneInfo

import pytest

from jobs.domain import states
from jobs.models import Job, State
from tests.browser.conftest import expect, wait_for_page
from tests.browser.test_live_job_page import job, off_loop  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ZONE = "America/New_York"      # UTC-5 (or -4): never the server's UTC


def local(ts, pattern):
    return ts.astimezone(ZoneInfo(ZONE)).strftime(pattern)


def full(ts):
    """What the page shows for a date and time: 2026-11-25 01:45:02 EST."""
    return local(ts, "%Y-%m-%d %H:%M:%S %Z")


def test_job_page_times_are_the_viewers_before_and_after_a_live_update(log_in, alice, job):  # noqa: F811
    page = log_in(alice, timezone_id=ZONE)
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#live-status")).to_have_attribute("data-status", "live")
    job = Job.objects.get(pk=job.pk)
    events = list(job.events.all())

    submitted = page.locator("#job-submitted time")
    started = page.locator("#job-started time")
    event_times = page.locator("ol.events li time")
    expect(submitted).to_have_text(full(job.created_at))
    expect(started).to_have_text(full(job.started_at))
    expect(event_times).to_have_text([local(event.ts, "%H:%M:%S") for event in events])
    expect(page.locator("ol.events").locator("xpath=..").locator("h2 [data-tz-name]")).to_have_text(ZONE)
    expect(page.locator("footer.zone-note")).to_have_text(f"Times are shown in {ZONE}.")
    before = {"started": started.inner_text(), "events": event_times.all_inner_texts()}

    # The job ends: the page rewrites the summary and the events from the API, live.
    off_loop(states.transition, job.pk, State.SUCCEEDED, expect={State.RUNNING}, message="done")
    expect(page.locator("ol.events li")).to_have_count(len(events) + 1)
    expect(page.locator("#job-finished time")).to_be_visible()
    assert started.inner_text() == before["started"]
    assert event_times.all_inner_texts()[:len(events)] == before["events"]
    finished = Job.objects.get(pk=job.pk).finished_at
    expect(page.locator("#job-finished time")).to_have_text(full(finished))

    page.reload()                                    # and the same on a fresh page
    expect(page.locator("ol.events li time")).to_have_text(event_times.all_inner_texts())
    expect(page.locator("#job-started time")).to_have_text(before["started"])


def test_the_job_list_shows_submitted_in_the_viewers_zone_before_and_after_a_refresh(log_in, alice, job):  # noqa: F811
    page = log_in(alice, timezone_id=ZONE)
    created = Job.objects.get(pk=job.pk).created_at
    time = page.locator(f'tr[data-job-id="{job.pk}"] td.submitted time')
    expect(time).to_have_text(local(created, "%H:%M:%S"))                   # today: the time of day
    expect(time).to_have_attribute("title", f"{full(created)} ({ZONE})")
    expect(page.locator("table.jobs th [data-tz-name]")).to_have_text(ZONE)
    updates = int(page.locator("#job-table").get_attribute("data-updated") or 0)
    # A live refresh of the rows:
    wait_for_page(page, f"Number(document.getElementById('job-table').dataset.updated || 0) > {updates}")
    expect(time).to_have_text(local(created, "%H:%M:%S"))
