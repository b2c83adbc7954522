"""The job page's training curves in headless Chromium (charts.js): smoothing, integer step ticks,
axis labels, name order, reset zoom, log scale, the mean across ranks with its band, synced
cursors, and a metric with one value per rank as numbers. Metric lines are stored as the
follower stores them (see test_live_job_page.py)."""
import json
import re

import pytest
from pytest import approx

from jobs.domain import states
from jobs.models import State
from tests.browser.conftest import expect
from tests.browser.test_live_job_page import running_job, off_loop, store
from tests.conftest import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def job(alice, image):
    return running_job(alice, image, name="curves")


def metric(step=None, **values):
    return "RINGMASTER_METRIC " + json.dumps(({"step": step} if step is not None else {}) | values)


def uplot(page, name, expression):
    """`expression` of the uPlot drawing metric `name` (as `u`)."""
    return page.locator(f'#charts .chart[data-metric="{name}"]').evaluate(f"el => {{ const u = el.uplot; return {expression}; }}")


def legend(*labels):
    """The legend's rows (a label, then the value at the cursor)."""
    return [re.compile(rf"^{re.escape(label)}\b") for label in labels]


def ema(values, weight):
    """TensorBoard's debiased exponential moving average, written out."""
    out, last = [], 0.0
    for n, value in enumerate(values, 1):
        last = last * weight + (1 - weight) * value
        out.append(last / (1 - weight ** n))
    return out


def open_job(log_in, alice, job, lines):
    store(job, lines)
    page = log_in(alice)
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#live-status")).to_have_attribute("data-status", "live")
    return page


def test_the_smoothing_function_is_tensorboards(log_in, job, alice):
    page = open_job(log_in, alice, job, [(0, "hello")])
    assert page.evaluate("RingmasterCharts.ema([1, 2, 3, 4], 0.5)") == approx([1, 5 / 3, 17 / 7, 49 / 15])
    assert page.evaluate("RingmasterCharts.ema([1, null, 3], 0.5)") == approx([1, None, 7 / 3])
    assert page.evaluate("RingmasterCharts.ema([4, 1, 9], 0)") == [4, 1, 9]
    assert ema([1, 2, 3, 4], 0.5) == approx([1, 5 / 3, 17 / 7, 49 / 15])


def test_a_chart_draws_the_raw_line_faint_and_the_smoothed_one_solid(log_in, job, alice):
    losses = [5.0, 1.0, 4.0, 2.0, 3.0, 0.5]
    page = open_job(log_in, alice, job, [(0, metric(step, loss=loss)) for step, loss in enumerate(losses)])
    expect(page.locator('#charts .chart[data-metric="loss"]')).to_have_attribute("data-points", "6")
    page.locator("#chart-smoothing").fill("0.5")
    expect(page.locator("#chart-smoothing-value")).to_have_text("0.50")
    wait_for(lambda: uplot(page, "loss", "u.data[2]") == approx(ema(losses, 0.5)), timeout=10,
             message="the smoothed series at weight 0.5")
    assert uplot(page, "loss", "u.data[1]") == losses                     # the raw line stays
    assert uplot(page, "loss", "[u.series[1].width, u.series[2].width]") == [1, 2]
    assert uplot(page, "loss", "u.series[2].label") == "rank 0"

    page.locator("#chart-smoothing").fill("0")
    wait_for(lambda: uplot(page, "loss", "u.data[2]") == losses, timeout=10, message="no smoothing at 0")
    page.locator("#chart-smoothing").fill("0.9")
    page.reload()                                                        # the slider is remembered
    expect(page.locator("#chart-smoothing")).to_have_value("0.9")
    wait_for(lambda: page.locator('#charts .chart[data-metric="loss"]').evaluate("el => !!el.uplot")
             and uplot(page, "loss", "u.data[2]") == approx(ema(losses, 0.9)), timeout=10,
             message="the smoothed series at weight 0.9 after a reload")


def test_the_mean_across_ranks_with_its_min_max_band(log_in, job, alice):
    lines = [(rank, metric(step, loss=float(step + rank))) for step in range(4) for rank in (0, 1, 2)]
    page = open_job(log_in, alice, job, lines)
    chart = page.locator('#charts .chart[data-metric="loss"]')
    expect(chart).to_have_attribute("data-mode", "ranks")                  # each rank, unless asked
    expect(chart.locator(".u-legend .u-series")).to_have_text(legend("step", "rank 0", "rank 1", "rank 2"))
    page.check("#chart-mean")
    expect(chart).to_have_attribute("data-mode", "mean")
    expect(chart.locator(".u-legend .u-series")).to_have_text(legend("step", "mean of 3 ranks"))
    page.locator("#chart-smoothing").fill("0")
    wait_for(lambda: uplot(page, "loss", "u.data") == [[0, 1, 2, 3], [0, 1, 2, 3], [2, 3, 4, 5], [1, 2, 3, 4],
                                                         [1, 2, 3, 4]], timeout=10,
             message="steps, min, max, mean and the smoothed mean")
    assert uplot(page, "loss", "u.bands.map(b => b.series)") == [[2, 1]]           # filled between max and min
    assert uplot(page, "loss", "u.series.map(s => s.label)")[3:] == ["mean of 3 ranks (raw)", "mean of 3 ranks"]

    page.reload()                                                                # remembered
    expect(page.locator("#chart-mean")).to_be_checked()
    expect(chart).to_have_attribute("data-mode", "mean")
    page.uncheck("#chart-mean")
    expect(chart).to_have_attribute("data-mode", "ranks")
    assert uplot(page, "loss", "u.series.length") == 1 + 2 * 3                  # a raw and a smoothed line each
    assert uplot(page, "loss", "u.bands.length") == 0


def test_step_ticks_are_integers_and_the_axes_are_labelled(log_in, job, alice):
    page = open_job(log_in, alice, job, [(0, metric(step, loss=1.0 / (step + 1))) for step in range(3)])
    expect(page.locator('#charts .chart[data-metric="loss"]')).to_have_attribute("data-points", "3")
    wait_for(lambda: uplot(page, "loss", "u.axes[0]._splits"), timeout=10, message="the x axis drawn")
    splits = uplot(page, "loss", "u.axes[0]._splits")
    values = uplot(page, "loss", "u.axes[0]._values")
    assert len(splits) >= 2 and all(float(s).is_integer() for s in splits), splits    # 0, 1, 2: no 0.5
    assert all(v == "" or v.lstrip("-").isdigit() for v in values), values
    assert uplot(page, "loss", "[u.axes[0].label, u.axes[1].label]") == ["step", "loss"]


def test_charts_keep_name_order_whichever_metric_comes_first(log_in, job, alice):
    page = open_job(log_in, alice, job, [(0, metric(0, zeta=1.0))])
    expect(page.locator("#charts .chart")).to_have_count(1)
    store(job, [(0, metric(1, zeta=2.0, alpha=1.0)), (0, metric(0, loss=3.0))])
    expect(page.locator("#charts .chart")).to_have_count(3)
    order = ["alpha", "loss", "zeta"]
    assert page.locator("#charts .chart").evaluate_all("els => els.map(e => e.dataset.metric)") == order
    page.reload()
    expect(page.locator("#charts .chart")).to_have_count(3)
    assert page.locator("#charts .chart").evaluate_all("els => els.map(e => e.dataset.metric)") == order


def test_reset_zoom_restores_the_full_range(log_in, job, alice):
    page = open_job(log_in, alice, job, [(0, metric(step, loss=1.0 + step % 3)) for step in range(0, 101, 5)])
    chart = page.locator('#charts .chart[data-metric="loss"]')
    expect(chart).to_have_attribute("data-points", "21")
    chart.scroll_into_view_if_needed()                                    # the mouse acts within the window
    over = chart.locator(".u-over").bounding_box()
    y = over["y"] + over["height"] / 2
    page.mouse.move(over["x"] + over["width"] * 0.4, y)                   # drag across: zoom in
    page.mouse.down()
    page.mouse.move(over["x"] + over["width"] * 0.6, y, steps=5)
    page.mouse.up()
    wait_for(lambda: uplot(page, "loss", "u.scales.x.min") > 20, timeout=10, message="the zoom")
    assert uplot(page, "loss", "u.scales.x.max") < 80
    store(job, [(0, metric(105, loss=2.0))])                              # a new point keeps the zoom
    expect(chart).to_have_attribute("data-points", "22")
    assert uplot(page, "loss", "u.scales.x.max") < 80
    page.click("#chart-reset-zoom")
    wait_for(lambda: uplot(page, "loss", "[u.scales.x.min, u.scales.x.max]") == [0, 105], timeout=10,
             message="the full range back")


def test_log_scale_sets_the_y_scale_and_is_remembered(log_in, job, alice):
    page = open_job(log_in, alice, job, [(0, metric(step, loss=10.0 ** -step)) for step in range(4)])
    expect(page.locator('#charts .chart[data-metric="loss"]')).to_have_attribute("data-points", "4")
    assert uplot(page, "loss", "u.scales.y.distr") == 1
    page.check("#chart-log")
    wait_for(lambda: uplot(page, "loss", "u.scales.y.distr") == 3, timeout=10, message="a log y scale")
    page.reload()
    expect(page.locator("#chart-log")).to_be_checked()
    wait_for(lambda: page.locator('#charts .chart[data-metric="loss"]').evaluate("el => el.uplot && el.uplot.scales.y.distr")
             == 3, timeout=10, message="a log y scale after a reload")
    page.uncheck("#chart-log")
    wait_for(lambda: uplot(page, "loss", "u.scales.y.distr") == 1, timeout=10, message="a linear y scale")


def test_cursors_move_together_across_charts(log_in, job, alice):
    page = open_job(log_in, alice, job, [(0, metric(step, loss=1.0 / (step + 1), accuracy=step / 10))
                                         for step in range(10)])
    for name in ("accuracy", "loss"):
        expect(page.locator(f'#charts .chart[data-metric="{name}"]')).to_have_attribute("data-points", "10")
    page.locator('#charts .chart[data-metric="loss"]').scroll_into_view_if_needed()
    over = page.locator('#charts .chart[data-metric="loss"] .u-over').bounding_box()
    page.mouse.move(over["x"] + over["width"] * 0.7, over["y"] + over["height"] / 2)
    wait_for(lambda: uplot(page, "loss", "u.cursor.idx") is not None, timeout=10, message="the cursor on loss")
    index = uplot(page, "loss", "u.cursor.idx")
    wait_for(lambda: uplot(page, "accuracy", "u.cursor.idx") == index, timeout=10,
             message="the cursor on accuracy at the same step")
    assert uplot(page, "accuracy", "u.cursor.left") == approx(uplot(page, "loss", "u.cursor.left"), abs=2)


def test_a_metric_with_one_value_per_rank_is_a_number_not_a_dot(log_in, job, alice):
    lines = [(rank, metric(step, loss=1.0 / (step + 1))) for step in range(3) for rank in (0, 1)]
    lines += [(0, metric(total_img_per_sec=812.5)), (1, metric(total_img_per_sec=1624.0))]
    lines += [(0, metric(100, final_accuracy=0.91)), (1, metric(100, final_accuracy=0.92))]
    page = open_job(log_in, alice, job, lines)
    numbers = page.locator("#chart-numbers")
    expect(numbers).to_be_visible()
    row = numbers.locator('tr[data-metric="total_img_per_sec"]')
    expect(row.locator("td")).to_have_text(["812.5", "1,624"])
    expect(numbers.locator("th")).to_contain_text(["metric", "rank 0", "rank 1"])
    expect(page.locator('#charts .chart[data-metric="total_img_per_sec"]')).to_have_count(0)
    expect(page.locator('#charts .chart[data-metric="loss"]')).to_have_count(1)
    # A stepped metric printed once per rank is a chart while the job runs (more may come)...
    expect(page.locator('#charts .chart[data-metric="final_accuracy"]')).to_have_count(1)
    # ...and numbers once it has ended.
    off_loop(states.transition, job.pk, State.SUCCEEDED, exit_code=0)
    expect(numbers.locator('tr[data-metric="final_accuracy"] td')).to_have_text(["0.91", "0.92"])
    expect(page.locator('#charts .chart[data-metric="final_accuracy"]')).to_have_count(0)
    page.reload()
    expect(numbers.locator('tr[data-metric="final_accuracy"] td')).to_have_text(["0.91", "0.92"])
    expect(page.locator('#charts .chart[data-metric="total_img_per_sec"]')).to_have_count(0)
    expect(page.locator("#charts .chart")).to_have_count(1)
