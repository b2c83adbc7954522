"""The Kubernetes backend end to end: jobs submitted over HTTP to uvicorn, run by a real Celery
worker whose real `kubernetes` client talks HTTP to a protocol-level fake API server
(tests/fakekube) that plays the MPI operator and the kubelet, with faults injected."""
import signal
import threading
from pathlib import Path

import pytest
import yaml

from jobs import backends
from jobs.backends.kubernetes.models import Cluster
from jobs.models import Image, Job, JobEvent, State
from tests.conftest import ROOT, wait_for, job_name
from tests.fakekube import FakeKube, Scenario, default_output
from tests.integration.test_job_lifecycle import stored_lines, upload, wait_state

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
ENDED = {State.SUCCEEDED, State.FAILED, State.CANCELLED}
NS = "team-a"


@pytest.fixture(scope="module")
def fake():
    with FakeKube() as server:
        yield server
        assert server.errors == []


@pytest.fixture
def cluster(fake, db):
    fake.scenario = Scenario()
    fake.scenarios.clear()
    fake.faults.__init__()
    item = Cluster(name="fake", namespace=NS, gpus_per_node=1, image_pull_grace_seconds=2)
    item.set_kubeconfig(fake.kubeconfig_text(namespace=NS))
    item.save()
    Image.objects.create(name="horovod-k8s", container_image="registry.example/horovod:0.28.1", python="python")
    return item


def submit(http, **fields):
    body = {"image": "horovod-k8s", "gpus": 2, "backend": "kubernetes", **fields}
    if "script" not in body:
        body["script_path"] = "/examples/train.py"
    response = http.post(f"{http.base}/api/jobs/", json=body)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def creates(fake):
    """MPIJob create requests so far (a create names no object in its URL)."""
    return sum(1 for r in fake.requests if r[:3] == ("create", "kubeflow.org", "mpijobs"))


def texts(job_id):
    return [(line.rank, line.text) for line in stored_lines(job_id)]


def expected(np, steps=3):
    return [(rank, f"step {step} rank {rank}") for step in range(1, steps + 1) for rank in range(np)]


def events(job_id):
    return [(e.state, e.message) for e in JobEvent.objects.filter(job_id=job_id).order_by("ts", "id")]


def test_a_two_worker_job_runs_to_success_with_every_rank_line_stored(http, fake, cluster):
    before = creates(fake)
    job_id = submit(http, script=upload(http), args=["--epochs", "2"], env={"LR": "0.1"})
    job = wait_state(job_id, ENDED)
    assert job.state == State.SUCCEEDED, job.reason
    assert job.exit_code == 0
    states = [state for state, _ in events(job_id) if state]
    assert states == [State.QUEUED, State.LAUNCHING, State.RUNNING, State.SUCCEEDED]
    assert any(message.startswith(f"created the MPIJob {NS}/{job_name(job_id)}") for _, message in events(job_id))
    assert texts(job_id) == expected(2)

    mpijob = fake.mpijob(NS, job_name(job_id))
    spec = mpijob["spec"]
    assert spec["mpiReplicaSpecs"]["Worker"]["replicas"] == 2 and spec["slotsPerWorker"] == 1
    command = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
    assert command[-3:] == ["/ringmaster/script/count_lines.py", "--epochs", "2"] and "LR" in command
    script = fake.configmaps(NS)
    assert [c["metadata"]["name"] for c in script if c["metadata"]["name"].endswith("-script")] == \
        [f"{job_name(job_id)}-script"]
    assert creates(fake) - before == 1


def test_job_pods_run_without_a_token_or_privilege_escalation_keeping_only_sshds_capabilities(http, fake, cluster):
    """Checked where it counts: the MPIJob as the API server stored it (validated against the CRD,
    unknown fields pruned) and the launcher and worker pods the operator made from it."""
    hold = threading.Event()
    fake.scenario = Scenario(hold=hold)
    job_id = submit(http, script=upload(http))
    name = job_name(job_id)

    def running_pods():
        pods = [p for p in fake.pods(NS, selector=f"training.kubeflow.org/job-name={name}")
                if p["status"]["phase"] == "Running"]
        return pods if len(pods) == 3 else None          # the launcher and 2 workers

    try:
        pods = wait_for(running_pods, timeout=60, message="the job's pods to run")
    finally:
        hold.set()
    assert wait_state(job_id, ENDED).state == State.SUCCEEDED
    roles = sorted(p["metadata"]["labels"]["training.kubeflow.org/job-role"] for p in pods)
    assert roles == ["launcher", "worker", "worker"]
    stored = fake.mpijob(NS, name)["spec"]["mpiReplicaSpecs"]
    for pod in [*pods, *(replica["template"] for replica in stored.values())]:
        role = pod["metadata"]["labels"].get("training.kubeflow.org/job-role") or "template"
        assert pod["spec"]["automountServiceAccountToken"] is False, role
        (container,) = pod["spec"]["containers"]
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False and context["capabilities"]["drop"] == ["ALL"], role
        sshd = container["name"] == "worker"
        assert context["capabilities"].get("add", []) == (
            ["NET_BIND_SERVICE", "SETGID", "SETUID", "SYS_CHROOT"] if sshd else []), role


def test_a_failed_launcher_ends_failed_with_the_operators_reason_and_the_failing_rank(http, fake, cluster):
    output = default_output(2, 1) + [
        b"[1,1]<stderr>:Traceback (most recent call last):\n[1,1]<stderr>:RuntimeError: NaN loss\n",
        b"mpirun noticed that process rank 1 with PID 0 on node x-worker-1.x.team-a.svc exited on signal 9 (Killed).\n"]
    fake.scenario = Scenario(attempts=[(output, 1)])
    job_id = submit(http)
    job = wait_state(job_id, ENDED)
    assert job.state == State.FAILED
    assert job.reason.startswith("rank 1: RuntimeError: NaN loss"), job.reason      # what it raised
    assert job.failed_rank == 1 and job.exit_code == 137
    assert (1, "RuntimeError: NaN loss") in texts(job_id)


def test_a_failure_without_a_rank_names_the_operators_reason(http, fake, cluster):
    fake.scenario = Scenario(attempts=[([b"launcher: cannot resolve host\n"], 1)])
    job_id = submit(http)
    job = wait_state(job_id, ENDED)
    assert job.state == State.FAILED
    assert job.reason.startswith("MPIJob failed: BackoffLimitExceeded: Job has reached the specified backoff limit")
    assert job.reason.endswith("launcher: cannot resolve host") and job.exit_code == 1


def test_cancel_deletes_the_mpijob_its_pods_and_its_configmap(http, fake, cluster):
    hold = threading.Event()
    fake.scenario = Scenario(hold=hold)
    job_id = submit(http, script=upload(http))
    name = job_name(job_id)
    wait_for(lambda: Job.objects.get(pk=job_id).state == State.RUNNING and stored_lines(job_id),
             timeout=60, message="the job to run")
    assert http.post(f"{http.base}/api/jobs/{job_id}/cancel/").status_code == 202
    job = wait_state(job_id, ENDED, timeout=60)
    hold.set()
    assert job.state == State.CANCELLED
    assert fake.mpijob(NS, name) is None
    assert fake.pods(NS, selector=f"training.kubeflow.org/job-name={name}") == []
    assert not [c for c in fake.configmaps(NS) if c["metadata"]["name"].startswith(name)]
    assert ("delete", "kubeflow.org", "mpijobs", "", NS, name) in fake.requests


def test_create_answered_500_twice_is_retried_into_exactly_one_mpijob(http, fake, cluster):
    fake.faults.create_errors = [500, 503]
    before = creates(fake)
    job_id = submit(http)
    job = wait_state(job_id, ENDED)
    assert job.state == State.SUCCEEDED, job.reason
    name = job_name(job_id)
    assert creates(fake) - before == 3
    assert [j["metadata"]["name"] for j in fake.mpijobs() if j["metadata"]["name"] == name] == [name]


def test_a_create_answered_500_after_storing_is_adopted_into_exactly_one_mpijob(http, fake, cluster):
    """The API server stored the MPIJob but the answer was lost (a proxy's 500): the retry's 409
    finds it, and the runner adopts it rather than making a second one or failing."""
    fake.faults.create_errors_after_store = [500]
    before = creates(fake)
    job_id = submit(http)
    job = wait_state(job_id, ENDED)
    assert job.state == State.SUCCEEDED, job.reason
    name = job_name(job_id)
    assert creates(fake) - before == 2                         # the stored one, then the retry's 409
    assert [j["metadata"]["name"] for j in fake.mpijobs() if j["metadata"]["name"] == name] == [name]
    assert any(message.startswith("adopted the MPIJob") for _, message in events(job_id))
    assert texts(job_id) == expected(2)


def test_a_create_that_times_out_after_creating_is_adopted_on_retry(http, fake, cluster):
    fake.faults.create_slow_once = 5            # the worker's request timeout is 3 s
    job_id = submit(http)
    job = wait_state(job_id, ENDED)
    assert job.state == State.SUCCEEDED, job.reason
    name = job_name(job_id)
    assert [j["metadata"]["name"] for j in fake.mpijobs() if j["metadata"]["name"] == name] == [name]
    assert any(message.startswith("adopted the MPIJob") for _, message in events(job_id))
    assert texts(job_id) == expected(2)


def test_an_mpijob_left_by_an_earlier_try_is_adopted_not_duplicated(http, fake, cluster):
    from jobs.backends.kubernetes.clusters import render

    hold = threading.Event()
    fake.scenario = Scenario(hold=hold)
    job_id = submit(http, name="adopt me")
    wait_for(lambda: fake.mpijob(NS, job_name(job_id)), timeout=60, message="the MPIJob")
    hold.set()
    assert wait_state(job_id, ENDED).state == State.SUCCEEDED
    # The same job launched again (a retried task) finds its MPIJob by name and adopts it.
    from jobs.backends.kubernetes.clusters import runner_for
    from jobs.backends import job_spec

    job = Job.objects.select_related("image", "script", "charged_group").get(pk=job_id)
    started = runner_for(job).launch(job_spec(job))
    assert started.already_running and "adopted" in started.detail
    assert len([j for j in fake.mpijobs() if j["metadata"]["name"] == job_name(job_id)]) == 1
    assert render(job)[1]["metadata"]["name"] == job_name(job_id)


def test_a_watch_answered_410_gone_relists_and_the_job_still_finishes(http, fake, cluster):
    fake.faults.watch_gone_once = True
    job_id = submit(http)
    job = wait_state(job_id, ENDED)
    assert job.state == State.SUCCEEDED, job.reason
    assert fake.faults.watch_gone_once is False           # the fault fired
    lists = [r for r in fake.requests if r[0] == "list" and r[2] == "mpijobs"]
    assert len(lists) >= 2                                # the first list, and the relist after 410
    assert texts(job_id) == expected(2)


def test_jobs_followed_at_once_share_one_watch_per_kind_of_their_namespace(http, fake, cluster):
    """Four jobs followed at once by one worker: what the cluster says of them comes from one
    watch of the namespace's MPIJobs, pods and MPIJob events (a shared informer), not from a
    watch and a pod list every 2 s per job, which would make a thousand followed jobs 500 requests
    a second. Each job still gets its own lines and its own end."""
    hold = threading.Event()
    fake.scenario = Scenario(hold=hold)
    start = len(fake.raw_requests)
    jobs = [submit(http, gpus=1) for _ in range(4)]
    for job_id in jobs:
        wait_for(lambda: stored_lines(job_id), timeout=60, message=f"job {job_id} to print")
    hold.set()
    for job_id in jobs:
        assert wait_state(job_id, ENDED).state == State.SUCCEEDED
        assert texts(job_id) == expected(1)
    paths = [path for method, path, code in fake.raw_requests[start:] if method == "GET" and "/log" not in path]
    watches = [path for path in paths if "watch=true" in path.lower()]
    assert not [path for path in paths if "metadata.name" in path or "job-name" in path], paths
    assert len(watches) <= 2 * 3, watches                   # one per kind (renewed every 30 s), not per job
    assert {kind for path in watches for kind in ("mpijobs", "pods", "events") if f"/{kind}?" in path} == {
        "mpijobs", "pods", "events"}


def test_a_worker_follows_thirty_jobs_with_fewer_threads_than_jobs(http, fake, cluster, celery_worker):
    """Thirty MPIJobs printing and held running, followed by one worker: their launchers' log
    streams are read on one event loop and their follows are steps of the worker's follow hub,
    so the worker's threads grow by fewer than one a job (with two a job, the follow and its
    log stream's reader, a thousand jobs on two cores would collapse). Each job still gets its
    own lines and its own end."""
    import psutil

    hold = threading.Event()
    fake.scenario = Scenario(hold=hold)
    worker = psutil.Process(celery_worker.process.pid)
    before = worker.num_threads()
    jobs = [submit(http, gpus=1) for _ in range(30)]
    for job_id in jobs:
        wait_for(lambda: stored_lines(job_id), timeout=120, message=f"job {job_id} to print")
    assert Job.objects.filter(pk__in=jobs, state=State.RUNNING).count() == len(jobs)
    grown = worker.num_threads() - before
    hold.set()
    for job_id in jobs:
        assert wait_state(job_id, ENDED).state == State.SUCCEEDED
        assert texts(job_id) == expected(1)
    assert grown < len(jobs), f"the worker has {grown} more threads while it follows {len(jobs)} jobs"


def test_a_log_stream_cut_mid_line_loses_and_repeats_nothing(http, fake, cluster):
    fake.scenario = Scenario(steps=20)
    fake.faults.cut_log_once_after = 150
    job_id = submit(http)
    job = wait_state(job_id, ENDED)
    assert job.state == State.SUCCEEDED, job.reason
    assert not fake.faults.cut_log_once_after              # the fault fired
    assert texts(job_id) == expected(2, 20)


def test_a_retried_launcher_is_followed_into_its_new_pod(http, fake, cluster):
    Cluster.objects.filter(pk=cluster.pk).update(backoff_limit=1)
    fake.scenario = Scenario(attempts=[([b"[1,0]<stdout>:attempt 1\n"], 1), ([b"[1,0]<stdout>:attempt 2\n"], 0)])
    job_id = submit(http)
    job = wait_state(job_id, ENDED)
    assert job.state == State.SUCCEEDED, job.reason
    assert len(fake.launcher_pods(NS, job_name(job_id))) == 2
    assert texts(job_id) == [(0, "attempt 1"), (0, "attempt 2")]


def test_a_worker_killed_mid_follow_is_replaced_and_the_log_has_no_gap_or_repeat(http, fake, cluster, celery_worker):
    hold = threading.Event()
    fake.scenario = Scenario(hold=hold, steps=30)
    before = creates(fake)
    job_id = submit(http)
    wait_for(lambda: Job.objects.get(pk=job_id).state == State.RUNNING and stored_lines(job_id),
             timeout=60, message="the job to run")
    celery_worker.kill(signal.SIGKILL)
    try:
        hold.set()                                        # the job goes on printing with nobody following
    finally:
        celery_worker.start()
    job = wait_state(job_id, ENDED, timeout=120)
    assert job.state == State.SUCCEEDED, job.reason
    assert texts(job_id) == expected(2, 30)
    assert creates(fake) - before == 1


def test_unschedulable_workers_keep_the_job_launching_with_the_reason(http, fake, cluster):
    fake.scenario = Scenario(unschedulable=True)
    job_id = submit(http)
    job = wait_for(lambda: (j := Job.objects.get(pk=job_id)).reason.startswith("not schedulable") and j,
                   timeout=60, message="the scheduling reason")
    assert job.state == State.LAUNCHING
    assert job.reason == "not schedulable yet: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    fake.release_unschedulable(job_name(job_id), NS)
    job = wait_state(job_id, ENDED)
    assert job.state == State.SUCCEEDED, job.reason


def test_a_job_cancelled_while_it_waits_for_nodes_leaves_nothing_on_the_cluster(http, fake, cluster):
    fake.scenario = Scenario(unschedulable=True)
    job_id = submit(http)
    wait_for(lambda: Job.objects.get(pk=job_id).reason.startswith("not schedulable"), timeout=60,
             message="the scheduling reason")
    assert http.post(f"{http.base}/api/jobs/{job_id}/cancel/").status_code == 202
    job = wait_state(job_id, ENDED, timeout=60)
    assert job.state == State.CANCELLED
    assert fake.mpijob(NS, job_name(job_id)) is None
    assert fake.pods(NS, selector=f"training.kubeflow.org/job-name={job_name(job_id)}") == []


def test_a_cluster_without_the_mpijob_crd_fails_the_launch_saying_what_is_missing(http, fake, cluster):
    fake.faults.errors = {("create", "mpijobs"): [404]}
    job_id = submit(http)
    job = wait_state(job_id, ENDED)
    assert job.state == State.FAILED
    assert job.reason.startswith("launch failed: fake: ")
    assert job.reason.endswith(f"(is mpi-operator v0.8 installed, serving kubeflow.org/v2beta1, and does "
                               f"namespace {NS} exist?)"), job.reason


def test_an_image_that_cannot_be_pulled_fails_after_the_grace_period(http, fake, cluster):
    fake.scenario = Scenario(image_pull_error=True)
    job_id = submit(http)
    job = wait_state(job_id, ENDED, timeout=60)
    assert job.state == State.FAILED
    assert job.reason.startswith("image pull failed for 2 s: cannot pull image registry.example/horovod:0.28.1")
    assert fake.mpijob(NS, job_name(job_id)) is None     # nothing left holding GPUs


def test_an_oomkilled_worker_is_named_in_the_failure(http, fake, cluster):
    fake.scenario = Scenario(oom_worker=1)
    job_id = submit(http)
    job = wait_state(job_id, ENDED)
    assert job.state == State.FAILED
    assert job.reason.startswith(f"rank 1 exited with code 137 (worker in pod {job_name(job_id)}-worker-1 was "
                                 "OOMKilled (memory limit 16Gi))"), job.reason
    assert job.failed_rank == 1


def test_an_evicted_worker_fails_the_job_saying_so(http, fake, cluster):
    fake.scenario = Scenario(evict_worker=0)
    job_id = submit(http)
    job = wait_state(job_id, ENDED)
    assert job.state == State.FAILED
    assert f"(pod {job_name(job_id)}-worker-0 was evicted: The node was low on resource: memory.)" in job.reason, \
        job.reason


def test_the_operators_validation_error_fails_the_job_and_removes_the_mpijob(http, fake, cluster):
    fake.scenario = Scenario(validation_error="MPIJob.kubeflow.org \"x\" is invalid: spec.foo: bad")
    job_id = submit(http)
    job = wait_state(job_id, ENDED)
    assert job.state == State.FAILED
    assert job.reason == 'the MPI operator rejected the MPIJob: MPIJob.kubeflow.org "x" is invalid: spec.foo: bad'
    assert fake.mpijob(NS, job_name(job_id)) is None


def test_an_mpijob_deleted_behind_the_portals_back_fails_the_job(http, fake, cluster):
    fake.scenario = Scenario(hold=threading.Event())
    job_id = submit(http)
    wait_for(lambda: Job.objects.get(pk=job_id).state == State.RUNNING, timeout=60, message="the job to run")
    fake.delete_mpijob(NS, job_name(job_id))
    job = wait_state(job_id, ENDED)
    assert job.state == State.FAILED
    assert job.reason == "the MPIJob was deleted outside Ringmaster"


def test_every_call_the_portal_makes_is_allowed_by_the_deployed_role(http, fake, cluster):
    """A job run to its end (with an uploaded script), a job cancelled while it runs, and the
    admin's check of the cluster: every call they make is one the Role in deploy/ grants. The
    calls are this test's own, so it holds when run alone."""
    from jobs.backends.kubernetes.clusters import check

    role = next(doc for path in (ROOT / "deploy" / "kubernetes").glob("*.yaml")
                for doc in yaml.safe_load_all(Path(path).read_text()) if doc and doc.get("kind") == "Role")
    allowed = {(verb, group, resource.partition("/")[0], resource.partition("/")[2])
               for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    start = len(fake.requests)

    done = submit(http, script=upload(http))
    assert wait_state(done, ENDED).state == State.SUCCEEDED
    hold = threading.Event()
    fake.scenario = Scenario(hold=hold)
    cancelled = submit(http)
    wait_for(lambda: Job.objects.get(pk=cancelled).state == State.RUNNING, timeout=60, message="the job to run")
    assert http.post(f"{http.base}/api/jobs/{cancelled}/cancel/").status_code == 202
    assert wait_state(cancelled, ENDED, timeout=60).state == State.CANCELLED
    hold.set()
    assert check(cluster)[0]

    used = {(verb, group, resource, sub) for verb, group, resource, sub, _, _ in fake.requests[start:]}
    for needed in [("create", "kubeflow.org", "mpijobs", ""), ("watch", "kubeflow.org", "mpijobs", ""),
                   ("delete", "kubeflow.org", "mpijobs", ""), ("create", "", "configmaps", ""),
                   ("list", "", "pods", ""), ("get", "", "pods", "log")]:
        assert needed in used, needed                        # the run made the calls that matter
    assert used <= allowed, used - allowed


def test_a_torchrun_job_runs_as_a_trainjob_through_the_portal_with_calls_the_role_allows(http, fake, cluster):
    """Submitted over the API with the torchrun launcher: a TrainJob on the cluster's training
    runtime (2 nodes of 1 process on 1-GPU nodes), every rank's lines stored, the job page's link
    to the TrainJob, and only calls that deploy/'s Role grants."""
    role = next(doc for path in (ROOT / "deploy" / "kubernetes").glob("*.yaml")
                for doc in yaml.safe_load_all(Path(path).read_text()) if doc and doc.get("kind") == "Role")
    allowed = {(verb, group, resource.partition("/")[0], resource.partition("/")[2])
               for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    Image.objects.create(name="torch-k8s", container_image="registry.example/torch:2.13", python="python",
                         launchers="torchrun")
    start = len(fake.requests)
    job_id = submit(http, image="torch-k8s", script=upload(http))
    job = wait_state(job_id, ENDED)
    assert job.state == State.SUCCEEDED, job.reason
    assert job.launcher == "torchrun"
    trainjob = fake.trainjob(NS, job_name(job_id))
    assert trainjob["spec"]["runtimeRef"]["name"] == "torch-distributed"
    assert (trainjob["spec"]["trainer"]["numNodes"], trainjob["spec"]["trainer"]["numProcPerNode"]) == (2, 1)
    assert {rank for rank, _ in texts(job_id)} >= {0, 1}
    backend = backends.of(job)                       # the job page's link, and what it shows
    kind, document = backend.document(job)
    assert (kind, backend.links(job)[0][0], backend.document_problems(document)) == ("TrainJob", "View TrainJob", [])
    used = {(verb, group, resource, sub) for verb, group, resource, sub, _, _ in fake.requests[start:]}
    assert ("create", "trainer.kubeflow.org", "trainjobs", "") in used
    assert used <= allowed, used - allowed
