"""The live job page in headless Chromium against a real uvicorn with the Redis channel layer.

Lines are stored the way the follower stores them (jobs.domain.logstore.append_output, which also
notifies the websocket group), so what is tested is storage -> push -> websocket -> page. The
whole path from horovodrun is covered by test_job_pages.py.
"""
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from django.utils import timezone

from jobs.domain import states
from jobs.domain.logstore import append_output
from jobs.models import Job, Script, State
from runners.output import Line
from tests.browser.conftest import expect
from tests.conftest import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def running_job(owner, image, **fields):
    """A job of `owner` that is RUNNING (2 GPUs unless `fields` say otherwise), as its follower
    would have moved it, with its viewers told."""
    script = Script.objects.create(owner=owner, name="train.py", sha256="0" * 64, size=1, content="x")
    job = Job.objects.create(owner=owner, image=image, script=script, time_limit_minutes=30,
                             **({"gpus": 2} | fields))
    off_loop(states.transition, job.pk, State.LAUNCHING)
    off_loop(states.transition, job.pk, State.RUNNING)
    return job


@pytest.fixture
def job(alice, image):
    return running_job(alice, image, name="live one")


def off_loop(function, *args, **kwargs):
    """Run a call that notifies viewers in a thread of its own, as a worker would: this thread
    runs Playwright's event loop, where the push to the channel layer (async_to_sync) cannot."""
    def call():
        try:
            return function(*args, **kwargs)
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


def store(job, lines):
    """Store [(rank, text)] as the next batch of the job's output."""
    def append():
        offset = Job.objects.get(pk=job.pk).output_offset
        batch = [Line(rank=rank, stream="stderr" if "error" in text else "stdout", text=text, ts=None)
                 for rank, text in lines]
        return append_output(job.pk, batch, offset, offset + 1, {})

    assert off_loop(append)


def numbered(start, count, ranks=(0, 1)):
    return [(ranks[i % len(ranks)], f"line {i}") for i in range(start, start + count)]


def held(page):
    """(number of lines the log view holds, first seq, last seq)."""
    data = page.locator("#log").evaluate("el => [el.dataset.held, el.dataset.first, el.dataset.last]")
    return tuple(int(x) if x not in (None, "") else None for x in data)


def rendered_seqs(page):
    return page.locator("#log .line").evaluate_all("els => els.map(e => Number(e.dataset.seq))")


def seqs_in_sight(page):
    """The seqs of the rows inside the log view's visible box."""
    return page.locator("#log").evaluate("""el => {
        const box = el.getBoundingClientRect();
        return [...el.querySelectorAll('.line')].filter(row => {
            const r = row.getBoundingClientRect();
            return r.top >= box.top - 1 && r.bottom <= box.bottom + 1;
        }).map(row => Number(row.dataset.seq));
    }""")


def assert_complete(page, count):
    """The view holds lines 0..count-1 exactly once, and the rows in sight are consecutive."""
    wait_for(lambda: held(page) == (count, 0, count - 1), timeout=30,
             message=f"the page to hold lines 0..{count - 1} (it holds {held(page)})")
    seqs = rendered_seqs(page)
    assert seqs and seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs


def test_lines_appear_live_and_the_rank_filter_and_search_follow_them(log_in, job, alice):
    store(job, numbered(0, 4))
    page = log_in(alice)
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#live-status")).to_have_attribute("data-status", "live")
    expect(page.locator("#log .line")).to_have_count(4)

    store(job, numbered(4, 6) + [(None, "launcher says hi"), (1, "an error on rank 1")])
    expect(page.locator("#log .line")).to_have_count(12)
    assert rendered_seqs(page) == list(range(12))
    expect(page.locator('#log .line[data-rank="launcher"]')).to_have_text("Llauncher says hi")
    expect(page.locator("#log .line").last).to_have_class(re.compile(r"\bstderr\b"))

    page.select_option("#rank-filter", "1")
    expect(page.locator("#log .line")).to_have_count(6)
    expect(page.locator('#log .line:not([data-rank="1"])')).to_have_count(0)
    download = page.locator("#download-rank")
    expect(download).to_be_visible()
    assert download.get_attribute("href").endswith(f"/jobs/{job.pk}/log/?rank=1")
    store(job, [(0, "rank 0 live"), (1, "rank 1 live")])                  # live lines obey the filter
    expect(page.locator("#log .line").last).to_have_text("1rank 1 live")
    expect(page.locator("#log .line", has_text="rank 0 live")).to_have_count(0)

    page.select_option("#rank-filter", "")
    page.fill("#log-search", "LIVE")                  # hits, each with the two lines around it
    expect(page.locator("#log .line.hit")).to_have_count(2)
    expect(page.locator("#log .line.hit mark")).to_have_text(["live", "live"])
    assert rendered_seqs(page) == [10, 11, 12, 13]
    store(job, [(0, "not this"), (1, "live again")])
    expect(page.locator("#log .line.hit")).to_have_count(3)
    assert rendered_seqs(page) == [10, 11, 12, 13, 14, 15]
    page.fill("#log-search", "")
    expect(page.locator("#log .line")).to_have_count(16)
    assert rendered_seqs(page) == list(range(16))

    # The state badge is live too: no reload, the Cancel button goes when the job ends.
    off_loop(states.transition, job.pk, State.FAILED, reason="rank 1 exited with code 3: boom", exit_code=1, failed_rank=1)
    expect(page.locator("#job-state .state")).to_have_attribute("data-state", "FAILED")
    expect(page.locator("#job-reason")).to_have_text("rank 1 exited with code 3: boom")
    expect(page.locator("#job-failed-rank")).to_have_text("1")
    expect(page.locator("#cancel-form")).to_be_hidden()
    assert page.locator("ol.events li .state").evaluate_all("els => els.map(e => e.dataset.state)") == [
        "LAUNCHING", "RUNNING", "FAILED"]


def test_a_reload_resumes_without_gaps_or_repeats(log_in, job, alice):
    store(job, numbered(0, 100))
    page = log_in(alice)
    page.goto(f"/jobs/{job.pk}/")
    assert_complete(page, 100)
    store(job, numbered(100, 100))
    assert_complete(page, 200)

    page.reload()
    store(job, numbered(200, 50))                                         # while the page loads
    store(job, numbered(250, 50))
    assert_complete(page, 300)
    expect(page.locator("#log .line").last).to_have_text("1line 299")      # following the tail


def test_a_chart_per_metric_gets_a_series_per_rank_live(log_in, job, alice):
    metric = 'RINGMASTER_METRIC {{"step": {step}, "loss": {loss}}}'
    store(job, [(rank, metric.format(step=s, loss=1.0 / (s + 1))) for s in range(5) for rank in (0, 1)])
    page = log_in(alice)
    page.goto(f"/jobs/{job.pk}/")
    chart = page.locator('#charts .chart[data-metric="loss"]')
    expect(chart).to_have_attribute("data-points", "10")
    expect(chart.locator("canvas")).to_have_count(1)
    expect(chart.locator(".u-title")).to_have_text("loss")
    expect(chart.locator(".u-legend .u-series")).to_have_count(3)        # step, rank 0, rank 1

    store(job, [(0, metric.format(step=5, loss=0.1)), (1, "Iter #0: 123.4 img/sec per CPU")])
    expect(chart).to_have_attribute("data-points", "11")
    expect(page.locator('#charts .chart[data-metric="img_per_sec"]')).to_have_attribute("data-points", "1")


def test_a_million_line_log_opens_at_the_tail_and_pages_older_lines_on_scroll(log_in, job, alice):
    total = 1_000_000
    with connection.cursor() as cursor:                                  # stored as by the follower
        cursor.execute(
            "INSERT INTO jobs_logline (job_id, seq, rank, stream, ts, text) "
            "SELECT %s, g, g %% 2, 'stdout', now(), 'line ' || g FROM generate_series(0, %s) g",
            [job.pk, total - 1])
    Job.objects.filter(pk=job.pk).update(next_seq=total)

    page = log_in(alice)
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#log .line").last).to_have_text(f"1line {total - 1}")
    in_sight = seqs_in_sight(page)
    assert in_sight[-1] == total - 1 and len(in_sight) > 10, in_sight
    assert held(page) == (2000, total - 2000, total - 1)
    rows = page.locator("#log .line").count()
    assert 10 < rows < 200, rows                                          # only what is in sight

    # Scrolling to the top fetches the page above, keeping the same lines in sight.
    page.locator("#log").evaluate("el => { el.scrollTop = 0; }")
    wait_for(lambda: held(page)[0] == 4000, timeout=30, message="the older page to load")
    assert held(page) == (4000, total - 4000, total - 1)
    expect(page.locator("#log-follow")).not_to_be_checked()
    assert seqs_in_sight(page)[0] == total - 2000, seqs_in_sight(page)
    assert page.locator("#log .line").count() < 200

    # Rank filter and search run on the server over the whole log, not only the loaded part.
    page.fill("#log-search", "line 12345")
    expect(page.locator("#log .line.hit")).to_have_text(
        [f"↪{seq % 2}line {seq}" for seq in sorted(s for s in range(total) if "line 12345" in f"line {s}")])
    page.check("#log-follow")
    store(job, [(1, "line 12345 again, live")])
    expect(page.locator("#log .line.hit").last).to_have_text("↪1line 12345 again, live")


def test_the_page_reconnects_after_a_web_server_restart_and_misses_nothing(log_in, job, alice,
                                                                            restartable_portal):
    store(job, numbered(0, 20))
    page = log_in(alice, restartable_portal.url)
    page.goto(f"/jobs/{job.pk}/")
    assert_complete(page, 20)

    restartable_portal.kill()
    expect(page.locator("#live-status")).to_have_attribute("data-status", "reconnecting")
    store(job, numbered(20, 30))                                          # stored while nobody serves
    restartable_portal.start()
    expect(page.locator("#live-status")).to_have_attribute("data-status", "live", timeout=30_000)
    store(job, numbered(50, 10))
    assert_complete(page, 60)


def test_cancel_asks_first_then_cancels_in_place_and_the_live_dot_stops_when_the_job_ends(log_in, job, alice):
    page = log_in(alice)
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#live-status")).to_have_attribute("data-status", "live")

    page.once("dialog", lambda dialog: dialog.dismiss())                   # "no": nothing happens
    page.click("#cancel-form button")
    expect(page.locator("#cancel-form")).to_be_visible()
    assert not Job.objects.get(pk=job.pk).cancel_requested

    # A live follower holds the job (on another host), so it stays "cancelling" until that
    # follower sees its processes end (played below), whatever a worker of the session does.
    Job.objects.filter(pk=job.pk).update(follower="another-host:1:1", follower_heartbeat=timezone.now())
    asked = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
    page.click("#cancel-form button")
    expect(page.locator("#cancel-form")).to_be_hidden()
    expect(page.locator("#job-state")).to_contain_text("(cancelling)")
    assert asked == [f"Cancel job {job.pk}? Every one of its processes is stopped."]
    wait_for(lambda: Job.objects.get(pk=job.pk).cancel_requested, timeout=10, message="the cancel to be stored")
    assert page.url.endswith(f"/jobs/{job.pk}/") and page.locator(".message").count() == 0   # in place

    off_loop(states.transition, job.pk, State.CANCELLED, expect={State.RUNNING}, message="stopped")
    expect(page.locator("#job-state .state")).to_have_attribute("data-state", "CANCELLED")
    expect(page.locator("#job-state")).not_to_contain_text("cancelling")
    expect(page.locator("#live-status")).to_have_attribute("data-status", "ended")
    page.reload()                                                           # and on a page opened later
    expect(page.locator("#live-status")).to_have_attribute("data-status", "ended")
    assert page.locator("#cancel-form").count() == 0
