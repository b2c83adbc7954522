"""The job page's log view in headless Chromium (logview.js): line times, hidden metric lines and
wrapping as toggles the page remembers, and search hits shown with the lines around them and a
jump to the hit in the full log. Lines are stored as the follower stores them (see
test_live_job_page.py)."""
import re

import pytest

from jobs.domain import states
from jobs.models import Job, State
from tests.browser.conftest import expect
from tests.browser.test_live_job_page import running_job, held, numbered, off_loop, rendered_seqs, seqs_in_sight, store
from tests.conftest import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

METRIC = 'RINGMASTER_METRIC {"step": 1, "loss": 0.5}'


@pytest.fixture
def job(alice, image):
    return running_job(alice, image, name="logs")


def row_height(page, seq):
    return page.locator(f'#log .line[data-seq="{seq}"]').evaluate("el => el.getBoundingClientRect().height")


def at_end(page):
    """(whether the log view is scrolled to its bottom, the last seq it holds), read at once."""
    return tuple(page.locator("#log").evaluate(
        "el => [el.scrollTop + el.clientHeight >= el.scrollHeight - 2, Number(el.dataset.last)]"))


def assert_rows_fit_their_text(page):
    """Each row is as tall as its wrapped text: none cut off, none with an empty row below."""
    sizes = page.locator("#log .line").evaluate_all("""els => els.map(e => {
        const text = e.querySelector('.text').getClientRects();
        return [e.dataset.seq, e.clientHeight, text[text.length - 1].bottom - e.getBoundingClientRect().top];
    })""")
    line = row_height(page, 0)
    assert all(height - line < used <= height + 1 for _, height, used in sizes), (line, sizes)


def test_times_hidden_metric_lines_and_wrapping_are_toggles_the_page_remembers(log_in, job, alice):
    long_text = "x" * 600
    store(job, [(0, "hello"), (0, METRIC), (1, long_text)])
    page = log_in(alice)
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#live-status")).to_have_attribute("data-status", "live")
    expect(page.locator("#log .line")).to_have_count(3)
    expect(page.locator("#log-count")).to_have_text("3 lines loaded")
    expect(page.locator("#log .line .ts")).to_have_count(0)
    assert row_height(page, 2) == row_height(page, 0)                    # one row, scrolled sideways
    assert page.locator("#log").evaluate("el => el.scrollWidth > el.clientWidth")

    page.check("#log-times")
    expect(page.locator("#log .line .ts")).to_have_count(3)
    expect(page.locator('#log .line[data-seq="0"] .ts')).to_have_text(re.compile(r"^\d\d:\d\d:\d\d$"))

    page.check("#log-hide-metrics")
    expect(page.locator("#log .line")).to_have_count(2)
    expect(page.locator("#log .line", has_text="RINGMASTER_METRIC")).to_have_count(0)
    expect(page.locator("#log-count")).to_have_text("2 lines loaded")
    store(job, [(0, METRIC), (1, "after")])                                # live lines obey it too
    expect(page.locator("#log .line").last).to_contain_text("after")
    expect(page.locator("#log .line", has_text="RINGMASTER_METRIC")).to_have_count(0)

    page.check("#log-wrap")
    wait_for(lambda: row_height(page, 2) >= 3 * row_height(page, 0), timeout=10,
             message="the long line to wrap onto several rows")
    assert page.locator("#log").evaluate("el => el.scrollWidth <= el.clientWidth")
    # The rows below the wrapped one are laid out after all of it, not over it.
    boxes = page.locator("#log .line").evaluate_all("els => els.map(e => e.getBoundingClientRect())")
    assert all(round(a["bottom"]) <= round(b["top"]) + 1 for a, b in zip(boxes, boxes[1:])), boxes
    assert_rows_fit_their_text(page)
    page.fill("#log-search", "x")                    # a search adds the jump column: still exact
    expect(page.locator("#log .line.hit")).to_have_count(1)
    assert row_height(page, 2) >= 3 * row_height(page, 0)
    assert_rows_fit_their_text(page)
    page.fill("#log-search", "")
    expect(page.locator("#log .line")).to_have_count(3)

    page.reload()
    for box in ("#log-times", "#log-hide-metrics", "#log-wrap"):
        expect(page.locator(box)).to_be_checked()
    expect(page.locator("#log .line")).to_have_count(3)                    # hello, the long line, after
    expect(page.locator("#log .line .ts")).to_have_count(3)
    expect(page.locator("#log .line", has_text="RINGMASTER_METRIC")).to_have_count(0)
    assert row_height(page, 2) >= 3 * row_height(page, 0)

    for box in ("#log-times", "#log-hide-metrics", "#log-wrap"):
        page.uncheck(box)
    expect(page.locator("#log .line")).to_have_count(5)
    page.reload()
    for box in ("#log-times", "#log-hide-metrics", "#log-wrap"):
        expect(page.locator(box)).not_to_be_checked()
    expect(page.locator("#log .line")).to_have_count(5)
    expect(page.locator("#log .line .ts")).to_have_count(0)


def test_one_line_is_counted_as_one_line(log_in, job, alice):
    store(job, [(0, "only")])
    page = log_in(alice)
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#log-count")).to_have_text("1 line loaded")
    page.fill("#log-search", "only")
    expect(page.locator("#log-count")).to_contain_text("1 hit shown")


def test_a_job_of_one_gpu_second_says_so_in_the_singular(log_in, job, alice):
    off_loop(states.transition, job.pk, State.SUCCEEDED, exit_code=0)
    Job.objects.filter(pk=job.pk).update(gpu_seconds=1.2)
    page = log_in(alice)
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#job-finished")).to_contain_text("(1 GPU-second)")


def test_search_shows_each_hit_with_its_context_and_jumps_to_it_in_the_full_log(log_in, job, alice):
    total = 3000                                     # more than the view loads at once (2000)
    lines = numbered(0, total)
    lines[500] = (0, "found the needle here")
    store(job, lines)
    page = log_in(alice)
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#log .line").last).to_have_text(f"1line {total - 1}")
    assert held(page) == (2000, 1000, total - 1)                          # the hit is not loaded

    page.fill("#log-search", "NEEDLE")
    expect(page.locator("#log .line.hit")).to_have_count(1)
    expect(page.locator("#log .line.hit mark")).to_have_text("needle")
    assert rendered_seqs(page) == [498, 499, 500, 501, 502]
    expect(page.locator("#log .line.context")).to_have_text(
        ["0line 498", "1line 499", "1line 501", "0line 502"])
    expect(page.locator("#log-count")).to_contain_text("1 hit shown with 2 lines around each")

    page.locator("#log .line.hit .jump").click()
    expect(page.locator("#log-search")).to_have_value("")
    target = page.locator("#log .line.target")
    expect(target).to_have_attribute("data-seq", "500")
    expect(target).to_have_text("0found the needle here")
    expect(page.locator("#log-follow")).not_to_be_checked()
    first, last = held(page)[1:]
    assert first < 500 < last < total - 1, held(page)
    in_sight = seqs_in_sight(page)
    assert 500 in in_sight and in_sight == list(range(in_sight[0], in_sight[0] + len(in_sight))), in_sight

    # Scrolling down reads on through the rest of the log, to its end. The last page is held back
    # until the view has been found at the bottom of the lines it holds: when it lands, the lines
    # it brings are below, and the lines in sight stay in sight (the view is not at the end yet).
    held_back = []
    last_page = re.compile(rf"/logs/\?since={last}&limit=")
    page.route(last_page, lambda route: held_back.append(route))
    page.locator("#log").evaluate("el => { el.scrollTop = el.scrollHeight; }")
    # (Playwright hands the route over while it talks to the page: ask the page something.)
    wait_for(lambda: held(page) and held_back, timeout=10, message="the request for the lines after those held")
    assert at_end(page) == (True, last), "the view is at the bottom of the lines it holds"
    in_sight = seqs_in_sight(page)
    held_back[0].continue_()
    wait_for(lambda: held(page) == (total, 0, total - 1), timeout=10, message="the last page")
    page.unroute(last_page)
    assert seqs_in_sight(page) == in_sight
    assert at_end(page) == (False, total - 1)
    expect(page.locator("#log-follow")).not_to_be_checked()

    def scrolled_to_end():
        # The bottom and the last line held are read together, then the view is scrolled down (read
        # apart, the bottom of the lines held before the last page landed could pass for the end
        # of the log).
        found = at_end(page)
        page.locator("#log").evaluate("el => { el.scrollTop = el.scrollHeight; }")
        return found == (True, total - 1)
    wait_for(scrolled_to_end, timeout=30, interval=0.3, message="the view to reach the end of the log")
    expect(page.locator("#log-follow")).to_be_checked()
    store(job, [(1, "a live line")])
    expect(page.locator("#log .line").last).to_have_text("1a live line")
    wait_for(lambda: total in seqs_in_sight(page), timeout=10, message="the live line in sight")
    assert at_end(page) == (True, total)

    # Follow goes back to the tail. (Scrolling up turns Follow off at the scroll event: checking the
    # box before that would find it still checked, and click nothing.)
    page.locator("#log").evaluate("el => { el.scrollTop = 0; }")
    expect(page.locator("#log-follow")).not_to_be_checked()
    page.check("#log-follow")
    expect(page.locator("#log .line").last).to_have_text("1a live line")
    wait_for(lambda: held(page)[2] == total, timeout=10, message="the tail view")
    expect(page.locator("#log .line.target")).to_have_count(0)


def test_a_view_at_the_bottom_follows_once_the_last_page_of_newer_lines_brings_none(log_in, job, alice):
    total = 1501                     # the jump to 500 holds 0..1500: the lines after it fill a page
    lines = numbered(0, total)
    lines[500] = (0, "found the needle here")
    store(job, lines)
    page = log_in(alice)
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#live-status")).to_have_attribute("data-status", "live")
    page.fill("#log-search", "NEEDLE")
    page.locator("#log .line.hit .jump").click()
    expect(page.locator("#log .line.target")).to_have_attribute("data-seq", "500")
    expect(page.locator("#log-count")).to_contain_text("newer lines load as you scroll down")
    assert held(page) == (total, 0, total - 1)

    page.locator("#log").evaluate("el => { el.scrollTop = el.scrollHeight; }")
    expect(page.locator("#log-count")).not_to_contain_text("newer lines")    # the page brought none
    assert at_end(page) == (True, total - 1)
    expect(page.locator("#log-follow")).to_be_checked(timeout=10_000)
    store(job, [(1, "a live line")])
    expect(page.locator("#log .line").last).to_have_text("1a live line")
    wait_for(lambda: total in seqs_in_sight(page), timeout=10, message="the live line in sight")
    assert at_end(page) == (True, total)


def test_live_hits_come_with_the_lines_around_them(log_in, job, alice):
    store(job, numbered(0, 10))
    page = log_in(alice)
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#live-status")).to_have_attribute("data-status", "live")
    page.fill("#log-search", "boom")
    expect(page.locator("#log-empty")).to_have_text("No matching lines.")
    store(job, [(0, "a"), (1, "b"), (0, "c boom"), (1, "d"), (0, "e"), (1, "f")])
    expect(page.locator("#log .line.hit")).to_have_count(1)
    wait_for(lambda: rendered_seqs(page) == [10, 11, 12, 13, 14], timeout=10,
             message=f"a hit with two lines each side (rendered {rendered_seqs(page)})")


def test_more_hits_than_a_page_load_as_the_viewer_scrolls_up(log_in, job, alice):
    store(job, [(i % 2, f"hit {i}" if i % 5 == 0 else f"line {i}") for i in range(1500)])   # 300 hits
    page = log_in(alice)
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#log .line").last).to_have_text("1line 1499")
    page.fill("#log-search", "hit")
    expect(page.locator("#log-count")).to_have_text(re.compile(r"^200 hits shown .*older hits load as you scroll up$"))
    page.locator("#log").evaluate("el => { el.scrollTop = 0; }")
    expect(page.locator("#log-count")).to_have_text(re.compile(r"^300 hits shown with 2 lines around each; [^;]*$"))
    # Hits 0, 5, ..., 1495 and the two lines each side: every line up to 1497, each once.
    assert held(page) == (1498, 0, 1497)
