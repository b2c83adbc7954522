"""The Usage page, the staff capacity page and usage.csv against known jobs: the GPU-hours per
day, group, user and backend are written down here, not computed by jobs.domain.accounting.

The known jobs (days are UTC dates, d-2 = two days ago, d-1 = yesterday; nothing runs today, so
the numbers do not depend on the hour the test runs):

    alice  vision  local       2 GPUs  d-2 22:00 -> d-1 02:00  SUCCEEDED  2 h + 2 h across midnight:
                                                                         4.0 on d-2, 4.0 on d-1
    alice  vision  kubernetes  1 GPU   d-2 08:00 -> d-2 08:30  SUCCEEDED  0.5 on d-2
    alice  -       local       1 GPU   d-1 12:00 -> d-1 12:36  CANCELLED  0.6 on d-1 (ran, then cancelled)
    bob    nlp     kubernetes  4 GPUs  d-1 10:00 -> d-1 11:30  FAILED     6.0 on d-1
    carol  -       local       8 GPUs  never ran               CANCELLED  nothing

alice: 4.5 on d-2, 4.6 on d-1, 9.1 in all; vision 8.5, nlp 6.0, no group 0.6.
"""
import csv
import io
import json
from datetime import datetime, time, timedelta
from html.parser import HTMLParser

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils import timezone

from jobs.models import Job, State

D2, D1 = "d-2", "d-1"


def at(day, hour, minute=0):
    return timezone.make_aware(datetime.combine(day, time(hour, minute)))


@pytest.fixture
def known(make_user, image, settings):
    settings.TIME_ZONE = "UTC"                       # days are cut at midnight UTC
    today = timezone.localdate()
    d2, d1 = today - timedelta(days=2), today - timedelta(days=1)
    alice, bob, carol = make_user("alice"), make_user("bob"), make_user("carol")
    vision, nlp = Group.objects.create(name="vision"), Group.objects.create(name="nlp")

    def ran(owner, gpus, start, end, state, gpu_seconds, backend="local", group=None):
        Job.objects.create(owner=owner, image=image, gpus=gpus, script_path="t.py", time_limit_minutes=600,
                           backend=backend, charged_group=group, state=state, started_at=start, finished_at=end,
                           gpu_seconds=gpu_seconds)

    ran(alice, 2, at(d2, 22), at(d1, 2), State.SUCCEEDED, 28800, group=vision)
    ran(alice, 1, at(d2, 8), at(d2, 8, 30), State.SUCCEEDED, 1800, backend="kubernetes", group=vision)
    ran(alice, 1, at(d1, 12), at(d1, 12, 36), State.CANCELLED, 2160)
    ran(bob, 4, at(d1, 10), at(d1, 11, 30), State.FAILED, 21600, backend="kubernetes", group=nlp)
    Job.objects.create(owner=carol, image=image, gpus=8, script_path="t.py", time_limit_minutes=60,
                       state=State.CANCELLED)
    return {D2: d2.isoformat(), D1: d1.isoformat()}


def login(client, username):
    client.force_login(get_user_model().objects.get(username=username))


class Tables(HTMLParser):
    """The rows (lists of cell texts) of each <table> of a page, by the table's classes."""

    def __init__(self, html):
        super().__init__()
        self.tables, self.current, self.row, self.cell = {}, None, None, None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.current = self.tables.setdefault(dict(attrs).get("class", ""), [])
        elif tag == "tr" and self.current is not None:
            self.row = []
        elif tag in ("td", "th") and self.row is not None:
            self.cell = ""

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.row.append(self.cell.strip())
            self.cell = None
        elif tag == "tr" and self.row is not None:
            self.current.append(self.row)
            self.row = None
        elif tag == "table":
            self.current = None

    def body(self, classes):
        """The rows of the table with these classes, without its header row."""
        return self.tables[classes][1:]


def chart_of(html):
    """The JSON the page's chart draws (json_script "usage-data")."""
    start = html.index('<script id="usage-data" type="application/json">') + len(
        '<script id="usage-data" type="application/json">')
    return json.loads(html[start:html.index("</script>", start)])


def test_usage_csv_has_the_gpu_hours_per_day_user_group_and_backend(client, make_user, known):
    client.force_login(make_user("root", is_staff=True))
    response = client.get("/usage.csv?days=7")
    assert response.status_code == 200
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    found = {(row["day"], row["user"], row["group"], row["backend"]): (row["gpu_hours"], row["gpu_seconds"])
             for row in rows}
    assert len(rows) == len(found)                                           # one row per key
    assert found == {
        (known[D2], "alice", "vision", "kubernetes"): ("0.5000", "1800.0"),
        (known[D2], "alice", "vision", "local"): ("4.0000", "14400.0"),
        (known[D1], "alice", "vision", "local"): ("4.0000", "14400.0"),
        (known[D1], "alice", "", "local"): ("0.6000", "2160.0"),
        (known[D1], "bob", "nlp", "kubernetes"): ("6.0000", "21600.0"),
    }


def test_a_users_csv_has_only_their_own_rows(client, known):
    login(client, "bob")
    rows = list(csv.reader(io.StringIO(client.get("/usage.csv?days=7").content.decode())))
    assert rows == [["day", "user", "group", "backend", "gpu_hours", "gpu_seconds"],
                    [known[D1], "bob", "nlp", "kubernetes", "6.0000", "21600.0"]]


def test_a_users_usage_page_has_their_hours_by_day_and_by_group_and_backend(client, known):
    login(client, "alice")
    page = client.get("/usage/?days=7")
    assert page.status_code == 200
    html = page.content.decode()
    assert "<h2>GPU-hours, last 7 days: 9.1</h2>" in html
    tables = Tables(html)
    assert tables.body("jobs usage-by-day") == [[known[D1], "4.6"], [known[D2], "4.5"]]   # newest first
    assert tables.body("jobs usage-by-group") == [
        ["(no group)", "local", "0.6"], ["vision", "kubernetes", "0.5"], ["vision", "local", "8"]]
    chart = chart_of(html)
    d2, d1 = chart["days"].index(known[D2]), chart["days"].index(known[D1])
    assert chart["days"][-3:-1] == [known[D2], known[D1]] and len(chart["days"]) == 7
    assert {group: (values[d2], values[d1], sum(values)) for group, values in chart["series"].items()} == {
        "vision": (4.5, 4.0, 8.5), "(no group)": (0.0, 0.6, 0.6)}
    # The same numbers, unrounded, as the page's context holds them.
    assert page.context["total_hours"] == pytest.approx(9.1)
    by_day = {day.isoformat(): hours for day, hours in page.context["by_day"] if hours}
    assert by_day == {known[D2]: pytest.approx(4.5), known[D1]: pytest.approx(4.6)}
    assert [(group, backend, round(hours, 6)) for group, backend, hours in page.context["by_group"]] == [
        ("(no group)", "local", 0.6), ("vision", "kubernetes", 0.5), ("vision", "local", 8.0)]


def test_another_users_usage_page_has_only_their_hours(client, known):
    login(client, "bob")
    html = client.get("/usage/?days=7").content.decode()
    assert "<h2>GPU-hours, last 7 days: 6</h2>" in html
    tables = Tables(html)
    assert tables.body("jobs usage-by-day") == [[known[D1], "6"]]
    assert tables.body("jobs usage-by-group") == [["nlp", "kubernetes", "6"]]


def test_the_staff_cluster_page_has_everyones_hours_by_group_and_user(client, make_user, known):
    client.force_login(make_user("root", is_staff=True))
    page = client.get("/capacity/?days=7")
    assert page.status_code == 200
    html = page.content.decode()
    tables = Tables(html)
    assert tables.body("jobs usage-by-group") == [["(no group)", "0.6"], ["nlp", "6"], ["vision", "8.5"]]
    assert tables.body("jobs usage-by-user") == [["alice", "9.1"], ["bob", "6"]]
    chart = chart_of(html)
    d2, d1 = chart["days"].index(known[D2]), chart["days"].index(known[D1])
    assert {group: (values[d2], values[d1], sum(values)) for group, values in chart["series"].items()} == {
        "vision": (4.5, 4.0, 8.5), "nlp": (0.0, 6.0, 6.0), "(no group)": (0.0, 0.6, 0.6)}
    assert list(chart["series"]) == ["nlp", "vision", "(no group)"]          # "(no group)" last
    assert {group: round(hours, 6) for group, hours in page.context["by_group"]} == {
        "(no group)": 0.6, "nlp": 6.0, "vision": 8.5}
    assert [(user, round(hours, 6)) for user, hours in page.context["by_user"]] == [("alice", 9.1), ("bob", 6.0)]
