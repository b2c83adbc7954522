"""Tags and a note per job (issue 44, part 1): given at submit, changed by PATCH /api/jobs/<id>/
and on the job page, filtered by in the API (?tag=) and the job list, kept by rerun and clone;
a stranger's job is 404; bad tags are a 400 naming `tags` that changes nothing. The filter by tag
works on PostgreSQL (through its GIN index) and on the embedded SQLite."""
import json
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.models import Job, Script
from tests.test_embedded_secrets import manage

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(api_client, alice, image):
    return api_client(alice)


def make_job(owner, image, **extra):
    script, _ = Script.objects.get_or_create(owner=owner, name="t.py", sha256="0" * 64, size=1, content="x")
    return Job.objects.create(owner=owner, image=image, gpus=1, script=script, time_limit_minutes=5, **extra)


def submit(api, **extra):
    return api.post("/api/jobs/", {"image": "horovod-cpu", "gpus": 1, "script_path": "train.py", **extra},
                    format="json")


def patch(api, job_id, body):
    return api.patch(f"/api/jobs/{job_id}/", body, format="json")


def listed_ids(api, query):
    response = api.get("/api/jobs/" + query)
    assert response.status_code == 200, response.json()
    return [job["id"] for job in response.json()["results"]]


def test_tags_and_note_given_at_submit_come_back_normalised(api):
    response = submit(api, tags=["  lr   sweep ", "baseline", "lr sweep"], note="Trying a 10x smaller LR.")
    assert response.status_code == 201, response.json()
    job = response.json()
    assert (job["tags"], job["note"]) == (["lr sweep", "baseline"], "Trying a 10x smaller LR.")
    assert api.get(f"/api/jobs/{job['id']}/").json()["tags"] == ["lr sweep", "baseline"]
    plain = submit(api).json()
    assert (plain["tags"], plain["note"]) == ([], "")


def test_patch_changes_tags_and_note_each_on_its_own(api, alice, image):
    job = make_job(alice, image, tags=["old"], note="first try")
    response = patch(api, job.pk, {"tags": ["new", "best"]})
    assert response.status_code == 200, response.json()
    assert (response.json()["tags"], response.json()["note"]) == (["new", "best"], "first try")
    response = patch(api, job.pk, {"note": "  loss diverged at step 900\n"})
    assert (response.json()["tags"], response.json()["note"]) == (["new", "best"], "loss diverged at step 900")
    job.refresh_from_db()
    assert (job.tags, job.note) == (["new", "best"], "loss diverged at step 900")
    assert patch(api, job.pk, {"tags": [], "note": ""}).status_code == 200
    job.refresh_from_db()
    assert (job.tags, job.note) == ([], "")


def test_a_strangers_job_is_404_to_get_and_patch(api, make_user, image):
    bobs = make_job(make_user("bob"), image, tags=["secret"], note="bob's")
    assert api.get(f"/api/jobs/{bobs.pk}/").status_code == 404
    response = patch(api, bobs.pk, {"tags": ["mine"]})
    assert response.status_code == 404 and "secret" not in response.content.decode()
    bobs.refresh_from_db()
    assert (bobs.tags, bobs.note) == (["secret"], "bob's")
    assert listed_ids(api, "?tag=secret") == []


@pytest.mark.parametrize("tags, message", [
    ("baseline", "Must be a list of strings."),
    ([1, 2], "Must be a list of strings."),
    ([["nested"]], "Must be a list of strings."),
    ({"a": "b"}, "Must be a list of strings."),
    (["ok", "   "], "A tag cannot be empty."),
    (["x" * 65], "A tag is at most 64 characters"),
    ([f"t{i}" for i in range(21)], "At most 20 tags per job (21 given)."),
    (["a,b"], "A tag cannot contain a comma"),
])
def test_bad_tags_are_a_400_naming_tags_and_change_nothing(api, alice, image, tags, message):
    job = make_job(alice, image, tags=["kept"], note="kept")
    response = patch(api, job.pk, {"tags": tags, "note": "changed"})
    assert response.status_code == 400
    assert set(response.json()) == {"tags"} and message in response.json()["tags"][0]
    job.refresh_from_db()
    assert (job.tags, job.note) == (["kept"], "kept")
    before = Job.objects.count()
    refused = submit(api, tags=tags)
    assert refused.status_code == 400 and message in refused.json()["tags"][0]
    assert Job.objects.count() == before


def test_exactly_the_limits_are_accepted(api, alice, image):
    job = make_job(alice, image)
    tags = [f"{i:02d}" + "x" * 62 for i in range(20)]
    response = patch(api, job.pk, {"tags": tags, "note": "n" * 10_000})
    assert response.status_code == 200 and response.json()["tags"] == tags


def test_bad_notes_and_other_fields_are_refused_by_name(api, alice, image):
    job = make_job(alice, image, note="kept")
    too_long = patch(api, job.pk, {"note": "n" * 10_001})
    assert too_long.status_code == 400 and set(too_long.json()) == {"note"}
    assert patch(api, job.pk, {"note": 7}).json() == {"note": ["Must be a string."]}
    others = patch(api, job.pk, {"gpus": 8, "name": "renamed", "tags": ["fine"]})
    assert others.status_code == 400
    assert others.json() == {"gpus": ["Only tags and note can be changed."],
                             "name": ["Only tags and note can be changed."]}
    assert patch(api, job.pk, ["not", "an", "object"]).status_code == 400
    job.refresh_from_db()
    assert (job.gpus, job.name, job.tags, job.note) == (1, "", [], "kept")


def test_the_api_filters_by_every_tag_given(api, alice, image):
    a = make_job(alice, image, tags=["resnet", "baseline"])
    b = make_job(alice, image, tags=["resnet", "lr sweep"])
    make_job(alice, image, tags=["bert"])
    make_job(alice, image)
    assert listed_ids(api, "?tag=resnet") == [b.pk, a.pk]
    assert listed_ids(api, "?tag=resnet&tag=baseline") == [a.pk]
    assert listed_ids(api, "?tag=lr%20%20sweep") == [b.pk]                    # whitespace as stored
    assert listed_ids(api, "?tag=resnet&tag=bert") == []
    assert listed_ids(api, "?tag=Resnet") == []                               # tags are case-sensitive
    assert listed_ids(api, "?tag=resnet&state=QUEUED") == [b.pk, a.pk]
    bad = api.get("/api/jobs/?tag=" + "x" * 65)
    assert bad.status_code == 400 and set(bad.json()) == {"tag"}
    assert api.get("/api/jobs/?tag=%00").status_code == 400


def test_the_filter_by_tag_uses_containment_on_postgresql(api, alice, image):
    make_job(alice, image, tags=["a"])
    with CaptureQueriesContext(connection) as queries:
        listed_ids(api, "?tag=a")
    assert any("@>" in query["sql"] for query in queries)
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'job_tags_gin'")
        assert "gin (tags jsonb_path_ops)" in cursor.fetchone()[0]


def test_the_job_list_shows_tags_and_filters_by_them(client, alice, image):
    a = make_job(alice, image, name="first", tags=["resnet", "baseline"])
    b = make_job(alice, image, name="second", tags=["resnet"])
    client.force_login(alice)

    def rows(query=""):
        page = client.get("/" + query).content.decode()
        return [int(pk) for pk in re.findall(r'<tr data-job-id="(\d+)"', page)], page

    ids, page = rows()
    assert ids == [b.pk, a.pk]
    row = page[page.index(f'data-job-id="{a.pk}"'):]
    row = row[:row.index("</tr>")]
    assert '<a class="tag" href="?tag=baseline"' in row and '<a class="tag" href="?tag=resnet"' in row
    assert rows("?tag=resnet")[0] == [b.pk, a.pk]
    ids, page = rows("?tag=resnet&tag=baseline")
    assert ids == [a.pk]
    assert '<input type="hidden" name="tag" value="resnet">' in page           # kept by the filter form
    assert 'href="?tag=resnet" title="Stop filtering by baseline"' in page
    assert rows("?tag=resnet&tag=&sort=oldest")[0] == [a.pk, b.pk]            # an empty tag box is no filter
    ids, page = rows("?tag=" + "x" * 65)
    assert ids == [b.pk, a.pk] and 'id="filter-errors"' in page               # refused: named, left out
    _, page = rows("?tag=resnet&state=QUEUED")
    assert 'href="?state=QUEUED&amp;tag=resnet&amp;tag=baseline"' in page      # a row's tag adds to the filters


def test_the_job_page_edits_tags_and_note(client, alice, make_user, image):
    job = make_job(alice, image, tags=["old"])
    client.force_login(alice)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="notes-form"' in page and 'name="csrfmiddlewaretoken"' in page and 'value="old"' in page
    response = client.post(f"/jobs/{job.pk}/notes/", {"tags": "resnet,  lr  sweep ,resnet,", "note": "why <b>"})
    assert response.status_code == 302
    job.refresh_from_db()
    assert (job.tags, job.note) == (["resnet", "lr sweep"], "why <b>")
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert '<a class="tag" href="/?tag=lr%20sweep">lr sweep</a>' in page and "why &lt;b&gt;" in page
    refused = client.post(f"/jobs/{job.pk}/notes/", {"tags": "x" * 65, "note": "typed"})
    assert refused.status_code == 400
    body = refused.content.decode()
    assert 'data-field="tags"' in body and "typed</textarea>" in body            # shown again, not lost
    job.refresh_from_db()
    assert (job.tags, job.note) == (["resnet", "lr sweep"], "why <b>")
    bobs = make_job(make_user("bob"), image, tags=["theirs"])
    assert client.post(f"/jobs/{bobs.pk}/notes/", {"tags": "mine", "note": ""}).status_code == 404
    bobs.refresh_from_db()
    assert bobs.tags == ["theirs"]


def test_rerun_keeps_the_tags_and_the_clone_form_shows_them(client, alice, image):
    old = make_job(alice, image, tags=["resnet", "lr sweep"], note="why the first ran")
    client.force_login(alice)
    client.post(f"/jobs/{old.pk}/rerun/")
    new = Job.objects.exclude(pk=old.pk).get()
    assert (new.parent_id, new.tags, new.note) == (old.pk, ["resnet", "lr sweep"], "")
    form = client.get(f"/jobs/{old.pk}/rerun/").content.decode()
    assert re.search(r'<input type="text" name="tags" value="resnet, lr sweep"', form)
    assert re.search(r'<textarea name="note"[^>]*>\s*</textarea>', form)       # a new run's note is its own
    response = client.post("/jobs/new/", {"image": image.pk, "gpus": 1, "backend": "local", "script_path": "t.py",
                                          "tags": "resnet, lr sweep, smaller", "note": "LR / 10",
                                          "parent": old.pk, "time_limit_minutes": 5})
    assert response.status_code == 302
    clone = Job.objects.order_by("-pk").first()
    assert (clone.parent_id, clone.tags, clone.note) == (old.pk, ["resnet", "lr sweep", "smaller"], "LR / 10")


def test_the_openapi_schema_lists_tags_and_note(api):
    schema = api.get("/api/schema/?format=json").json()
    components = schema["components"]["schemas"]
    for name in ("Job", "JobDetail", "JobCreateRequest", "PatchedJobUpdateRequest"):
        assert {"tags", "note"} <= set(components[name]["properties"]), name
    assert components["PatchedJobUpdateRequest"]["properties"]["tags"]["maxItems"] == 20
    job = schema["paths"]["/api/jobs/{job_id}/"]
    assert set(job["patch"]["responses"]) >= {"200", "400", "404"}
    assert "tag" in [parameter["name"] for parameter in schema["paths"]["/api/jobs/"]["get"]["parameters"]]


SQLITE_FILTER = """
from django.contrib.auth.models import User
from jobs.models import Image, Job
owner = User.objects.create(username="ann")
image = Image.objects.create(name="i")
made = [Job.objects.create(owner=owner, image=image, gpus=1, time_limit_minutes=1, script_path="t.py", tags=tags)
        for tags in (["a", "b"], ["a"], ["b c"], [])]
import json
print(json.dumps([[made.index(job) for job in Job.objects.filter(tags__has_tags=wanted).order_by("pk")]
                  for wanted in (["a"], ["a", "b"], ["b c"], ["b"], ["zzz"], [])]))
"""


def test_the_filter_by_tag_on_the_embedded_sqlite(tmp_path):
    assert manage(tmp_path, "migrate", "-v0").returncode == 0
    result = manage(tmp_path, code=SQLITE_FILTER)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == [[0, 1], [0], [2], [0], [], [0, 1, 2, 3]]
