"""Elastic jobs on Kubernetes (#15): the portal scales an MPIJob's Worker replicas between the
job's bounds, and an evicted worker is replaced while the job goes on. The real `kubernetes`
client of a real Celery worker talks HTTP to the fake API server, which plays mpi-operator v2 as
its source does it: worker pods made and deleted to match the replicas (getOrCreateWorker), the
discovery script in the job's ConfigMap rewritten from the Running workers
(updateDiscoverHostsInConfigMap), MPIJobEvicted while the launcher runs on; and horovodrun in
elastic mode, training on what that script lists."""
import re
import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import backends
from jobs.domain import accounting
from jobs.backends.kubernetes.models import Cluster
from jobs.models import Job, JobEvent, State
from tests.conftest import job_name, wait_for
from tests.test_usage_numbers import Tables
from tests.fakekube import Scenario
from tests.integration.test_job_lifecycle import stored_lines, wait_state
from tests.integration.test_kubernetes import NS, cluster, fake, submit  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
ENDED = {State.SUCCEEDED, State.FAILED, State.CANCELLED}
STEP = re.compile(r"step (\d+) size (\d+)")


def steps(job_id):
    """[(step, size)] as rank 0 printed them."""
    return [(int(m[1]), int(m[2])) for line in stored_lines(job_id) if line.rank == 0 and (m := STEP.search(line.text))]


def wait_size(job_id, size, after=0):
    """The first step after step `after` that the job trained at `size` GPUs."""
    return wait_for(lambda: next((step for step, ranks in steps(job_id) if ranks == size and step > after), None),
                    timeout=120, interval=0.2, message=f"job {job_id} to train on {size} GPUs")


def replicas(fake, job_id):
    return fake.mpijob(NS, job_name(job_id))["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]


def resizes(job_id):
    """[(GPUs, why)] of the job's resizes."""
    return [(gpus, message) for gpus, message in JobEvent.objects.filter(job_id=job_id, gpus__isnull=False)
            .order_by("id").values_list("gpus", "message") if message.startswith(("grew", "shrank"))]


def assert_continuous(job_id):
    """Every step from 1 on, each printed by every rank of the size it ran at, none repeated."""
    seen = steps(job_id)
    assert [step for step, _ in seen] == list(range(1, len(seen) + 1))
    for step, size in seen:
        ranks = sorted(line.rank for line in stored_lines(job_id) if line.text == f"step {step} size {size}")
        assert ranks == list(range(size)), (step, size, ranks)


def assert_in_use_everywhere(http, staff, job_id, cluster, gpus):
    """The capacity page (the backend's row and the cluster's), the API (the job's size, its
    owner's quota use) and accounting all count `gpus` GPUs for the grown job."""
    tables = Tables(staff.get("/capacity/").content.decode())
    by_backend = {row[0]: row[1] for row in tables.body("jobs capacity")}
    by_cluster = {row[0]: row[2] for row in tables.body("jobs") if len(row) > 2}
    assert (by_backend[backends.label("kubernetes")], by_cluster[cluster.name]) == (str(gpus), str(gpus))
    assert http.get(f"{http.base}/api/jobs/{job_id}/").json()["size"] == gpus
    assert http.get(f"{http.base}/api/quota/").json()["use"]["gpus"] == gpus
    job = Job.objects.get(pk=job_id)
    later = timezone.now() + timedelta(seconds=1)
    assert accounting.job_gpu_seconds(job, now=later + timedelta(seconds=10)) - accounting.job_gpu_seconds(
        job, now=later) == pytest.approx(10 * gpus)


def test_an_elastic_mpijob_is_scaled_down_for_a_queued_job_and_back_up_when_it_ends(
        http, fake, cluster, client, make_user):
    Cluster.objects.filter(pk=cluster.pk).update(gpus_per_node=2, gpu_limit=4)
    hold = threading.Event()
    fake.scenario = Scenario(hold=hold, step_seconds=0.1)
    elastic = submit(http, gpus=2, max_gpus=4)
    # Admitted at 2 and grown in the same pass to the cluster's 4 free GPUs: two workers of two.
    wait_size(elastic, 4)
    client.force_login(make_user("root", is_staff=True))
    assert_in_use_everywhere(http, client, elastic, cluster, 4)
    launcher = fake.mpijob(NS, job_name(elastic))["spec"]["mpiReplicaSpecs"]["Launcher"]
    command = launcher["template"]["spec"]["containers"][0]["command"]
    assert command[:command.index("python")] == [
        "horovodrun", "-np", "4", "--min-np", "2", "--max-np", "4", "--slots-per-host", "2",
        "--host-discovery-script", "/etc/mpi/discover_hosts.sh", "--blacklist-cooldown-range", "10", "60"]
    assert replicas(fake, elastic) == 2

    fake.scenarios[job_name(elastic + 1)] = Scenario(steps=3)
    fixed = submit(http, gpus=2)
    assert fixed == elastic + 1
    # Once the elastic job has settled, the scheduler shrinks it by a worker and admits the fixed job.
    shrunk = wait_size(elastic, 2)
    assert replicas(fake, elastic) == 1
    assert wait_state(fixed, ENDED).state == State.SUCCEEDED
    wait_size(elastic, 4, after=shrunk)                          # its GPUs freed: a worker back
    assert replicas(fake, elastic) == 2
    hold.set()
    job = wait_state(elastic, ENDED)
    assert job.state == State.SUCCEEDED, job.reason
    assert_continuous(elastic)
    assert resizes(elastic) == [
        (4, "grew to 4 GPUs: 2 GPUs free on cluster fake"),
        (2, f"shrank to 2 GPUs for job {fixed}"), (4, "grew to 4 GPUs: 2 GPUs free on cluster fake")]
    patches = [r for r in fake.requests if r[0] == "patch" and r[2] == "mpijobs"]
    assert len(patches) >= 2


def test_an_evicted_worker_of_an_elastic_mpijob_is_replaced_and_the_job_goes_on(http, fake, cluster):
    Cluster.objects.filter(pk=cluster.pk).update(gpu_limit=3)
    hold = threading.Event()
    # Its replacement takes a second to run, as on a cluster: Horovod trains on 2 GPUs meanwhile
    # (a replacement running at once would leave no step at 2 when the portal deletes the evicted pod fast).
    fake.scenario = Scenario(hold=hold, step_seconds=0.1, evict_worker=1, worker_start_seconds=1.0)
    job_id = submit(http, gpus=2, max_gpus=3)
    first = wait_size(job_id, 3)                                  # three one-GPU workers
    name = job_name(job_id)
    wait_for(lambda: any(f"lost {name}-worker-1 (evicted: The node was low on resource: memory.): continuing on "
                         f"2 GPUs while Kubernetes replaces it" == message for _, message in
                         JobEvent.objects.filter(job_id=job_id).values_list("state", "message")),
             timeout=60, message="the loss of worker 1 to be told")
    during = wait_size(job_id, 2, after=first)                   # Horovod went on without it
    wait_size(job_id, 3, after=during)                           # and took its replacement back in
    pod = fake.pods(NS, f"training.kubeflow.org/job-name={name},training.kubeflow.org/replica-index=1")
    assert [p["status"]["phase"] for p in pod] == ["Running"]    # a new pod, not the evicted one
    hold.set()
    job = wait_state(job_id, ENDED)
    assert job.state == State.SUCCEEDED, job.reason
    assert_continuous(job_id)
    assert Job.objects.get(pk=job_id).size == 3
