"""The job form (issue 12, item 6), through Django's test client: messages name fields as a
person reads them, every bad line is reported, an upload survives a refused submission, the
GPU field's maximum follows the quota and the backend, and choices carry their descriptions."""
import html
import json
import re

import pytest
from django.contrib.auth.models import Group
from django.core.files.uploadedfile import SimpleUploadedFile

from jobs import backends
from jobs.backends.instances.models import Instance
from jobs.models import Job, Quota, Script

pytestmark = pytest.mark.django_db

ERROR = re.compile(r'<p class="error" data-field="([^"]+)">(.*?)</p>', re.S)


def errors(response):
    """{field: [message, ...]} as the page shows them (every error, in one style)."""
    found = {}
    for field, text in ERROR.findall(response.content.decode()):
        found.setdefault(field, []).append(html.unescape(text))
    return found


def gpus_input(page):
    return re.search(r'<input type="number" name="gpus"[^>]*>', page).group(0)


def attr(tag, name):
    match = re.search(fr'\b{name}="([^"]*)"', tag)
    return html.unescape(match.group(1)) if match else None


def test_no_message_names_an_internal_field(client, alice, image, api_client):
    client.force_login(alice)
    response = client.post("/jobs/new/", {"image": image.pk, "gpus": 1, "backend": "local"})
    shown = errors(response)
    assert shown["script"] == ["Choose a script: upload one, pick one from the library, "
                               "give the path of a script inside the image, or give a project."]
    assert not any("script_path" in message for messages in shown.values() for message in messages)

    answer = api_client(alice).post("/api/jobs/", {"image": image.name, "gpus": 1}, format="json")
    assert answer.status_code == 400
    assert not any("script_path" in message for messages in answer.json().values() for message in messages)


def test_every_field_shows_its_errors_beside_it_in_one_style(client, alice, image):
    client.force_login(alice)
    response = client.post("/jobs/new/", {"image": image.pk, "gpus": 0, "backend": "local",
                                          "script_path": "train.py", "time_limit_minutes": "x"})
    page = response.content.decode()
    shown = errors(response)
    assert set(shown) == {"gpus", "time_limit_minutes"}
    for field in shown:                    # each error sits in its field's box, none as a bare list
        box = page.split(f'id="field-{field}"')[1].split('<div class="field')[0]
        assert f'data-field="{field}"' in box
    assert 'class="errorlist' not in page


def test_every_bad_environment_line_is_reported(client, alice, image, api_client):
    client.force_login(alice)
    response = client.post("/jobs/new/", {
        "image": image.pk, "gpus": 1, "backend": "local", "script_path": "train.py",
        "env": "GOOD=1\nnot a pair\n1BAD=2\nRINGMASTER_X=3\nGOOD=4\nALSO BAD=5\n"})
    assert errors(response)["env"] == [
        "Line 2: expected NAME=value.",
        "Line 3: '1BAD' is not a valid variable name (letters, digits and _, not starting with a digit).",
        "Line 4: RINGMASTER_X: names starting with RINGMASTER_ are reserved.",
        "Line 5: GOOD is already set on line 1.",
        "Line 6: 'ALSO BAD' is not a valid variable name (letters, digits and _, not starting with a digit).",
    ]
    answer = api_client(alice).post("/api/jobs/", {"image": image.name, "gpus": 1, "script_path": "t.py",
                                                   "env": {"1BAD": "x", "A-B": "y", "OK": "z"}}, format="json")
    assert answer.status_code == 400 and len(answer.json()["env"]) == 2
    assert Job.objects.count() == 0


def test_an_upload_is_kept_after_a_refusal_and_the_job_runs_it(client, alice, image, make_user,
                                                                django_capture_on_commit_callbacks):
    client.force_login(alice)
    response = client.post("/jobs/new/", {
        "image": image.pk, "gpus": 0, "backend": "local", "name": "keep it",
        "script_file": SimpleUploadedFile("my train.py", b"print('kept')\n")})
    assert set(errors(response)) == {"gpus"}
    script = Script.objects.get(owner=alice)
    page = response.content.decode()
    assert re.search(r'using uploaded <code>my_train.py</code>', page)
    assert attr(re.search(r'<input type="hidden" name="uploaded_script"[^>]*>', page).group(0), "value") == str(script.pk)

    # The second try sends no file, only the kept one's id: the job runs the first upload.
    with django_capture_on_commit_callbacks():
        response = client.post("/jobs/new/", {"image": image.pk, "gpus": 1, "backend": "local", "name": "keep it",
                                              "uploaded_script": script.pk})
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert job.script == script and job.script.content == "print('kept')\n" and job.script_path == ""

    # Another user's script cannot be kept, and a kept upload with a path is two scripts.
    bob = make_user("bob")
    theirs = Script.objects.create(owner=bob, name="b.py", sha256="2" * 64, size=1, content="x")
    response = client.post("/jobs/new/", {"image": image.pk, "gpus": 1, "backend": "local",
                                          "uploaded_script": theirs.pk})
    assert errors(response)["uploaded_script"] == ["The script uploaded earlier is gone; upload it again."]
    response = client.post("/jobs/new/", {"image": image.pk, "gpus": 1, "backend": "local",
                                          "uploaded_script": script.pk, "script_path": "x.py"})
    assert errors(response)["script"][0].startswith("Give only one of")
    assert Job.objects.count() == 1


def test_the_gpu_maximum_is_the_least_of_quota_and_capacity(client, alice, image, settings):
    local = backends.get("local")
    capacity = local.largest_job()
    assert capacity                                         # this machine's slots (no nvidia-smi: CPU slots)
    Instance.objects.create(name="big", host="big.example", user="u", gpus=capacity + 8, healthy=True)
    client.force_login(alice)

    def limits():
        page = client.get("/jobs/new/").content.decode()
        tag = gpus_input(page)
        return attr(tag, "max"), json.loads(attr(tag, "data-limits")), page

    # No quota of alice's own: the backend's capacity, each backend its own.
    most, by_backend, page = limits()
    assert most == str(capacity)
    assert by_backend["local"][""][0] == capacity and by_backend["instances"][""][0] == capacity + 8
    assert f"At most {capacity} GPUs per job on This machine: all it can hold." in page

    # A per-job quota below the capacity is the maximum, and says so; on both backends.
    Quota.objects.create(user=alice, gpus_per_job=capacity - 1)
    most, by_backend, page = limits()
    assert most == str(capacity - 1) and by_backend["instances"][""][0] == capacity - 1
    assert f"At most {capacity - 1} GPUs per job on This machine: your quota." in page

    # GPUs at once counts as well (a job can never hold more), and the smaller of the two wins.
    Quota.objects.filter(user=alice).update(gpus_per_job=None, gpus=capacity + 4)
    most, by_backend, _ = limits()
    assert most == str(capacity) and by_backend["instances"][""][0] == capacity + 4

    # A group's quota counts for the jobs charged to it: one maximum per group.
    team, other = Group.objects.create(name="team"), Group.objects.create(name="other")
    alice.groups.add(team, other)
    Quota.objects.create(group=team, gpus_per_job=2)
    most, by_backend, _ = limits()                           # the form opens on the default group: other
    assert most == str(capacity)
    assert by_backend["local"]["team"][0] == 2 and by_backend["local"]["other"][0] == capacity

    # The server refuses what the maximum says: one rule, two places it shows.
    response = client.post("/jobs/new/", {"image": image.pk, "gpus": capacity + 5, "backend": "instances",
                                          "group": "other", "script_path": "t.py"})
    assert "gpus" in errors(response)
    settings.RINGMASTER_MAX_GPUS_PER_JOB = 3
    assert limits()[0] == "3"


def test_images_and_example_scripts_show_their_descriptions(client, alice, image):
    example = Script.objects.create(owner=None, name="hello.py", sha256="3" * 64, size=1,
                                    content='"""Every rank says hello.\n\nMore detail here."""\nprint(1)\n')
    Script.objects.create(owner=None, name="bare.py", sha256="4" * 64, size=1, content="print(1)\n")
    client.force_login(alice)
    page = client.get("/jobs/new/").content.decode()
    image_select = re.search(r'<select name="image"[^>]*>', page).group(0)
    assert json.loads(attr(image_select, "data-descriptions")) == {str(image.pk): "test image"}
    assert '<small class="hint description" id="id_image-description">test image</small>' in page
    script_select = re.search(r'<select name="script"[^>]*>', page).group(0)
    assert json.loads(attr(script_select, "data-descriptions")) == {str(example.pk): "Every rank says hello."}


def test_the_shipped_examples_have_descriptions():
    from pathlib import Path

    from jobs.web.formhints import script_description

    for path in (Path(__file__).resolve().parent.parent / "jobs" / "examples").glob("*.py"):
        assert script_description(path.read_text()), path.name


def test_the_form_and_the_instances_admin_page_say_where_jobs_on_an_instance_share_its_account(
        client, alice, image, make_user):
    client.force_login(alice)
    assert "share" not in html.unescape(client.get("/jobs/new/").content.decode())   # local jobs are apart
    instance = Instance.objects.create(name="big", host="big.example", user="trainer", gpus=4, healthy=True,
                                       isolation="shared")
    Instance.objects.create(name="small", host="small.example", user="root", gpus=1, healthy=True,
                            isolation="uid+bwrap")
    page = html.unescape(client.get("/jobs/new/").content.decode())
    assert ("GPU instances over SSH: on big, jobs run under the instance's one SSH account (it is neither root "
            "nor allowed sudo -n, or not checked yet), so they can read each other's files and signal each "
            "other's processes there.") in page
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    page = html.unescape(client.get(f"/admin/instances/instance/{instance.pk}/change/").content.decode())
    assert "The account trainer: every job under the one SSH account (neither root nor allowed `sudo -n`)" in page

    # Once its health check finds that the account may run `sudo -n`, each job there gets a uid.
    Instance.objects.filter(pk=instance.pk).update(isolation="uid")
    page = html.unescape(client.get(f"/admin/instances/instance/{instance.pk}/change/").content.decode())
    assert "The account trainer: each job under a uid of its own: a job cannot read another job's files" in page
    client.force_login(alice)
    assert "SSH account" not in html.unescape(client.get("/jobs/new/").content.decode())
