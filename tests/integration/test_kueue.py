"""Kueue's decisions, shown and followed, end to end: jobs submitted over HTTP, run by the real
Celery worker whose real `kubernetes` client talks to the fake API server playing Kueue
(tests/fakekube/kueue.py) in front of the MPI operator and Trainer: admission by a ClusterQueue's
GPU quota, Kueue's reason and position while a job waits, preemption and requeue, LocalQueues
per team, and a queue name refused where Kueue is absent."""
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command

from jobs.backends.kubernetes.models import Cluster, QueueMapping
from jobs.models import Image, Job, JobEvent, State
from jobs.tasks import check_backend
from tests.conftest import ROOT, job_name, wait_for
from tests.fakekube import FakeKube, Scenario
from tests.integration.test_job_lifecycle import wait_state

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
ENDED = {State.SUCCEEDED, State.FAILED, State.CANCELLED}
NS = "team-a"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


@pytest.fixture(scope="module")
def fake():
    with FakeKube() as server:
        server.enable_kueue(gpus=16, queues=[(NS, "team-queue"), (NS, "vision-queue"), (NS, "alice-queue")],
                            priorities={"urgent": 1000})
        yield server
        assert server.errors == []


@pytest.fixture
def cluster(fake, db):
    fake.scenario = Scenario()
    fake.scenarios.clear()
    fake.faults.__init__()
    item = Cluster(name="fake", namespace=NS, gpus_per_node=8, kueue_queue="team-queue", image_pull_grace_seconds=30)
    item.set_kubeconfig(fake.kubeconfig_text(namespace=NS))
    item.save()
    Image.objects.create(name="horovod-k8s", container_image="registry.example/horovod:0.28.1", python="python")
    yield item
    wait_for(lambda: not [j for j in fake.mpijobs(NS) + fake.trainjobs(NS)
                          if not _finished(j)], timeout=60, message="the test's jobs to end in the fake")


def _finished(job):
    return any(c["type"] in ("Succeeded", "Failed", "Complete") and c["status"] == "True"
               for c in job.get("status", {}).get("conditions", []))


def submit(http, **fields):
    body = {"image": "horovod-k8s", "gpus": 8, "backend": "kubernetes", "script_path": "/examples/train.py", **fields}
    response = http.post(f"{http.base}/api/jobs/", json=body)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def submit_held(http, fake, **fields):
    """Submit a job whose launcher waits on its own event after its first line; returns (id,
    event). The fake's operator takes its Scenario when the MPIJob is created, so the next job
    is submitted only once this one's MPIJob exists."""
    hold = threading.Event()
    fake.scenario = Scenario(hold=hold)
    job_id = submit(http, **fields)
    fake.wait_for(lambda: fake.mpijob(NS, job_name(job_id)), 60, f"the MPIJob of job {job_id}")
    return job_id, hold


def job_when(job_id, test, message, timeout=60):
    """The job once `test(job)` holds (waiting up to `timeout` seconds)."""
    def found():
        job = Job.objects.get(pk=job_id)
        return job if test(job) else None
    return wait_for(found, timeout=timeout, message=message)


def shown_by_api(http, job_id, reason_start):
    """The job as the API shows it, once its reason starts with `reason_start` (else None)."""
    response = http.get(f"{http.base}/api/jobs/{job_id}/")
    assert response.status_code == 200
    job = response.json()
    return job if job["reason"].startswith(reason_start) else None


def test_two_8_gpu_jobs_run_and_a_third_waits_with_kueues_reason_and_position_then_starts(http, fake, cluster):
    holds = []
    try:
        first, hold = submit_held(http, fake)
        holds.append(hold)
        second, hold = submit_held(http, fake)
        holds.append(hold)
        third, hold = submit_held(http, fake)
        holds.append(hold)
        for job_id in (first, second):
            assert wait_state(job_id, {State.RUNNING} | ENDED, timeout=60).state == State.RUNNING
        shown = wait_for(lambda: shown_by_api(http, third, "waiting in Kueue"), timeout=30,
                         message="the API to show the third job's Kueue reason")
        assert shown["state"] == State.LAUNCHING
        assert shown["reason"] == ("waiting in Kueue: ClusterQueue cluster-queue has 0 nvidia.com/gpu free in flavor "
                                   "default-flavor, the job asks for 8; position 1 in ClusterQueue cluster-queue")
        assert fake.mpijob(NS, job_name(third))["spec"]["runPolicy"]["suspend"] is True
        assert Job.objects.get(pk=third).started_at is None
        holds[0].set()
        assert wait_state(first, ENDED, timeout=60).state == State.SUCCEEDED
        assert wait_state(third, {State.RUNNING} | ENDED, timeout=60).state == State.RUNNING
    finally:
        for hold in holds:
            hold.set()
    for job_id in (first, second, third):
        job = wait_state(job_id, ENDED, timeout=60)
        assert job.state == State.SUCCEEDED, job.reason
    messages = list(JobEvent.objects.filter(job_id=third).values_list("message", flat=True))
    assert any(m.startswith("waiting in Kueue: ClusterQueue cluster-queue has 0") for m in messages), messages


def test_a_higher_priority_job_preempts_a_running_one_which_resumes_by_itself_and_succeeds(http, fake, cluster):
    """The preempted job goes back to waiting with Kueue's reason, runs again when re-admitted
    (no new submission: its MPIJob is created once), ends SUCCEEDED, and its GPU-seconds count
    only the time it ran."""
    urgent_cluster = Cluster(name="fake-urgent", namespace=NS, gpus_per_node=8, kueue_queue="team-queue",
                             priority_class="urgent")
    urgent_cluster.set_kubeconfig(fake.kubeconfig_text(namespace=NS))
    urgent_cluster.save()
    creates = sum(1 for r in fake.requests if r[:3] == ("create", "kubeflow.org", "mpijobs"))
    low, low_hold = submit_held(http, fake, gpus=16, cluster="fake")
    urgent_hold = threading.Event()
    try:
        assert wait_state(low, {State.RUNNING} | ENDED, timeout=60).state == State.RUNNING
        urgent, urgent_hold = submit_held(http, fake, gpus=8, cluster="fake-urgent")
        preempted = job_when(low, lambda j: j.state != State.RUNNING, "the low-priority job to be preempted")
        assert preempted.state == State.LAUNCHING
        assert preempted.reason.startswith("preempted by Kueue (InClusterQueue): Preempted to accommodate a "
                                           "workload"), preempted.reason
        assert "due to prioritization in the ClusterQueue" in preempted.reason
        assert wait_state(urgent, {State.RUNNING} | ENDED, timeout=60).state == State.RUNNING
        waiting = job_when(low, lambda j: j.reason.startswith("preempted by Kueue") and "waiting in Kueue" in j.reason,
                           "the preempted job's wait reason", timeout=30)
        assert "has 8 nvidia.com/gpu free in flavor default-flavor, the job asks for 16" in waiting.reason
        urgent_hold.set()
        assert wait_state(urgent, ENDED, timeout=60).state == State.SUCCEEDED
        assert wait_state(low, {State.RUNNING} | ENDED, timeout=60).state == State.RUNNING
    finally:
        urgent_hold.set()
        low_hold.set()
    job = wait_state(low, ENDED, timeout=60)
    assert job.state == State.SUCCEEDED, job.reason
    assert sum(1 for r in fake.requests if r[:3] == ("create", "kubeflow.org", "mpijobs")) - creates == 2
    events = list(JobEvent.objects.filter(job_id=low).order_by("ts", "id"))
    states = [e.state for e in events if e.state]
    assert states == [State.QUEUED, State.LAUNCHING, State.RUNNING, State.LAUNCHING, State.RUNNING, State.SUCCEEDED]
    requeued = next(e for e in events if e.gpus == 0)
    assert requeued.message.startswith("preempted by Kueue (InClusterQueue)")
    rerun = next(e for e in events if e.state == State.RUNNING and e.ts > requeued.ts)
    waited = rerun.ts - requeued.ts
    assert waited > timedelta(0)
    ran = (job.finished_at - job.started_at) - waited
    assert job.gpu_seconds == pytest.approx(16 * ran.total_seconds(), abs=0.5)


def test_a_group_mapped_to_its_own_local_queue_labels_mpijobs_and_trainjobs_and_a_users_own_wins(
        http, fake, cluster):
    alice = User.objects.get(username="alice")
    vision = Group.objects.create(name="vision")
    alice.groups.add(vision)
    call_command("map_queue", "--cluster", "fake", "--group", "vision", "--queue", "vision-queue")
    Image.objects.create(name="torch-k8s", container_image="registry.example/torch:2.13", python="python",
                         launchers="torchrun")
    mpi = submit(http, group="vision")
    torch = submit(http, group="vision", image="torch-k8s")
    for job_id in (mpi, torch):
        job = wait_state(job_id, ENDED, timeout=90)
        assert job.state == State.SUCCEEDED, job.reason
    assert fake.mpijob(NS, job_name(mpi))["metadata"]["labels"][QUEUE_LABEL] == "vision-queue"
    assert fake.trainjob(NS, job_name(torch))["metadata"]["labels"][QUEUE_LABEL] == "vision-queue"
    call_command("map_queue", "--cluster", "fake", "--user", "alice", "--queue", "alice-queue")
    own = submit(http, group="vision", image="torch-k8s")
    assert wait_state(own, ENDED, timeout=90).state == State.SUCCEEDED
    assert fake.trainjob(NS, job_name(own))["metadata"]["labels"][QUEUE_LABEL] == "alice-queue"
    plain = submit(http)          # no group: alice's own queue still
    assert wait_state(plain, ENDED, timeout=90).state == State.SUCCEEDED
    assert fake.mpijob(NS, job_name(plain))["metadata"]["labels"][QUEUE_LABEL] == "alice-queue"
    assert QueueMapping.objects.count() == 2


def test_the_kueue_calls_are_ones_the_role_grants(http, fake, cluster):
    role = next(doc for path in (ROOT / "deploy" / "kubernetes").glob("*.yaml")
                for doc in yaml.safe_load_all(Path(path).read_text()) if doc and doc.get("kind") == "Role")
    allowed = {(verb, group, resource.partition("/")[0], resource.partition("/")[2])
               for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    start = len(fake.requests)
    first, hold = submit_held(http, fake, gpus=16)
    second = None
    try:
        assert wait_state(first, {State.RUNNING} | ENDED, timeout=60).state == State.RUNNING
        second, other = submit_held(http, fake)
        other.set()
        job_when(second, lambda j: "waiting in Kueue" in j.reason, "the second job to wait in Kueue", timeout=30)
    finally:
        hold.set()
    for job_id in (first, second):
        assert wait_state(job_id, ENDED, timeout=60).state == State.SUCCEEDED
    used = {(verb, group, resource, sub) for verb, group, resource, sub, _, _ in fake.requests[start:]}
    for needed in [("list", "kueue.x-k8s.io", "workloads", ""), ("get", "kueue.x-k8s.io", "localqueues", ""),
                   ("get", "visibility.kueue.x-k8s.io", "localqueues", "pendingworkloads")]:
        assert needed in used, needed
    assert used <= allowed, used - allowed


def test_a_queue_name_on_a_cluster_without_kueue_is_refused_with_the_reason(http, tmp_path, cluster):
    with FakeKube() as plain:
        path = plain.write_kubeconfig(tmp_path / "kubeconfig", namespace=NS)
        with pytest.raises(CommandError) as refused:
            call_command("add_cluster", "--name", "no-kueue", "--kubeconfig", str(path), "--namespace", NS,
                         "--gpus-per-node", "8", "--kueue-queue", "team-queue")
        assert "--kueue-queue/kueue_queue: Kueue is not installed on cluster no-kueue" in str(refused.value)
        assert "no kueue.x-k8s.io API group" in str(refused.value)
        assert not Cluster.objects.filter(name="no-kueue").exists()
        # Registered without a queue, the check records that Kueue is absent ...
        call_command("add_cluster", "--name", "no-kueue", "--kubeconfig", str(path), "--namespace", NS,
                     "--gpus-per-node", "8")
        stored = Cluster.objects.get(name="no-kueue")
        assert stored.kueue_found is False and "no kueue.x-k8s.io API group" in stored.kueue_detail
        # ... so a group's queue there is refused too, and so is a job that would carry one.
        Group.objects.create(name="vision")
        with pytest.raises(CommandError, match="--queue: Kueue is not installed on cluster no-kueue"):
            call_command("map_queue", "--cluster", "no-kueue", "--group", "vision", "--queue", "vision-queue")
        Cluster.objects.filter(pk=stored.pk).update(kueue_queue="team-queue")   # set behind the form's back
        response = http.post(f"{http.base}/api/jobs/", json={"image": "horovod-k8s", "gpus": 8, "backend": "kubernetes",
                                                             "script_path": "/t.py", "cluster": "no-kueue"})
        assert response.status_code == 400, response.text
        assert "Kueue is not installed on cluster no-kueue" in response.json()["cluster"][0]
    found = Cluster.objects.get(name="fake")
    assert found.kueue_found is None                  # the fixture's cluster was never checked
    # The periodic check (beat): the cluster without Kueue is gone now and keeps what was found.
    assert check_backend("kubernetes") == {"fake": True, "no-kueue": False}
    found.refresh_from_db()
    assert found.kueue_found is True and found.kueue_detail == "Kueue found: kueue.x-k8s.io/v1beta1 serves Workloads"
    assert Cluster.objects.get(name="no-kueue").kueue_found is False


def test_a_users_quota_still_refuses_a_job_above_it_before_anything_is_created(http, fake, cluster):
    call_command("set_quota", "--user", "alice", "--gpus-per-job", "8")
    creates = len([r for r in fake.requests if r[0] == "create"])
    response = http.post(f"{http.base}/api/jobs/", json={"image": "horovod-k8s", "gpus": 16, "backend": "kubernetes",
                                                         "script_path": "/examples/train.py"})
    assert response.status_code == 400, response.text
    assert "at most 8 GPUs per job" in response.text
    assert not Job.objects.exists()
    assert len([r for r in fake.requests if r[0] == "create"]) == creates
