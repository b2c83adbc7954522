"""The compare page in headless Chromium: one chart per metric with one line per job (the mean
of its ranks), drawn by charts.js as on the job page, beside the table of what differs."""
import pytest

from tests.browser.conftest import expect
from tests.test_compare import two_jobs  # noqa: F401 (two of alice's jobs with curves)

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_the_compare_page_draws_a_line_per_job(log_in, two_jobs):  # noqa: F811
    alice, a, b = two_jobs
    page = log_in(alice)
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"/compare/?jobs={a.pk},{b.pk}")
    loss = page.locator('#charts .chart[data-metric="loss"]')
    expect(loss.locator("canvas")).to_have_count(1)
    # Two jobs: each a smoothed line and its faint raw one, after the x series.
    assert loss.evaluate("el => el.uplot.series.length") == 5
    assert loss.evaluate("el => el.uplot.data[0]") == [1, 2, 3]
    assert loss.evaluate("el => el.uplot.data[1]") == [2.0, 1.0, pytest.approx(0.7)]
    expect(loss.locator(".u-legend")).to_contain_text(f"#{a.pk}")
    expect(loss.locator(".u-legend")).to_contain_text(f"#{b.pk}")
    expect(page.locator('tr.differs[data-field="gpus"]')).to_contain_text("4")
    assert errors == []


def test_jobs_ticked_in_the_list_are_compared(log_in, two_jobs):  # noqa: F811
    alice, a, b = two_jobs
    page = log_in(alice)
    page.goto("/")
    page.locator(f'#job-rows input[name="jobs"][value="{a.pk}"]').check()
    page.locator(f'#job-rows input[name="jobs"][value="{b.pk}"]').check()
    page.locator("#compare-form button").click()
    expect(page.locator('#charts .chart[data-metric="loss"] canvas')).to_have_count(1)
    assert f"jobs={b.pk}" in page.url and f"jobs={a.pk}" in page.url
    expect(page.locator("table.compare thead")).to_contain_text(f"#{a.pk}")
