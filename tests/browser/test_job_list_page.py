"""The job list in headless Chromium: it stays current without a reload (new jobs appear, states
change), keeps its filters while it does, and keeps the rows that did not change."""
import pytest

from jobs.domain import states
from jobs.models import Job, Script, State
from tests.browser.conftest import expect, wait_for_page
from tests.browser.test_live_job_page import off_loop

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def new_job(owner, image, name):
    script, _ = Script.objects.get_or_create(owner=owner, name="train.py", sha256="0" * 64, size=1, content="x")
    return Job.objects.create(owner=owner, name=name, image=image, gpus=2, script=script, time_limit_minutes=30)


def row(page, job):
    return page.locator(f'#job-rows tr[data-job-id="{job.pk}"]')


def wait_for_refresh(page):
    updates = int(page.locator("#job-table").get_attribute("data-updated") or 0)
    wait_for_page(page, f"Number(document.getElementById('job-table').dataset.updated || 0) > {updates}")


def test_new_jobs_appear_and_states_change_without_a_reload(log_in, alice, image):
    waiting = new_job(alice, image, "waits")
    steady = new_job(alice, image, "steady")
    page = log_in(alice)
    expect(row(page, waiting).locator(".state")).to_have_attribute("data-state", "QUEUED")
    wait_for_refresh(page)
    page.evaluate("""() => { window.stillTheSamePage = true;
                             document.querySelector('tr[data-job-id="%d"]').dataset.kept = "yes"; }""" % steady.pk)

    arrived = new_job(alice, image, "arrives later")
    expect(row(page, arrived)).to_contain_text("arrives later", timeout=15_000)
    assert page.locator("#job-rows tr").first.get_attribute("data-job-id") == str(arrived.pk)   # newest first

    off_loop(states.transition, waiting.pk, State.LAUNCHING)
    off_loop(states.transition, waiting.pk, State.FAILED, reason="rank 1: RuntimeError: boom")
    expect(row(page, waiting).locator(".state")).to_have_attribute("data-state", "FAILED", timeout=15_000)
    expect(row(page, waiting).locator("td.reason")).to_have_text("rank 1: RuntimeError: boom")

    assert page.evaluate("window.stillTheSamePage") is True
    expect(row(page, steady)).to_have_attribute("data-kept", "yes")     # an unchanged row is left alone


def test_the_live_list_keeps_its_filters(log_in, alice, image):
    page = log_in(alice)
    page.select_option("#id_state", "QUEUED")                           # applies at once
    page.wait_for_url("**/?*state=QUEUED*")
    url = page.url
    queued = new_job(alice, image, "queued one")
    expect(row(page, queued)).to_be_visible(timeout=15_000)
    assert page.locator("#id_state").input_value() == "QUEUED"

    off_loop(states.transition, queued.pk, State.LAUNCHING)
    expect(row(page, queued)).to_have_count(0, timeout=15_000)          # no longer QUEUED: gone from this view
    expect(page.locator("#job-rows")).to_contain_text("No jobs match.")
    assert page.url == url and page.locator("#id_state").input_value() == "QUEUED"
