"""The job form in a real browser (headless Chromium against uvicorn): the GPU field's maximum
follows the backend select (capacity and quota, as the server computed them), descriptions follow
their selects, and an uploaded script survives a refused submission."""
import re

import pytest

from jobs.backends.instances.models import Instance
from jobs.models import Job, Quota, Script
from tests.browser.conftest import expect

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SCRIPT = 'print("kept across the refusal")\n'


def test_gpu_maximum_follows_the_backend_and_an_upload_is_kept(log_in, live_portal, image, make_user, tmp_path):
    alice = make_user("alice")
    Quota.objects.create(user=alice, gpus_per_job=12)
    Instance.objects.create(name="big", host="big.example", user="u", gpus=16, healthy=True)
    Script.objects.create(owner=None, name="hello.py", sha256="5" * 64, size=1,
                          content='"""Every rank says hello."""\nprint(1)\n')
    page = log_in(alice)
    page.goto("/jobs/new/")

    # The live portal's machine runs 4 processes (RINGMASTER_LOCAL_GPUS=4): below alice's quota.
    gpus, note = page.locator("#id_gpus"), page.locator("#gpus-limit")
    expect(gpus).to_have_attribute("max", "4")
    expect(note).to_have_text("At most 4 GPUs per job on This machine: all it can hold.")
    page.select_option("#id_backend", "instances")                # 16 GPUs there: the quota's 12 bind
    expect(gpus).to_have_attribute("max", "12")
    expect(note).to_have_text("At most 12 GPUs per job on GPU instances over SSH: your quota.")
    page.fill("#id_gpus", "13")
    assert page.eval_on_selector("#id_gpus", "el => el.validity.rangeOverflow")
    page.select_option("#id_backend", "local")
    expect(gpus).to_have_attribute("max", "4")

    page.select_option("#id_script", label="hello.py (example)")  # a description follows its select
    expect(page.locator("#id_script-description")).to_have_text("Every rank says hello.")
    page.select_option("#id_script", "")
    expect(page.locator("#id_script-description")).to_have_text("")
    expect(page.locator("#id_image-description")).to_have_text("test image")

    # A refused submission keeps the uploaded file: the second try sends none and runs it.
    script = tmp_path / "kept_me.py"
    script.write_text(SCRIPT)
    page.fill("#id_gpus", "2")
    page.fill("#id_env", "GOOD=1\nnot a pair\n2BAD=x")
    page.set_input_files("#id_script_file", str(script))
    with page.expect_navigation():
        page.get_by_role("button", name="Submit job").click()
    env_errors = page.locator(".field.has-error .error[data-field=env]")
    expect(env_errors).to_have_count(2)
    expect(page.locator("#kept-upload")).to_have_text(re.compile(r"using uploaded kept_me\.py \(replace\)"))
    expect(page.locator("#id_script_file")).to_be_hidden()            # the browser forgot the file; the form did not
    expect(gpus).to_have_attribute("max", "4")
    page.fill("#id_env", "GOOD=1")
    with page.expect_navigation():
        page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job = Job.objects.get(pk=int(re.search(r"/jobs/(\d+)/$", page.url).group(1)))
    assert (job.owner, job.gpus, job.env, job.script.name, job.script.content) == (
        alice, 2, {"GOOD": "1"}, "kept_me.py", SCRIPT)

    # "replace" drops the kept upload: the form then asks for a script again.
    page.goto("/jobs/new/")
    page.set_input_files("#id_script_file", str(script))
    page.fill("#id_env", "bad")
    with page.expect_navigation():
        page.get_by_role("button", name="Submit job").click()
    page.get_by_role("button", name="replace").click()
    expect(page.locator("#kept-upload")).to_have_count(0)
    expect(page.locator("#id_script_file")).to_be_visible()
    expect(page.locator("#id_uploaded_script")).to_have_value("")
    page.fill("#id_env", "")
    with page.expect_navigation():
        page.get_by_role("button", name="Submit job").click()
    expect(page.locator(".error[data-field=script]")).to_contain_text("Choose a script")
    assert Job.objects.count() == 1


def test_rerun_opens_the_filled_in_form_and_the_new_job_links_its_parent(log_in, live_portal, image, make_user):
    from jobs.models import State

    alice = make_user("alice")
    old = Job.objects.create(owner=alice, name="first try", image=image, gpus=2, script_path="train.py",
                             args=["--lr", "0.1"], env={"SEED": "7"}, time_limit_minutes=9, state=State.FAILED)
    page = log_in(alice)
    page.goto(f"/jobs/{old.pk}/")
    page.get_by_role("link", name="Rerun").click()
    page.wait_for_url(f"{live_portal}/jobs/{old.pk}/rerun/")
    expect(page.locator("#rerun-of")).to_contain_text(f"Rerun of job {old.pk}")
    expect(page.locator("#id_name")).to_have_value("first try")
    expect(page.locator("#id_script_path")).to_have_value("train.py")
    expect(page.locator("#id_args")).to_have_value("--lr 0.1")
    expect(page.locator("#id_env")).to_have_value("SEED=7")
    expect(page.locator("#id_time_limit_minutes")).to_have_value("9")
    assert Job.objects.count() == 1
    page.fill("#id_gpus", "1")
    with page.expect_navigation():
        page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    new = Job.objects.exclude(pk=old.pk).get()
    assert (new.parent_id, new.gpus, new.args, new.env) == (old.pk, 1, ["--lr", "0.1"], {"SEED": "7"})
    expect(page.locator("#job-parent")).to_contain_text(f"job {old.pk}")
    page.locator("#job-parent a").click()
    page.wait_for_url(f"{live_portal}/jobs/{old.pk}/")
