"""The REST API's contract: validation with the field named, ownership (404), shapes."""
import io

import pytest

from jobs.models import Job, JobEvent, LogLine, Script, State

pytestmark = pytest.mark.django_db


@pytest.fixture
def client(api_client, alice):
    return api_client(alice)


def post_job(client, **data):
    return client.post("/api/jobs/", data, format="json")


def test_anonymous_is_refused(db):
    from rest_framework.test import APIClient

    response = APIClient().get("/api/jobs/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"


def test_images_lists_enabled_images_only(client, image):
    from jobs.models import Image

    Image.objects.create(name="retired", enabled=False)
    assert [i["name"] for i in client.get("/api/images/").json()] == ["horovod-cpu"]


def test_upload_script_is_kept_once_by_content(client):
    body = b"import horovod\nprint('hi')\n"
    first = client.post("/api/scripts/", {"file": io.BytesIO(body)}, format="multipart")
    assert first.status_code == 400 and "file" in first.json()            # no file name: not a .py
    upload = lambda: client.post("/api/scripts/", {"file": _named(body, "train.py")}, format="multipart")
    one, two = upload(), upload()
    assert one.status_code == two.status_code == 201
    assert one.json() == two.json()
    assert set(one.json()) == {"id", "name", "sha256", "size"}
    assert one.json()["size"] == len(body) and one.json()["name"] == "train.py"
    assert Script.objects.count() == 1


def _named(content, name):
    handle = io.BytesIO(content)
    handle.name = name
    return handle


@pytest.mark.parametrize("name, content, message", [
    ("notes.txt", b"print(1)", "must be a .py file"),
    ("big.py", b"#" * (1024 * 1024 + 1), "larger than 1024 KiB"),
    ("latin.py", "print('caf\xe9')".encode("latin-1"), "not valid UTF-8"),
    ("nul.py", b"print(1)\x00", "NUL"),
])
def test_bad_script_uploads_are_400_naming_the_file_field(client, name, content, message):
    response = client.post("/api/scripts/", {"file": _named(content, name)}, format="multipart")
    assert response.status_code == 400
    assert message in " ".join(response.json()["file"])
    assert Script.objects.count() == 0


def test_submit_creates_a_queued_job_and_asks_the_scheduler(client, image, script, alice,
                                                           django_capture_on_commit_callbacks):
    # (Tests run inside a transaction that is rolled back: on-commit tasks are never sent.)
    with django_capture_on_commit_callbacks() as on_commit:
        response = post_job(client, image="horovod-cpu", gpus=2, script=script.pk,
                            args=["--epochs", "3", "; rm -rf /"], env={"LR": "0.1"}, name="first")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["state"] == "QUEUED" and body["queue_position"] == 1 and body["owner"] == "alice"
    job = Job.objects.get(pk=body["id"])
    assert (job.gpus, job.args, job.env, job.backend) == (2, ["--epochs", "3", "; rm -rf /"], {"LR": "0.1"}, "local")
    assert JobEvent.objects.filter(job=job, state=State.QUEUED).exists()
    assert len(on_commit) == 1                                  # dispatch, once the job is committed


def test_image_may_be_given_by_id_and_script_by_path(client, image):
    response = post_job(client, image=image.pk, gpus=1, script_path="/opt/train.py")
    assert response.status_code == 201, response.json()
    assert Job.objects.get().script_path == "/opt/train.py"


@pytest.mark.parametrize("change, field, message", [
    ({"gpus": 0}, "gpus", "greater than or equal to 1"),
    ({"gpus": 9}, "gpus", "This machine runs at most 8 processes per job."),     # its CPU slots
    ({"gpus": 2 ** 31}, "gpus", "less than or equal to 2147483647"),
    ({"gpus": "two"}, "gpus", "whole number"),
    ({"gpus": 1.5}, "gpus", "whole number"),
    ({"gpus": None}, "gpus", "required"),
    ({"image": "nope"}, "image", "No enabled image 'nope'"),
    ({"image": "retired"}, "image", "No enabled image"),
    ({"script": 999999}, "script", "No script with id 999999"),
    ({"script": None}, "script", "Choose a script"),
    ({"script_path": "/x.py"}, "script", "Give only one of"),
    ({"args": "--epochs 3"}, "args", "list of strings"),
    ({"args": ["ok", 3]}, "args", "list of strings"),
    ({"args": ["a\x00b"]}, "args", "NUL"),
    ({"env": ["A=1"]}, "env", "object mapping names"),
    ({"env": {"1BAD": "x"}}, "env", "not a valid variable name"),
    ({"env": {"A-B": "x"}}, "env", "not a valid variable name"),
    ({"env": {"A": 1}}, "env", "must be a string"),
    ({"env": {"A": "x\x00"}}, "env", "NUL"),
    ({"env": {"RINGMASTER_JOB_ID": "7"}}, "env", "reserved"),
    ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, "env", "LD_PRELOAD is refused"),
    ({"env": {"PATH": "/x", "BASH_ENV": "/tmp/rc"}}, "env", "BASH_ENV is refused"),
    ({"backend": "slurm"}, "backend", "not one of the available choices"),
    ({"backend": "kubernetes"}, "backend", "No Kubernetes cluster is registered (or enabled): an admin adds one"),
    ({"backend": "local", "cluster": "nowhere"}, "cluster", "The local backend takes no cluster"),
    ({"time_limit_minutes": 0}, "time_limit_minutes", "greater than or equal to 1"),
])
def test_bad_job_input_is_400_naming_the_field(client, image, script, change, field, message):
    from jobs.models import Image

    Image.objects.create(name="retired", enabled=False)
    data = {"image": "horovod-cpu", "gpus": 2, "script": script.pk, **change}
    response = post_job(client, **{k: v for k, v in data.items()})
    assert response.status_code == 400
    assert message in " ".join(response.json()[field]), response.json()
    assert Job.objects.count() == 0


def test_non_object_body_is_400_not_500(client):
    response = client.post("/api/jobs/", [1, 2], format="json")
    assert response.status_code == 400
    assert "non_field_errors" in response.json()


def test_another_users_script_cannot_be_used(client, image, make_user):
    bob_script = Script.objects.create(owner=make_user("bob"), name="b.py", sha256="1" * 64, size=1, content="x")
    response = post_job(client, image="horovod-cpu", gpus=1, script=bob_script.pk)
    assert response.status_code == 400 and "script" in response.json()


def test_another_users_job_is_404_everywhere(api_client, make_user, image, script, alice):
    job = Job.objects.create(owner=alice, image=image, gpus=1, script=script, time_limit_minutes=5)
    bob = api_client(make_user("bob"))
    for url in (f"/api/jobs/{job.pk}/", f"/api/jobs/{job.pk}/logs/", f"/api/jobs/{job.pk}/metrics/"):
        assert bob.get(url).status_code == 404
    assert bob.post(f"/api/jobs/{job.pk}/cancel/").status_code == 404
    assert bob.get("/api/jobs/").json()["results"] == []
    assert Job.objects.get(pk=job.pk).state == State.QUEUED

    staff = api_client(make_user("carol", is_staff=True))
    assert staff.get(f"/api/jobs/{job.pk}/").status_code == 200


def test_logs_page_by_seq_and_filter_by_rank(client, image, script, alice):
    from django.utils import timezone

    job = Job.objects.create(owner=alice, image=image, gpus=2, script=script, time_limit_minutes=5)
    ranks = [0, 1, None, 1, 0]
    LogLine.objects.bulk_create(LogLine(job=job, seq=i, rank=r, stream="stdout", ts=timezone.now(), text=f"l{i}")
                                for i, r in enumerate(ranks))
    page = client.get(f"/api/jobs/{job.pk}/logs/?limit=2").json()
    assert [l["seq"] for l in page["lines"]] == [0, 1] and page["next"] == 1
    page = client.get(f"/api/jobs/{job.pk}/logs/?since={page['next']}").json()
    assert [l["seq"] for l in page["lines"]] == [2, 3, 4] and page["next"] == 4
    assert client.get(f"/api/jobs/{job.pk}/logs/?since=4").json() == {"lines": [], "next": 4, "prev": 5}
    assert [l["text"] for l in client.get(f"/api/jobs/{job.pk}/logs/?rank=1").json()["lines"]] == ["l1", "l3"]
    launcher = client.get(f"/api/jobs/{job.pk}/logs/?rank=launcher").json()["lines"]
    assert [(l["rank"], l["text"]) for l in launcher] == [("launcher", "l2")]
    bad = client.get(f"/api/jobs/{job.pk}/logs/?rank=x&limit=0&since=y&before=z")
    assert bad.status_code == 400 and set(bad.json()) == {"rank", "limit", "since", "before"}


def test_logs_read_backwards_from_before_for_the_tail_and_older_pages(client, image, script, alice):
    """A log viewer opens at the tail and pages upwards; search narrows both ways."""
    from django.utils import timezone

    job = Job.objects.create(owner=alice, image=image, gpus=2, script=script, time_limit_minutes=5)
    LogLine.objects.bulk_create(LogLine(job=job, seq=i, rank=i % 2, stream="stdout", ts=timezone.now(),
                                        text=f"{'Epoch' if i % 3 == 0 else 'batch'} {i}") for i in range(10))
    tail = client.get(f"/api/jobs/{job.pk}/logs/?before=10&limit=3").json()
    assert [l["seq"] for l in tail["lines"]] == [7, 8, 9] and (tail["prev"], tail["next"]) == (7, 9)
    older = client.get(f"/api/jobs/{job.pk}/logs/?before={tail['prev']}&limit=3").json()
    assert [l["seq"] for l in older["lines"]] == [4, 5, 6]
    first = client.get(f"/api/jobs/{job.pk}/logs/?before=2&limit=3").json()
    assert [l["seq"] for l in first["lines"]] == [0, 1]                      # fewer than asked: the top
    assert client.get(f"/api/jobs/{job.pk}/logs/?before=0").json()["lines"] == []
    found = client.get(f"/api/jobs/{job.pk}/logs/?q=epoch&before=10&limit=2").json()
    assert [l["text"] for l in found["lines"]] == ["Epoch 6", "Epoch 9"]     # case-insensitive, newest two
    found = client.get(f"/api/jobs/{job.pk}/logs/?q=EPOCH&rank=0&before=10").json()
    assert [l["seq"] for l in found["lines"]] == [0, 6]
    between = client.get(f"/api/jobs/{job.pk}/logs/?since=2&before=6").json()
    assert [l["seq"] for l in between["lines"]] == [3, 4, 5]


def test_metric_points_carry_the_seq_of_their_line(client, image, script, alice):
    """A live viewer merges the API's points with the websocket's by seq, without doubles."""
    from jobs.domain.logstore import append_output
    from runners.output import Line

    job = Job.objects.create(owner=alice, image=image, gpus=1, script=script, time_limit_minutes=5)
    lines = [Line(rank=0, stream="stdout", text="warming up", ts=None),
             Line(rank=0, stream="stdout", text='RINGMASTER_METRIC {"step": 3, "loss": 0.5}', ts=None)]
    assert append_output(job.pk, lines, 0, 1, {})
    series = client.get(f"/api/jobs/{job.pk}/metrics/").json()["series"]
    assert [(p["rank"], p["step"], p["value"], p["seq"]) for p in series["loss"]] == [(0, 3, 0.5, 1)]


def test_cancel_of_a_queued_job_is_immediate_and_a_finished_one_is_409(client, image, script, alice):
    job = Job.objects.create(owner=alice, image=image, gpus=1, script=script, time_limit_minutes=5)
    response = client.post(f"/api/jobs/{job.pk}/cancel/")
    assert response.status_code == 202 and response.json()["state"] == "CANCELLED"
    again = client.post(f"/api/jobs/{job.pk}/cancel/")
    assert again.status_code == 409 and "already ended" in again.json()["detail"]


def test_openapi_schema_describes_the_job_endpoints(client):
    response = client.get("/api/schema/?format=json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in ("/api/images/", "/api/scripts/", "/api/jobs/", "/api/jobs/{job_id}/",
                 "/api/jobs/{job_id}/cancel/", "/api/jobs/{job_id}/logs/", "/api/jobs/{job_id}/metrics/"):
        assert path in paths
    assert "gpus" in response.json()["components"]["schemas"]["JobCreateRequest"]["properties"]


def test_an_image_that_cannot_run_on_the_backend_is_refused_naming_where_it_runs(client, image, script, alice):
    from jobs.models import Image

    Image.objects.create(name="horovod-0.28.1", container_image="horovod/horovod:0.28.1", python="python")
    client.force_login(alice)
    response = post_job(client, image="horovod-0.28.1", gpus=2, script=script.pk, backend="local")
    assert response.status_code == 400
    assert response.json() == {"image": [
        "Image horovod-0.28.1 is a container image (horovod/horovod:0.28.1) for Kubernetes clusters; "
        "this machine needs an image with an interpreter: horovod-cpu."]}


def test_the_job_form_opens_on_an_image_that_runs_on_its_backend(client, image, alice):
    from jobs.models import Image

    first_by_name = Image.objects.create(name="a-container", container_image="horovod/horovod:0.28.1")
    client.force_login(alice)
    form = client.get("/jobs/new/").context["form"]
    assert form.fields["backend"].initial == "local"
    assert form.fields["image"].initial == image.pk != first_by_name.pk
    assert f'<option value="{image.pk}" selected>' in client.get("/jobs/new/").content.decode()


def test_a_site_wide_cap_on_the_gpus_of_a_job_holds_when_set(client, image, settings):
    settings.RINGMASTER_MAX_GPUS_PER_JOB = 2
    response = post_job(client, image=image.pk, gpus=3, script_path="/opt/train.py")
    assert response.status_code == 400
    assert response.json() == {"gpus": ["At most 2 GPUs per job on this portal (RINGMASTER_MAX_GPUS_PER_JOB)."]}


def test_the_api_is_documented_in_a_browser_from_vendored_files(client):
    import yaml

    docs = client.get("/api/docs/")
    assert docs.status_code == 200 and b"swagger-ui" in docs.content
    assert b"cdn.jsdelivr" not in docs.content and b"unpkg" not in docs.content      # no CDN
    assert b"/static/drf_spectacular_sidecar/swagger-ui-dist/" in docs.content
    schema = yaml.safe_load(client.get("/api/schema/").content)
    jobs = schema["paths"]["/api/jobs/"]
    assert jobs["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/JobPage")
    for path in ("/api/jobs/{job_id}/logs/", "/api/jobs/{job_id}/metrics/"):
        assert "schema" in schema["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]
        assert {"400", "404"} & set(schema["paths"][path]["get"]["responses"])
    assert schema["components"]["schemas"]["JobCreateRequest"]["properties"]["image"]["minLength"] == 1
