"""TensorBoard scalars on an open job page in headless Chromium: what beat's scrape stores while
the page is open is drawn live, a new tag as a chart of its own, and a reconnect after a web
server restart brings what was stored meanwhile without drawing any point twice."""
import pytest

from tests.browser.conftest import expect
from tests.browser.test_live_job_page import off_loop, running_job
from tests.integration.test_tensorboard_live import scalars, scrape  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def job(alice, image):
    return running_job(alice, image, name="tensorboard")


def steps(page, name):
    return page.locator(f'#charts .chart[data-metric="{name}"]').evaluate("el => Array.from(el.uplot.data[0])")


def test_scraped_scalars_are_drawn_live_and_each_once_across_a_reconnect(log_in, job, alice, scalars,
                                                                         restartable_portal):
    scalars("train/loss", {0: 1.0})
    assert off_loop(scrape) == 1                                           # before the page: the API's
    page = log_in(alice, restartable_portal.url)
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#live-status")).to_have_attribute("data-status", "live")
    loss = page.locator('#charts .chart[data-metric="train/loss"]')
    expect(loss).to_have_attribute("data-points", "1")

    scalars("train/loss", {1: 0.5})
    scalars("lr", {1: 0.1})
    assert off_loop(scrape) == 2
    expect(loss).to_have_attribute("data-points", "2")
    lr = page.locator('#charts .chart[data-metric="lr"]')
    expect(lr).to_have_attribute("data-points", "1")
    expect(lr.locator(".u-title")).to_have_text("lr")

    restartable_portal.kill()
    expect(page.locator("#live-status")).to_have_attribute("data-status", "reconnecting")
    scalars("train/loss", {2: 0.25})
    assert off_loop(scrape) == 1                                           # stored while nobody serves
    restartable_portal.start()
    expect(page.locator("#live-status")).to_have_attribute("data-status", "live", timeout=30_000)
    expect(loss).to_have_attribute("data-points", "3")

    scalars("train/loss", {3: 0.125})
    assert off_loop(scrape) == 1
    expect(loss).to_have_attribute("data-points", "4")
    expect(lr).to_have_attribute("data-points", "1")
    assert steps(page, "train/loss") == [0, 1, 2, 3]
