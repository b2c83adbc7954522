"""manage.py render_trainjob: the TrainJob a torchrun job on a cluster becomes, without the cluster."""
import io
import json

import pytest
from django.core.management import CommandError, call_command

from jobs.backends.kubernetes.models import Cluster
from jobs.models import Image, Job
from runners import trainjob
from tests.conftest import job_name
from tests.test_clusters import kubeconfig
from tests.clusterjobs import on_cluster

pytestmark = pytest.mark.django_db


def run(*args):
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.fixture
def torch_job(make_user):
    cluster = Cluster(name="gpu-east", namespace="training", gpus_per_node=8, training_runtime="torch-distributed")
    cluster.set_kubeconfig(kubeconfig())
    cluster.save()
    image = Image.objects.create(name="torch-gpu", container_image="registry.example/torch:2.13", python="python3")
    return on_cluster(Job.objects.create(owner=make_user("alice"), image=image, gpus=16, script_path="/examples/ddp.py",
                                         args=["--epochs", "3"], backend="kubernetes", launcher="torchrun",
                                         time_limit_minutes=60), cluster)


def test_render_trainjob_prints_two_nodes_of_eight_that_validate(torch_job):
    document = json.loads(run("render_trainjob", str(torch_job.pk)))
    assert document["kind"] == "TrainJob" and document["metadata"]["name"] == job_name(torch_job.pk)
    assert document["metadata"]["namespace"] == "training"
    trainer = document["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 8)
    assert document["spec"]["runtimeRef"]["name"] == "torch-distributed"
    assert trainjob.schema_problems(document) == [] and trainjob.trainer_problems(document) == []


def test_render_trainjob_refuses_horovod_jobs_other_backends_and_unknown_jobs(torch_job, make_user):
    Job.objects.filter(pk=torch_job.pk).update(launcher="horovod")
    with pytest.raises(CommandError, match="render_mpijob"):
        run("render_trainjob", str(torch_job.pk))
    local = Job.objects.create(owner=torch_job.owner, image=torch_job.image, gpus=1, script_path="t.py",
                               backend="local", time_limit_minutes=5, launcher="torchrun")
    with pytest.raises(CommandError, match="local backend"):
        run("render_trainjob", str(local.pk))
    with pytest.raises(CommandError, match="no job 999999"):
        run("render_trainjob", "999999")
