"""The job page of an elastic job in headless Chromium: its size now and bounds, and a step chart
of its GPUs over time that follows resizes while the page is open."""
import pytest

from jobs.domain import states
from jobs.models import Job, Script
from tests.browser.conftest import expect
from tests.browser.test_live_job_page import off_loop, running_job

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def elastic(alice, image):
    return running_job(alice, image, name="elastic", max_gpus=4)


def test_the_size_chart_shows_the_sizes_and_follows_a_resize(log_in, alice, elastic):
    off_loop(states.resize, elastic.pk, 4, "grew to 4 GPUs: 2 GPUs free on this machine")
    page = log_in(alice)
    page.goto(f"/jobs/{elastic.pk}/")
    expect(page.locator("#job-size")).to_have_text("4")
    expect(page.locator("#size-card")).to_contain_text("GPUs over time")
    expect(page.locator("dd", has=page.locator("#job-size"))).to_contain_text("elastic: 2 to 4")
    # The running size holds until now: the last size is drawn twice (its change, and now).
    expect(page.locator("#size-chart")).to_have_attribute("data-sizes", "2,4,4")
    expect(page.locator(".events")).to_contain_text("grew to 4 GPUs: 2 GPUs free on this machine")

    off_loop(states.resize, elastic.pk, 3, "shrank to 3 GPUs for job 99")
    expect(page.locator("#size-chart")).to_have_attribute("data-sizes", "2,4,3,3", timeout=15_000)
    expect(page.locator("#job-size")).to_have_text("3")


def test_a_fixed_job_has_no_size_section(log_in, alice, image):
    script = Script.objects.create(owner=alice, name="train.py", sha256="0" * 64, size=1, content="x")
    job = Job.objects.create(owner=alice, image=image, gpus=2, script=script, time_limit_minutes=30)
    page = log_in(alice)
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#job-state")).to_be_visible()
    assert page.locator("#size-card").count() == 0
