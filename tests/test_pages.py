"""The browser's pages, through Django's test client."""
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from jobs.models import Job, LogLine, Script, State

pytestmark = pytest.mark.django_db


def make_job(owner, image, **extra):
    script, _ = Script.objects.get_or_create(owner=owner, name="t.py", sha256="0" * 64, size=1, content="x")
    return Job.objects.create(owner=owner, image=image, gpus=1, script=script, time_limit_minutes=5, **extra)


def test_pages_need_login(client):
    for url in ("/", "/jobs/new/", "/jobs/1/"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_job_list_shows_own_jobs_paginated_and_staff_see_all(client, alice, make_user, image):
    bob = make_user("bob")
    for i in range(30):
        make_job(alice, image, name=f"alice-{i}")
    make_job(bob, image, name="bobs-job")
    client.force_login(alice)
    first = client.get("/").content.decode()
    assert "alice-29" in first and "alice-5<" in first and "alice-4<" not in first and "bobs-job" not in first
    assert "page 1 of 2" in first
    second = client.get("/?page=2").content.decode()
    assert "alice-4<" in second and "alice-0<" in second and "alice-5<" not in second

    client.force_login(make_user("root", is_staff=True))
    assert "bobs-job" in client.get("/").content.decode()
    assert "bobs-job" not in client.get("/?mine=1").content.decode()


def test_the_form_submits_an_uploaded_script_with_text_args_and_env(client, alice, image, django_capture_on_commit_callbacks,
                                                                    _local_nvidia_smi):
    client.force_login(alice)
    form = client.get("/jobs/new/").content.decode()
    assert ("This machine: no GPU here (nvidia-smi sees none), so each GPU asked for is one "
            "process on the CPU, 8 at once.") in form
    with django_capture_on_commit_callbacks():
        response = client.post("/jobs/new/", {
            "name": "from the form", "image": image.pk, "gpus": 2, "backend": "local",
            "script_file": SimpleUploadedFile("my train.py", b"print('hi')\n"),
            "args": "--lr 0.1 'two words'", "env": "A=1\nB=x=y\n",
        })
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert job.args == ["--lr", "0.1", "two words"] and job.env == {"A": "1", "B": "x=y"}
    assert job.script.name == "my_train.py" and job.script.owner == alice
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "from the form" in page and 'data-state="QUEUED"' in page


def test_bad_form_input_is_shown_next_to_the_field_and_kept(client, alice, image):
    client.force_login(alice)
    response = client.post("/jobs/new/", {"name": "keep me", "image": image.pk, "gpus": 0, "backend": "local",
                                           "env": "not a pair"})
    page = response.content.decode()
    assert response.status_code == 200
    assert 'data-field="gpus"' in page and 'data-field="env"' in page and 'data-field="script"' in page
    assert 'value="keep me"' in page
    assert Job.objects.count() == 0


def test_detail_of_another_users_job_is_404(client, alice, make_user, image):
    job = make_job(alice, image)
    client.force_login(make_user("bob"))
    assert client.get(f"/jobs/{job.pk}/").status_code == 404
    assert client.post(f"/jobs/{job.pk}/cancel/").status_code == 404
    assert client.post(f"/jobs/{job.pk}/rerun/").status_code == 404


# The view streams an async iterator for uvicorn; Django's test client reads it synchronously.
@pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume asynchronous iterators")
def test_log_download_is_the_whole_log_or_one_rank_and_only_for_its_owner(client, alice, make_user, image):
    from django.utils import timezone

    job = make_job(alice, image)
    LogLine.objects.bulk_create(LogLine(job=job, seq=i, rank=(None if i == 0 else i % 2), stream="stdout",
                                        ts=timezone.now(), text=f"line {i}") for i in range(12001))
    client.force_login(alice)
    response = client.get(f"/jobs/{job.pk}/log/")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    assert f'filename="ringmaster-job-{job.pk}.log"' in response["Content-Disposition"]
    text = b"".join(response).decode()
    assert text.splitlines()[:3] == ["[launcher] line 0", "[1] line 1", "[0] line 2"]
    assert len(text.splitlines()) == 12001 and text.endswith("[0] line 12000\n")

    response = client.get(f"/jobs/{job.pk}/log/?rank=1")
    assert f'filename="ringmaster-job-{job.pk}-rank-1.log"' in response["Content-Disposition"]
    lines = b"".join(response).decode().splitlines()
    assert lines == [f"line {i}" for i in range(1, 12001, 2)]
    assert client.get(f"/jobs/{job.pk}/log/?rank=x").status_code == 404

    client.force_login(make_user("bob"))
    assert client.get(f"/jobs/{job.pk}/log/").status_code == 404


def test_rerun_submits_the_same_settings_again(client, alice, image, django_capture_on_commit_callbacks):
    old = make_job(alice, image, name="again", args=["--x", "1"], env={"A": "b"})
    client.force_login(alice)
    with django_capture_on_commit_callbacks():
        response = client.post(f"/jobs/{old.pk}/rerun/")
    new = Job.objects.exclude(pk=old.pk).get()
    assert response["Location"] == f"/jobs/{new.pk}/"
    assert (new.name, new.args, new.env, new.script, new.gpus, new.state) == (
        "again", ["--x", "1"], {"A": "b"}, old.script, 1, State.QUEUED)


def test_rerun_of_a_job_whose_image_was_disabled_says_why(client, alice, image):
    old = make_job(alice, image)
    image.enabled = False
    image.save()
    client.force_login(alice)
    response = client.post(f"/jobs/{old.pk}/rerun/", follow=True)
    assert "Cannot rerun" in response.content.decode() and "No enabled image" in response.content.decode()
    assert Job.objects.count() == 1


def test_cancel_button_cancels_a_queued_job(client, alice, image):
    job = make_job(alice, image)
    client.force_login(alice)
    client.post(f"/jobs/{job.pk}/cancel/")
    assert Job.objects.get(pk=job.pk).state == State.CANCELLED


def test_csrf_is_enforced_on_the_form(alice, image):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)
    assert strict.post("/jobs/new/", {"gpus": 1}).status_code == 403


def test_an_upload_together_with_a_library_script_is_refused_not_silently_preferred(client, alice, image):
    library = Script.objects.create(owner=None, name="example.py", sha256="1" * 64, size=1, content="x")
    client.force_login(alice)
    response = client.post("/jobs/new/", {
        "image": image.pk, "gpus": 1, "backend": "local", "script": library.pk,
        "script_file": SimpleUploadedFile("mine.py", b"print(1)\n"),
    })
    assert response.status_code == 200
    assert "Give only one of" in response.content.decode()
    assert Job.objects.count() == 0 and not Script.objects.filter(name="mine.py").exists()


def test_missing_pages_keep_the_portal_around_them(client, alice):
    client.force_login(alice)
    response = client.get("/jobs/987654/")
    assert response.status_code == 404
    assert "Ringmaster" in response.content.decode() and 'href="/"' in response.content.decode()


def test_the_form_says_which_gpus_this_machine_has_and_when_nvidia_smi_fails(client, alice, image, local_gpus):
    client.force_login(alice)
    local_gpus(["NVIDIA A100-SXM4-80GB"] * 3 + ["NVIDIA H100 80GB HBM3"])
    form = client.get("/jobs/new/").content.decode()
    assert ("This machine: 4 GPUs (NVIDIA A100-SXM4-80GB, NVIDIA H100 80GB HBM3); "
            "each job gets GPUs of its own.") in form
    local_gpus(["NVIDIA A100-SXM4-80GB"], behaviour="fail")
    form = client.get("/jobs/new/").content.decode()
    assert "This machine: nvidia-smi fails here (" in form and "jobs wait until it answers" in form


def test_jobs_leads_to_the_job_list_and_every_page_has_an_icon(client, alice):
    from django.contrib.staticfiles import finders

    client.force_login(alice)
    response = client.get("/jobs/?mine=1")
    assert response.status_code == 302 and response["Location"] == "/?mine=1"
    icon = client.get("/favicon.ico")
    assert icon.status_code == 301 and icon["Location"] == "/static/ringmaster/favicon.svg"
    assert finders.find("ringmaster/favicon.svg")
    assert '<link rel="icon" href="/static/ringmaster/favicon.svg"' in client.get("/").content.decode()


def test_the_form_speaks_in_labels_a_person_reads(client, alice, image):
    client.force_login(alice)
    form = client.get("/jobs/new/").content.decode()
    for label in ("GPUs", "Time limit (minutes)", "Environment variables", "Arguments", "Script path"):
        assert f">{label}</label>" in form or f">{label}:</label>" in form, label
    assert ">Gpus" not in form and ">Env<" not in form and ">Time limit minutes" not in form
