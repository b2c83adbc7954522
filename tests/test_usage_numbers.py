"""The Usage page, the staff cluster page and usage.csv against known jobs: the GPU-hours per
day, group, user and backend are written down here, not computed by jobs.domain.accounting."""
import csv
import io
from datetime import datetime, time, timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from jobs.models import Job, State

DAYS_AGO_2, DAYS_AGO_1 = "d-2", "d-1"


def at(day, hour, minute=0):
    return timezone.make_aware(datetime.combine(day, time(hour, minute)))


@pytest.fixture
def known(make_user, image):
    """alice (group vision): 2 GPUs from 22:00 two days ago to 02:00 yesterday (4 h + 4 h, across
    midnight), and a cancelled 1-GPU job of 45 minutes yesterday without a group; bob (group
    nlp): a failed 4-GPU kubernetes job of 90 minutes yesterday; carol: a job that never ran."""
    today = timezone.localdate()
    d2, d1 = today - timedelta(days=2), today - timedelta(days=1)
    alice, bob, carol = make_user("alice"), make_user("bob"), make_user("carol")
    vision, nlp = Group.objects.create(name="vision"), Group.objects.create(name="nlp")

    def ran(owner, gpus, start, end, state, backend="local", group=None):
        Job.objects.create(owner=owner, image=image, gpus=gpus, script_path="t.py", time_limit_minutes=600,
                           backend=backend, charged_group=group, state=state, started_at=start, finished_at=end,
                           gpu_seconds=(end - start).total_seconds() * gpus)

    ran(alice, 2, at(d2, 22), at(d1, 2), State.SUCCEEDED, group=vision)
    ran(alice, 1, at(d1, 12), at(d1, 12, 45), State.CANCELLED)
    ran(bob, 4, at(d1, 10), at(d1, 11, 30), State.FAILED, backend="kubernetes", group=nlp)
    Job.objects.create(owner=carol, image=image, gpus=8, script_path="t.py", time_limit_minutes=60,
                       state=State.CANCELLED)
    return {DAYS_AGO_2: d2.isoformat(), DAYS_AGO_1: d1.isoformat()}


def test_usage_csv_has_the_gpu_hours_per_day_user_group_and_backend(client, make_user, known):
    client.force_login(make_user("root", is_staff=True))
    rows = list(csv.DictReader(io.StringIO(client.get("/usage.csv?days=7").content.decode())))
    hours = {(row["day"], row["user"], row["group"], row["backend"]): row["gpu_hours"] for row in rows}
    assert hours == {
        (known[DAYS_AGO_2], "alice", "vision", "local"): "4.0000",
        (known[DAYS_AGO_1], "alice", "vision", "local"): "4.0000",
        (known[DAYS_AGO_1], "alice", "", "local"): "0.7500",
        (known[DAYS_AGO_1], "bob", "nlp", "kubernetes"): "6.0000",
    }


def test_a_users_usage_page_has_their_hours_by_day_and_by_group_and_backend(client, known):
    from django.contrib.auth import get_user_model

    client.force_login(get_user_model().objects.get(username="alice"))
    page = client.get("/usage/?days=7")
    assert page.status_code == 200
    assert page.context["total_hours"] == pytest.approx(8.75)
    by_day = {day.isoformat(): hours for day, hours in page.context["by_day"]}
    assert by_day[known[DAYS_AGO_2]] == pytest.approx(4.0) and by_day[known[DAYS_AGO_1]] == pytest.approx(4.75)
    assert sum(by_day.values()) == pytest.approx(8.75)
    assert [(group, backend, round(hours, 4)) for group, backend, hours in page.context["by_group"]] == [
        ("(no group)", "local", 0.75), ("vision", "local", 8.0)]
    assert "GPU-hours, last 7 days: 8.8</h2>" in page.content.decode()       # one decimal, as people read it


def test_the_staff_cluster_page_has_everyones_hours_by_group_and_user(client, make_user, known):
    client.force_login(make_user("root", is_staff=True))
    page = client.get("/cluster/?days=7")
    assert page.status_code == 200
    assert {group: round(hours, 4) for group, hours in page.context["by_group"]} == {
        "(no group)": 0.75, "nlp": 6.0, "vision": 8.0}
    assert [(user, round(hours, 4)) for user, hours in page.context["by_user"]] == [("alice", 8.75), ("bob", 6.0)]
    chart = page.context["chart"]
    assert chart["series"]["vision"][chart["days"].index(known[DAYS_AGO_2])] == 4.0
    assert chart["series"]["nlp"][chart["days"].index(known[DAYS_AGO_1])] == 6.0
