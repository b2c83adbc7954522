"""The Kubernetes backend against a real cluster with mpi-operator v0.8 and GPU nodes. Skipped
unless a kubeconfig is given:

    RINGMASTER_TEST_KUBECONFIG=~/.kube/config            (required)
    RINGMASTER_TEST_NAMESPACE=ringmaster-test            (default: the kubeconfig context's, else default)
    RINGMASTER_TEST_IMAGE=registry/horovod-train:0.28.1  (default: horovod/horovod:0.28.1; needs sshd + Open MPI)
    RINGMASTER_TEST_GPUS_PER_NODE=1                       (default 1; the job asks for 2 GPUs)
    make test PYTEST_ARGS="tests/integration/test_kubernetes_real.py"

A 2-GPU job (two workers) runs a script that allreduces over Horovod and prints from every rank;
the test waits for SUCCEEDED and checks both ranks' lines were stored, then that cancel removes
a second job's MPIJob from the cluster.
"""
import os
from pathlib import Path

import pytest
from django.core.management import call_command

from jobs.backends.kubernetes.models import Cluster
from jobs.models import Image, Job, State
from tests.conftest import wait_for
from tests.integration.test_job_lifecycle import stored_lines, upload, wait_state

KUBECONFIG = os.environ.get("RINGMASTER_TEST_KUBECONFIG", "")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not KUBECONFIG, reason="no real cluster: set RINGMASTER_TEST_KUBECONFIG to run"),
]
ENDED = {State.SUCCEEDED, State.FAILED, State.CANCELLED}
SCRIPT = b"""\
import horovod.torch as hvd
import torch

hvd.init()
total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item()
print(f"rank {hvd.rank()} of {hvd.size()} sees {total:g}", flush=True)
"""


@pytest.fixture
def real_cluster(db):
    import yaml

    path = Path(KUBECONFIG).expanduser()
    config = yaml.safe_load(path.read_text())
    context = next(c for c in config["contexts"] if c["name"] == config.get("current-context"))
    namespace = os.environ.get("RINGMASTER_TEST_NAMESPACE") or context["context"].get("namespace") or "default"
    call_command("add_cluster", "--name", "real", "--kubeconfig", str(path), "--namespace", namespace,
                 "--gpus-per-node", os.environ.get("RINGMASTER_TEST_GPUS_PER_NODE", "1"))
    Image.objects.create(name="horovod-k8s", python="python",
                         container_image=os.environ.get("RINGMASTER_TEST_IMAGE", "horovod/horovod:0.28.1"))
    return Cluster.objects.get(name="real")


def submit(http, **fields):
    response = http.post(f"{http.base}/api/jobs/", json={"image": "horovod-k8s", "gpus": 2, "backend": "kubernetes",
                                                        "cluster": "real", **fields})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def test_a_two_gpu_job_runs_on_the_cluster_and_cancel_removes_its_mpijob(http, real_cluster):
    from jobs.backends import job_spec
    from jobs.backends.kubernetes.clusters import runner_for

    job_id = submit(http, script=upload(http, SCRIPT, "allreduce.py"))
    job = wait_state(job_id, ENDED, timeout=1200)
    assert job.state == State.SUCCEEDED, job.reason
    texts = {(line.rank, line.text) for line in stored_lines(job_id)}
    assert {(0, "rank 0 of 2 sees 2"), (1, "rank 1 of 2 sees 2")} <= texts

    second = submit(http, script=upload(http, SCRIPT.replace(b"hvd.init()", b"import time; time.sleep(3600)"),
                                        "sleeper.py"))
    wait_for(lambda: Job.objects.get(pk=second).state in (State.LAUNCHING, State.RUNNING), timeout=300,
             message="the second job to launch")
    assert http.post(f"{http.base}/api/jobs/{second}/cancel/").status_code == 202
    assert wait_state(second, ENDED, timeout=300).state == State.CANCELLED
    job = Job.objects.select_related("image", "script", "charged_group").get(pk=second)
    assert runner_for(job)._get_mpijob(job_spec(job)) is None
