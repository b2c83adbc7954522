"""A job's launcher (horovod or torchrun), as the API, the form and rerun take it: one the
image carries, the image's own where none is given (Horovod first), and one its backend and
its size can run; every refusal a 400 that names the field."""
import json
import sys

import pytest

from jobs.backends.kubernetes.models import Cluster
from jobs.models import Image, Job
from tests.test_clusters import kubeconfig

pytestmark = pytest.mark.django_db
BODY = {"gpus": 2, "script_path": "/train.py"}


@pytest.fixture
def alice_client(client, make_user):
    client.force_login(make_user("alice"))
    return client


@pytest.fixture
def images(db):
    return {name: Image.objects.create(name=name, python=sys.executable, launchers=carried)
            for name, carried in (("horovod-only", "horovod"), ("torch-only", "torchrun"),
                                  ("both", "horovod, torchrun"))}


def post(client, **fields):
    return client.post("/api/jobs/", data=json.dumps({**BODY, **fields}), content_type="application/json")


@pytest.mark.parametrize(("image", "given", "launcher"), [
    ("horovod-only", None, "horovod"), ("torch-only", None, "torchrun"), ("both", None, "horovod"),
    ("both", "torchrun", "torchrun"), ("torch-only", "torchrun", "torchrun")])
def test_a_job_runs_the_launcher_asked_for_or_else_its_images(alice_client, images, image, given, launcher):
    response = post(alice_client, image=image, **({"launcher": given} if given else {}))
    assert response.status_code == 201, response.content
    assert response.json()["launcher"] == launcher == Job.objects.get().launcher


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"image": "horovod-only", "launcher": "torchrun"}, "launcher", "carries horovod, not torchrun"),
    ({"image": "both", "launcher": "mpirun"}, "launcher", "not one of the available choices"),
    ({"image": "torch-only", "backend": "fake"}, "launcher", "Fake (tests) cannot start PyTorch (torchrun) jobs yet"),
])
def test_a_launcher_the_job_cannot_have_is_a_400_naming_the_field(alice_client, images, settings, fields, field, words):
    settings.RINGMASTER_BACKENDS = [*settings.RINGMASTER_BACKENDS, "tests.fakebackend.FakeBackend"]
    response = post(alice_client, **fields)
    assert response.status_code == 400, response.content
    assert words in " ".join(response.json()[field]), response.json()
    assert not Job.objects.exists()


def test_an_elastic_torchrun_job_runs_here_but_not_as_a_trainjob(alice_client, images):
    cluster = Cluster(name="gpu-east", namespace="training", gpus_per_node=8)
    cluster.set_kubeconfig(kubeconfig())
    cluster.save()
    here = post(alice_client, image="torch-only", max_gpus=4)
    assert here.status_code == 201, here.content
    assert (here.json()["launcher"], here.json()["max_gpus"]) == ("torchrun", 4)
    Image.objects.filter(name="torch-only").update(container_image="registry.example/torch:2.13")
    response = post(alice_client, image="torch-only", max_gpus=4, backend="kubernetes")
    assert response.status_code == 400, response.content
    assert "A TrainJob runs at one size" in " ".join(response.json()["max_gpus"]), response.json()
    assert Job.objects.count() == 1


def test_rerun_and_clone_keep_the_launcher(alice_client, images):
    job_id = post(alice_client, image="both", launcher="torchrun").json()["id"]
    assert alice_client.post(f"/jobs/{job_id}/rerun/").status_code == 302
    assert Job.objects.get(parent_id=job_id).launcher == "torchrun"
    page = alice_client.get(f"/jobs/{job_id}/rerun/").content.decode()        # clone: the form, filled in
    assert '<option value="torchrun" selected>' in page


def test_the_api_documents_the_launcher_and_each_images_launchers(alice_client, images):
    schema = alice_client.get("/api/schema/?format=json").json()
    launcher = schema["components"]["schemas"]["JobCreateRequest"]["properties"]["launcher"]
    ref = launcher.get("$ref") or next(part["$ref"] for part in launcher["allOf"] if "$ref" in part)
    assert set(schema["components"]["schemas"][ref.rsplit("/", 1)[1]]["enum"]) == {"horovod", "torchrun"}
    listed = {image["name"]: image["launchers"] for image in alice_client.get("/api/images/").json()}
    assert listed["both"] == ["horovod", "torchrun"] and listed["torch-only"] == ["torchrun"]


def test_the_admin_refuses_an_image_with_an_unknown_launcher(client, make_user):
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    response = client.post("/admin/jobs/image/add/", {"name": "x", "python": "python", "launchers": "horovod, mpi",
                                                      "enabled": "on"})
    assert response.status_code == 200 and "not &#x27;mpi&#x27;" in response.content.decode()
    assert not Image.objects.filter(name="x").exists()
