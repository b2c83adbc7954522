"""The usage pages in a real browser: the capacity page draws GPU-hours per group with the
vendored uPlot (no CDN), and the job form shows the user's use against each limit."""
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from jobs.models import Job, Quota, Script, State
from tests.browser.conftest import expect

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_cluster_chart_and_the_quota_panel_of_the_form(log_in, image, make_user):
    vision = Group.objects.create(name="vision")
    alice, root = make_user("alice"), make_user("root", is_staff=True)
    vision.user_set.add(alice)
    Quota.objects.create(group=vision, gpus=16)
    script = Script.objects.create(owner=None, name="t.py", sha256="0" * 64, size=1, content="x")
    now = timezone.now()
    for days, gpus in ((3, 4), (1, 2)):
        Job.objects.create(owner=alice, image=image, script=script, gpus=gpus, time_limit_minutes=600,
                           charged_group=vision, state=State.SUCCEEDED, started_at=now - timedelta(days=days, hours=2),
                           finished_at=now - timedelta(days=days), gpu_seconds=gpus * 7200)
    Job.objects.create(owner=alice, image=image, script=script, gpus=2, time_limit_minutes=600, charged_group=vision,
                       state=State.RUNNING, started_at=now - timedelta(minutes=30))

    page = log_in(root)
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.locator("header.top nav a", has_text="Capacity").click()
    expect(page.locator("#usage-chart canvas")).to_have_count(1)              # uPlot drew the chart
    expect(page.locator("#usage-chart .u-legend")).to_contain_text("vision")
    expect(page.locator("table.quotas")).to_contain_text("GPUs at once: 2 of 16")
    assert errors == []

    page = log_in(alice)
    page.goto("/jobs/new/")
    panel = page.locator("#quota-panel")
    expect(panel.locator('tr[data-scope="group:vision"]')).to_contain_text("2 of 16")
    expect(panel).to_contain_text("jobs are charged to vision")
