"""The job list page: filters, search, sort, their links, bad values, the live fragment, the
duration and reason columns, times as <time>, and a constant number of queries whatever the filter."""
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.models import Job, Script, State
from jobs.web.job_filters import short_duration

pytestmark = pytest.mark.django_db


def make_job(owner, image, **extra):
    script, _ = Script.objects.get_or_create(owner=owner, name="t.py", sha256="0" * 64, size=1, content="x")
    return Job.objects.create(owner=owner, image=image, gpus=extra.pop("gpus", 1), script=script,
                              time_limit_minutes=5, **extra)


def listed(client, query=""):
    """The job ids of the page's rows, in order."""
    response = client.get("/" + query)
    assert response.status_code == 200, response.status_code
    page = response.content.decode()
    return [int(pk) for pk in re.findall(r'<tr data-job-id="(\d+)"', page)], page


@pytest.fixture
def jobs(alice, make_user, image):
    now = timezone.now()
    bob = make_user("bob")
    made = {
        "queued": make_job(alice, image, name="resnet queued", gpus=4, reason="waiting for quota: 6 of 8 GPUs in use"),
        "running": make_job(alice, image, name="bert running", gpus=2, state=State.RUNNING,
                            started_at=now - timedelta(minutes=3, seconds=5)),
        "done": make_job(alice, image, name="resnet done", gpus=8, state=State.SUCCEEDED, backend="kubernetes",
                         started_at=now - timedelta(hours=3), finished_at=now - timedelta(hours=1)),
        "failed": make_job(alice, image, name="mnist", gpus=1, state=State.FAILED, backend="instances",
                           started_at=now - timedelta(seconds=50), finished_at=now - timedelta(seconds=5),
                           reason="rank 1: RuntimeError: " + "x" * 200),
        "bobs": make_job(bob, image, name="bobs resnet", gpus=3, state=State.RUNNING,
                         started_at=now - timedelta(hours=5)),
    }
    return {name: job.pk for name, job in made.items()}


def test_filters_by_state_backend_and_name(client, alice, jobs):
    client.force_login(alice)
    mine = [jobs[name] for name in ("failed", "done", "running", "queued")]            # newest first
    assert listed(client)[0] == mine
    assert listed(client, "?state=RUNNING")[0] == [jobs["running"]]
    assert listed(client, "?backend=kubernetes")[0] == [jobs["done"]]
    assert listed(client, "?q=RESNET")[0] == [jobs["done"], jobs["queued"]]            # case-insensitive
    assert listed(client, f"?q=%23{jobs['failed']}")[0] == [jobs["failed"]]   # #id
    assert listed(client, "?q=resnet&state=QUEUED")[0] == [jobs["queued"]]
    assert listed(client, "?state=CANCELLED")[0] == []
    assert "No jobs match." in listed(client, "?state=CANCELLED")[1]


def test_sorts_by_submitted_gpus_and_duration(client, alice, jobs):
    client.force_login(alice)
    assert listed(client, "?sort=oldest")[0] == [jobs[n] for n in ("queued", "running", "done", "failed")]
    assert listed(client, "?sort=gpus")[0] == [jobs[n] for n in ("done", "queued", "running", "failed")]
    assert listed(client, "?sort=-gpus")[0] == [jobs[n] for n in ("failed", "running", "queued", "done")]
    # Run time: 2 h, 3 min (still running), 45 s; never started last either way.
    assert listed(client, "?sort=longest")[0] == [jobs[n] for n in ("done", "running", "failed", "queued")]
    assert listed(client, "?sort=shortest")[0] == [jobs[n] for n in ("failed", "running", "done", "queued")]


def test_a_user_never_sees_another_owners_jobs_and_staff_filter_by_owner(client, alice, make_user, jobs):
    client.force_login(alice)
    for query in ("?owner=bob", "?owner=bob&mine=", "?q=bobs", f"?q={jobs['bobs']}"):
        ids, page = listed(client, query)
        assert jobs["bobs"] not in ids and "bobs resnet" not in page
    assert 'name="owner"' not in listed(client)[1]                     # no owner filter offered

    client.force_login(make_user("root", is_staff=True))
    assert listed(client, "?owner=BOB")[0] == [jobs["bobs"]]
    assert len(listed(client)[0]) == 5
    assert listed(client, "?owner=alice&state=RUNNING")[0] == [jobs["running"]]
    assert listed(client, "?mine=1")[0] == []
    assert listed(client, "?owner=nobody")[0] == []


@pytest.mark.parametrize("query, refused", [
    ("?state=BOGUS", True), ("?sort=drop+table", True), ("?backend=nope", True), ("?q=%00", True),
    ("?owner=%00", True), ("?q=" + "x" * 500, True), ("?live=1&state=BOGUS", False),
    ("?page=abc", False), ("?page=99999999999999999999", False), ("?q=%ED%A0%80", False),
    ("?q=%2399999999999999999999999", False), ("?mine=maybe", False), ("?state=RUNNING&state=QUEUED&sort=", False),
])
def test_bad_filter_values_are_ignored_and_named_never_a_500(client, make_user, jobs, query, refused):
    client.force_login(make_user("root", is_staff=True))
    response = client.get("/" + query)
    assert response.status_code == 200
    assert ('id="filter-errors"' in response.content.decode()) is refused


def test_a_bad_value_is_left_out_while_the_good_ones_apply(client, alice, jobs):
    client.force_login(alice)
    ids, page = listed(client, "?state=RUNNING&sort=nonsense")
    assert ids == [jobs["running"]]
    assert "Ignored Sort: Select a valid choice." in page


def test_links_keep_the_filters(client, alice, image):
    for i in range(30):
        make_job(alice, image, name=f"run-{i}", state=State.SUCCEEDED)
    make_job(alice, image, name="other", state=State.FAILED)
    client.force_login(alice)
    ids, page = listed(client, "?state=SUCCEEDED&q=run&sort=oldest")
    assert len(ids) == 25 and "page 1 of 2 · 30 jobs" in page
    assert 'href="?q=run&amp;state=SUCCEEDED&amp;sort=oldest&amp;page=2"' in page
    assert 'data-live="/?q=run&amp;state=SUCCEEDED&amp;sort=oldest&amp;page=1&amp;live=1"' in page
    # The Submitted heading reverses the current sort, keeping the filters; GPUs starts at "most".
    assert 'href="?q=run&amp;state=SUCCEEDED&amp;sort=newest">Submitted ↑' in page
    assert 'href="?q=run&amp;state=SUCCEEDED&amp;sort=gpus">GPUs' in page
    second, _ = listed(client, "?q=run&state=SUCCEEDED&sort=oldest&page=2")
    assert len(second) == 5 and not set(second) & set(ids)
    assert Job.objects.get(pk=second[-1]).name == "run-29"


def test_the_live_fragment_is_the_rows_and_the_pager_only(client, alice, jobs):
    client.force_login(alice)
    response = client.get("/?state=RUNNING&live=1")
    body = response.content.decode()
    assert response.status_code == 200 and "<html" not in body and "<header" not in body
    assert body.count("<tr data-job-id=") == 1 and f'data-job-id="{jobs["running"]}"' in body
    assert 'id="job-rows"' in body and 'id="job-pager"' in body


def test_rows_show_duration_short_reason_and_times_for_the_viewers_zone(client, alice, jobs):
    client.force_login(alice)
    page = listed(client)[1]
    row = page[page.index(f'data-job-id="{jobs["running"]}"'):]
    row = row[:row.index("</tr>")]
    assert '<td class="duration">3m 05s</td>' in row or '<td class="duration">3m 06s</td>' in row
    created = Job.objects.get(pk=jobs["running"]).created_at
    assert f'<time datetime="{created.isoformat()}" data-format="auto">' in row
    assert "ago" not in page
    failed = page[page.index(f'data-job-id="{jobs["failed"]}"'):]
    assert '<td class="duration">45s</td>' in failed[:failed.index("</tr>")]
    assert "rank 1: RuntimeError: xxx" in failed and "x" * 100 not in failed[:failed.index("title=")]
    assert "…" in failed[:failed.index("</tr>")]


def test_short_durations():
    assert [short_duration(timedelta(seconds=s)) for s in (0, 45, 185, 7380, 3 * 86400 + 4 * 3600 + 5)] == \
        ["0s", "45s", "3m 05s", "2h 03m", "3d 4h"]
    assert short_duration(None) == ""


@pytest.mark.parametrize("query", ["", "?state=SUCCEEDED", "?backend=local&q=job", "?sort=longest",
                                   "?sort=gpus&owner=alice", "?mine=1&sort=oldest", "?live=1&sort=shortest"])
def test_the_same_number_of_queries_with_many_jobs_for_every_filter(client, alice, make_user, image, query):
    staff = make_user("root", is_staff=True)

    def count(user, suffix):
        client.force_login(user)
        with CaptureQueriesContext(connection) as captured:
            assert client.get("/" + query + suffix).status_code == 200
        return len(captured)

    for owner in (alice, alice, staff):                   # every filter shows some: a page with rows
        make_job(owner, image, name="job", state=State.SUCCEEDED, started_at=timezone.now())
    few = (count(alice, ""), count(staff, ""))
    for i in range(60):
        make_job(alice if i % 2 else staff, image, name="job", state=State.SUCCEEDED, started_at=timezone.now())
    page_two = "&page=2" if query else "?page=2"
    assert (count(alice, page_two), count(staff, page_two)) == few
