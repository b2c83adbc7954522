"""Rerun (issue 12, item 5): the job form filled in from a job, to edit and submit; the new job
names its parent, and only ever one its owner can see."""
import html
import re

import pytest
from django.contrib.auth.models import Group

from jobs.models import Job, Script

pytestmark = pytest.mark.django_db


def make_job(owner, image, **extra):
    fields = {"gpus": 2, "time_limit_minutes": 7, **extra}
    if "script" not in fields and "script_path" not in fields:
        fields["script"], _ = Script.objects.get_or_create(owner=owner, name="mine.py", sha256="0" * 64, size=1,
                                                           content="print(1)\n")
    return Job.objects.create(owner=owner, image=image, **fields)


def value(page, name):
    """What the form shows in field `name`."""
    tag = re.search(fr'<(input|textarea|select)[^>]*name="{name}"[^>]*>', page)
    assert tag, name
    if tag.group(1) == "input":
        match = re.search(r'value="([^"]*)"', tag.group(0))
        return html.unescape(match.group(1)) if match else None
    rest = page[tag.end():]
    if tag.group(1) == "textarea":
        return html.unescape(rest.split("</textarea>")[0]).strip("\n")
    chosen = re.search(r'<option value="([^"]*)" selected>', rest.split("</select>")[0])
    return chosen.group(1) if chosen else None


def test_rerun_opens_the_form_filled_in_from_the_job(client, alice, image):
    team = Group.objects.create(name="team")
    alice.groups.add(team, Group.objects.create(name="alpha"))
    old = make_job(alice, image, name="again", args=["--lr", "0.1", "two words"], env={"A": "1", "B": "x=y"},
                   gpu_model="", charged_group=team)
    client.force_login(alice)
    response = client.get(f"/jobs/{old.pk}/rerun/")
    page = response.content.decode()
    assert response.status_code == 200 and Job.objects.count() == 1            # nothing submitted yet
    assert 'action="/jobs/new/"' in page
    assert f'Rerun of <a href="/jobs/{old.pk}/">job {old.pk}</a>' in page
    assert (value(page, "name"), value(page, "image"), value(page, "gpus"), value(page, "script"),
            value(page, "args"), value(page, "env"), value(page, "backend"), value(page, "time_limit_minutes"),
            value(page, "group"), value(page, "parent")) == (
        "again", str(image.pk), "2", str(old.script_id), "--lr 0.1 'two words'", "A=1\nB=x=y", "local", "7",
        "team", str(old.pk))


def test_the_edited_rerun_is_a_new_job_whose_parent_is_shown(client, alice, image, api_client,
                                                              django_capture_on_commit_callbacks):
    old = make_job(alice, image, name="first", script_path="train.py")
    client.force_login(alice)
    page = client.get(f"/jobs/{old.pk}/rerun/").content.decode()
    assert value(page, "script_path") == "train.py" and value(page, "script") == ""
    with django_capture_on_commit_callbacks():
        response = client.post("/jobs/new/", {
            "name": "second", "image": image.pk, "gpus": 1, "backend": "local", "script_path": "train.py",
            "args": "--epochs 3", "parent": old.pk})
    new = Job.objects.exclude(pk=old.pk).get()
    assert response["Location"] == f"/jobs/{new.pk}/"
    assert (new.parent, new.name, new.gpus, new.args) == (old, "second", 1, ["--epochs", "3"])
    detail = client.get(f"/jobs/{new.pk}/").content.decode()
    assert f'<dt>Rerun of</dt><dd id="job-parent"><a href="/jobs/{old.pk}/">job {old.pk}</a> (first)</dd>' in detail
    assert 'id="job-parent"' not in client.get(f"/jobs/{old.pk}/").content.decode()

    api = api_client(alice)
    assert api.get(f"/api/jobs/{new.pk}/").json()["parent"] == old.pk
    assert api.get(f"/api/jobs/{old.pk}/").json()["parent"] is None


def test_the_direct_rerun_also_names_its_parent(client, alice, image, django_capture_on_commit_callbacks):
    old = make_job(alice, image)
    client.force_login(alice)
    with django_capture_on_commit_callbacks():
        client.post(f"/jobs/{old.pk}/rerun/")
    assert Job.objects.exclude(pk=old.pk).get().parent == old


@pytest.mark.parametrize("forged", ["other", "999999", "abc", str(2 ** 40), "-3"])
def test_a_forged_parent_is_a_form_error_never_a_link_to_someone_elses_job(client, alice, make_user, image,
                                                                           forged):
    bobs = make_job(make_user("bob"), image, name="bob's secret", script_path="t.py")
    client.force_login(alice)
    parent = str(bobs.pk) if forged == "other" else forged
    response = client.post("/jobs/new/", {"image": image.pk, "gpus": 1, "backend": "local",
                                          "script_path": "train.py", "parent": parent})
    page = response.content.decode()
    assert response.status_code == 200 and Job.objects.count() == 1
    assert re.search(r'<div class="form-errors" id="form-errors">\s*<p class="error" data-field="parent">'
                     r'The job this would rerun is not one of yours \(or no longer exists\)', page)
    assert "bob&#x27;s secret" not in page and "bob's secret" not in page and "Rerun of" not in page
    assert client.get(f"/jobs/{bobs.pk}/rerun/").status_code == 404


def test_a_parent_the_viewer_cannot_see_is_not_shown(client, alice, make_user, image):
    bob = make_user("bob")
    alices = make_job(alice, image, script_path="t.py")
    bobs = make_job(bob, image, script_path="t.py", parent=alices)      # e.g. rerun while bob was staff
    client.force_login(bob)
    assert "Rerun of" not in client.get(f"/jobs/{bobs.pk}/").content.decode()


def test_staff_rerun_another_users_uploaded_script_without_uploading_it(client, alice, make_user, image,
                                                                         django_capture_on_commit_callbacks):
    old = make_job(alice, image)
    root = make_user("root", is_staff=True)
    client.force_login(root)
    page = client.get(f"/jobs/{old.pk}/rerun/").content.decode()
    copy = Script.objects.get(owner=root)
    assert value(page, "script") == str(copy.pk) and copy.content == old.script.content
    with django_capture_on_commit_callbacks():
        client.post(f"/jobs/{old.pk}/rerun/")
    new = Job.objects.exclude(pk=old.pk).get()
    assert (new.owner, new.script, new.parent) == (root, copy, old)


def test_a_rerun_that_no_longer_passes_names_the_field_as_a_person_reads_it(client, alice, image):
    old = make_job(alice, image, script_path="t.py", time_limit_minutes=10 ** 6)
    client.force_login(alice)
    response = client.post(f"/jobs/{old.pk}/rerun/", follow=True)
    page = html.unescape(response.content.decode())
    assert f"Cannot rerun job {old.pk}: Time limit (minutes): At most" in page
    assert "time_limit_minutes:" not in page


def test_a_rerun_of_an_elastic_job_keeps_its_bounds(client, alice, image, django_capture_on_commit_callbacks):
    old = make_job(alice, image, script_path="t.py", gpus=1, max_gpus=3)
    client.force_login(alice)
    page = client.get(f"/jobs/{old.pk}/rerun/").content.decode()
    assert (value(page, "gpus"), value(page, "max_gpus")) == ("1", "3")
    with django_capture_on_commit_callbacks():
        client.post(f"/jobs/{old.pk}/rerun/")
    new = Job.objects.exclude(pk=old.pk).get()
    assert (new.gpus, new.max_gpus, new.parent) == (1, 3, old)
