"""The job pages in a real browser: headless Chromium (Debian's /usr/bin/chromium, driven by
Playwright) against uvicorn, with a real Celery worker and horovodrun behind it.

Set RINGMASTER_SCREENSHOT=1 to also save frontend/docs/job-page.png from the first test.
"""
import os
import re

import pytest

from jobs.models import Job, Script, State
from tests.browser.conftest import expect
from tests.conftest import ROOT

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SCREENSHOT = ROOT / "frontend" / "docs" / "job-page.png"
TERMINAL = re.compile(r"^(SUCCEEDED|FAILED|CANCELLED)$")

HELLO_SCRIPT = '''\
import sys

import horovod.torch as hvd
import ringmaster_metrics
import torch

hvd.init()
print(f"hello from rank {hvd.rank()}", flush=True)
print(f"rank {hvd.rank()} says this on stderr", file=sys.stderr, flush=True)
total = hvd.allreduce(torch.tensor([1.0]), name="count", op=hvd.Sum).item()
print(f"rank {hvd.rank()} counted {int(total)} ranks", flush=True)
for step in range(1, 9):
    ringmaster_metrics.log(step=step, loss=round(2.0 / step + 0.1 * hvd.rank(), 3))
'''


def test_submit_uploaded_script_and_follow_it_to_success(log_in, live_portal, celery_worker, image, make_user,
                                                         tmp_path):
    alice = make_user("alice")
    script = tmp_path / "hello_two.py"
    script.write_text(HELLO_SCRIPT)
    page = log_in(alice)

    page.locator("header.top nav a", has_text="New job").click()
    page.wait_for_url(f"{live_portal}/jobs/new/")
    page.fill("#id_name", "hello two ranks")
    page.select_option("#id_image", label="horovod-cpu")
    page.fill("#id_gpus", "2")
    page.set_input_files("#id_script_file", str(script))
    page.get_by_role("button", name="Submit job").click()

    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job_id = int(re.search(r"/jobs/(\d+)/$", page.url).group(1))
    job = Job.objects.get(pk=job_id)
    assert (job.owner, job.gpus, job.name) == (alice, 2, "hello two ranks")
    assert job.script.name == "hello_two.py" and job.script.content == HELLO_SCRIPT and job.script.owner == alice

    # The page follows the job live: the badge and the lines change without a reload.
    page.evaluate("window.stillTheSamePage = true")
    badge = page.locator("#job-state .state")
    expect(badge).to_have_attribute("data-state", TERMINAL, timeout=180_000)
    if badge.get_attribute("data-state") != State.SUCCEEDED:
        reason = page.locator("#job-reason").all_inner_texts()
        pytest.fail(f"job ended {badge.get_attribute('data-state')}: {reason}\n"
                    f"log:\n{page.locator('#log').inner_text()}\nworker:\n{celery_worker.output()[-3000:]}")
    expect(badge).to_have_text("SUCCEEDED")
    assert page.evaluate("window.stillTheSamePage") is True
    expect(page.locator("#cancel-form")).to_be_hidden()
    expect(page.locator("#job-finished")).to_contain_text("GPU-seconds")
    assert page.locator("h1").inner_text().startswith("hello two ranks")

    rank0 = page.locator('#log .line[data-rank="0"]')
    rank1 = page.locator('#log .line[data-rank="1"]')
    hello0 = rank0.filter(has_text="hello from rank 0")
    hello1 = rank1.filter(has_text="hello from rank 1")
    expect(hello0).to_have_count(1)
    expect(hello1).to_have_count(1)
    expect(hello0).to_be_visible()
    expect(hello1).to_be_visible()
    for rank, lines in ((0, rank0), (1, rank1)):
        expect(lines.filter(has_text=f"rank {rank} says this on stderr")).to_have_class(re.compile(r"\bstderr\b"))
        expect(lines.filter(has_text=f"rank {rank} counted 2 ranks")).to_have_count(1)

    chart = page.locator('#charts .chart[data-metric="loss"]')          # what ringmaster_metrics printed
    expect(chart).to_have_attribute("data-points", "16")
    expect(chart.locator(".u-legend .u-series")).to_have_text([re.compile("step"), re.compile("rank 0"),
                                                                re.compile("rank 1")])

    page.select_option("#rank-filter", "1")
    expect(rank0).to_have_count(0)
    expect(page.locator('#log .line:not([data-rank="1"])')).to_have_count(0)
    expect(hello1).to_be_visible()
    page.select_option("#rank-filter", "")
    expect(hello0).to_be_visible()
    expect(hello1).to_be_visible()

    events = page.locator("ol.events li .state").evaluate_all("els => els.map(e => e.dataset.state)")
    assert events == ["QUEUED", "LAUNCHING", "RUNNING", "SUCCEEDED"]

    if os.environ.get("RINGMASTER_SCREENSHOT"):
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), full_page=True)


def test_bad_input_rerenders_the_form_with_errors_and_keeps_the_rest(log_in, live_portal, image, make_user):
    alice = make_user("alice")
    page = log_in(alice)
    page.goto("/jobs/new/")
    page.fill("#id_name", "keep my name")
    page.fill("#id_gpus", "0")
    page.fill("#id_args", "--epochs 3 'two words'")
    page.fill("#id_env", "FOO=bar")
    page.fill("#id_time_limit_minutes", "15")
    assert page.locator("#id_script").input_value() == ""                  # no script chosen or uploaded

    # The browser itself refuses 0 GPUs (min=1); switch its checks off to see the server's.
    assert page.eval_on_selector("#id_gpus", "el => el.validity.rangeUnderflow")
    page.eval_on_selector("#job-form", "form => { form.noValidate = true; }")
    with page.expect_navigation() as navigation:
        page.get_by_role("button", name="Submit job").click()
    assert navigation.value.status == 200                                  # the form again, not a redirect
    assert page.url == f"{live_portal}/jobs/new/"

    gpus_field = page.locator(".field.has-error", has=page.locator("#id_gpus"))
    expect(gpus_field.locator(".error[data-field=gpus]")).to_be_visible()
    expect(gpus_field.locator(".error[data-field=gpus]")).to_contain_text("greater than or equal to 1")
    script_field = page.locator(".field.has-error", has=page.locator("#id_script"))
    expect(script_field.locator(".error[data-field=script]")).to_be_visible()
    expect(script_field.locator(".error[data-field=script]")).to_contain_text("Choose a script")
    assert page.locator(".error[data-field]").evaluate_all("els => els.map(e => e.dataset.field)") == ["gpus", "script"]

    expect(page.locator("#id_name")).to_have_value("keep my name")
    expect(page.locator("#id_gpus")).to_have_value("0")
    expect(page.locator("#id_args")).to_have_value("--epochs 3 'two words'")
    expect(page.locator("#id_env")).to_have_value("FOO=bar")
    expect(page.locator("#id_time_limit_minutes")).to_have_value("15")
    assert not Job.objects.exists()
    assert not Script.objects.filter(owner=alice).exists()


def test_another_users_job_page_is_not_found(log_in, live_portal, image, make_user):
    alice, bob = make_user("alice"), make_user("bob")
    job = Job.objects.create(owner=alice, name="alice secret run", image=image, gpus=2,
                             script_path="train.py", time_limit_minutes=10, state=State.SUCCEEDED)

    alice_page = log_in(alice)                                             # the page exists for its owner
    response = alice_page.goto(f"/jobs/{job.pk}/")
    assert response.status == 200
    expect(alice_page.locator("h1")).to_contain_text("alice secret run")

    bob_page = log_in(bob)
    expect(bob_page.locator("table.jobs")).not_to_contain_text("alice secret run")
    response = bob_page.goto(f"/jobs/{job.pk}/")
    assert response.status == 404
    expect(bob_page.locator("h1")).to_have_text("Not found")
    expect(bob_page.locator("body")).not_to_contain_text("alice secret run")
    csrf = {c["name"]: c["value"] for c in bob_page.context.cookies()}["csrftoken"]
    for action in ("cancel", "rerun"):                                     # nor can bob act on it
        response = bob_page.request.post(f"/jobs/{job.pk}/{action}/", headers={"X-CSRFToken": csrf},
                                         max_redirects=0)
        assert response.status == 404, (action, response.status)
    assert Job.objects.count() == 1
