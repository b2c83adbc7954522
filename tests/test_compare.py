"""Comparing jobs (GET /api/compare/?jobs=…, the /compare/ page): each metric's curve per job as
the mean of its ranks, its last and best value, exactly the fields that differ, a diff of the
scripts where they differ, duration and GPU-hours; a stranger's job is 404, bad input a 400."""
import io
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import Job, MetricPoint, Script, State

pytestmark = pytest.mark.django_db


def make_job(owner, image, script, args=(), env=None, gpus=2):
    now = timezone.now()
    return Job.objects.create(owner=owner, image=image, script=script, gpus=gpus, args=list(args), env=env or {},
                              time_limit_minutes=60, state=State.SUCCEEDED, started_at=now - timedelta(hours=1),
                              finished_at=now, gpu_seconds=gpus * 3600.0)


def points(job, name, per_rank):
    """per_rank: {rank: [value at step 1, 2, ...]}"""
    now = timezone.now()
    MetricPoint.objects.bulk_create(MetricPoint(job=job, rank=rank, step=step, name=name, value=value, ts=now)
                                    for rank, values in per_rank.items() for step, value in enumerate(values, 1))


@pytest.fixture
def two_jobs(image, make_user):
    alice = make_user("alice")
    first = Script.objects.create(owner=alice, name="train.py", sha256="a" * 64, size=10, content="lr = 0.1\nrun()\n")
    second = Script.objects.create(owner=alice, name="train.py", sha256="b" * 64, size=10, content="lr = 0.2\nrun()\n")
    a = make_job(alice, image, first, args=["--epochs", "3"], env={"SEED": "1", "MODE": "fast"})
    b = make_job(alice, image, second, args=["--epochs", "3"], env={"SEED": "2", "MODE": "fast"}, gpus=4)
    points(a, "loss", {0: [1.0, 0.5, 0.6], 1: [3.0, 1.5, 0.8]})
    points(a, "accuracy", {0: [0.2, 0.4, 0.5]})
    points(b, "loss", {0: [2.0, 1.0]})
    return alice, a, b


def test_the_comparison_gives_mean_curves_last_and_best_and_exactly_what_differs(client, two_jobs):
    alice, a, b = two_jobs
    client.force_login(alice)
    response = client.get(f"/api/compare/?jobs={a.pk},{b.pk}")
    assert response.status_code == 200, response.content
    data = response.json()
    assert [job["id"] for job in data["jobs"]] == [a.pk, b.pk]
    assert data["series"]["loss"] == {str(a.pk): [[1, 2.0], [2, 1.0], [3, 0.7]], str(b.pk): [[1, 2.0], [2, 1.0]]}
    first = data["jobs"][0]
    assert first["metrics"]["loss"] == {"last": pytest.approx(0.7), "best": pytest.approx(0.7), "better": "min"}
    assert first["metrics"]["accuracy"] == {"last": 0.5, "best": 0.5, "better": "max"}
    assert "accuracy" not in data["jobs"][1]["metrics"]
    assert data["differs"] == ["gpus", "env SEED", "script"]
    assert (first["duration_seconds"], first["gpu_hours"]) == (pytest.approx(3600), pytest.approx(2.0))
    assert data["jobs"][1]["gpu_hours"] == pytest.approx(4.0)
    (diff,) = data["script_diffs"]
    assert (diff["from"], diff["to"]) == (a.pk, b.pk)
    assert "-lr = 0.1\n+lr = 0.2\n" in diff["diff"]


def test_a_strangers_job_is_404_and_bad_lists_are_400_naming_jobs(client, two_jobs, image, make_user):
    alice, a, b = two_jobs
    bob = make_user("bob")
    theirs = make_job(bob, image, None)
    client.force_login(alice)
    assert client.get(f"/api/compare/?jobs={a.pk},{theirs.pk}").status_code == 404
    assert client.get(f"/compare/?jobs={a.pk},{theirs.pk}").status_code == 404
    for bad in ("", f"{a.pk}", f"{a.pk},{a.pk}", "1,x", ",".join(str(n) for n in range(1, 12)), "9" * 40):
        response = client.get(f"/api/compare/?jobs={bad}")
        assert response.status_code == 400, (bad, response.content)
        assert list(response.json()) == ["jobs"]
    assert client.get("/compare/?jobs=1").status_code == 400


def test_the_compare_page_marks_the_rows_that_differ_and_shows_the_script_diff(client, two_jobs):
    alice, a, b = two_jobs
    client.force_login(alice)
    page = client.get(f"/compare/?jobs={b.pk},{a.pk}").content.decode()
    assert '<tr class="differs" data-field="gpus">' in page and '<tr class="same" data-field="args">' in page
    assert '<tr class="same" data-field="env MODE">' in page
    assert "Files of job" in page and "+lr = 0.1" in page
    assert 'id="compare-series"' in page


def test_two_projects_compare_file_by_file(client, alice, image, api_client):
    """Which files of two jobs' projects were added, removed or changed, and each one's diff."""
    from tests.test_projects import zip_of

    api = api_client(alice)
    first = {"train.py": "import utils\nprint(utils.lr)\n", "utils.py": "lr = 0.1\n", "old.txt": "x\n"}
    second = {"train.py": "import utils\nprint(utils.lr)\n", "utils.py": "lr = 0.2\n", "data/new.bin": b"\xff\x00"}
    ids = []
    for files in (first, second):
        upload = io.BytesIO(zip_of(files))
        upload.name = "p.zip"
        project = api.post("/api/projects/", {"file": upload}, format="multipart").json()["id"]
        ids.append(api.post("/api/jobs/", {"image": image.name, "gpus": 1, "project": project,
                                           "entry_point": "train.py"}, format="json").json()["id"])
    data = api.get(f"/api/compare/?jobs={ids[0]},{ids[1]}").json()
    assert "script" in data["differs"]
    (diff,) = data["script_diffs"]
    assert diff["files"] == {"added": ["data/new.bin"], "removed": ["old.txt"], "changed": ["utils.py"]}
    assert "-lr = 0.1\n+lr = 0.2\n" in diff["diff"] and "train.py" not in diff["diff"]
    assert f"Binary files /dev/null and job {ids[1]}: data/new.bin differ" in diff["diff"]
    client.force_login(alice)
    page = client.get(f"/compare/?jobs={ids[0]},{ids[1]}").content.decode()
    assert "Files of job" in page and "<code>utils.py</code>" in page
