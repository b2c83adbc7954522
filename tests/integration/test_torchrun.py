"""torchrun jobs end to end through the portal (uvicorn, the real Celery worker, PostgreSQL), on
the embedded default (the sandbox) and on two instances (real sshd on 127.0.0.2 and 127.0.0.3,
one torchrun agent each, c10d rendezvous on the first): each line carries its torch RANK, metric
lines become each rank's curve, a crash is reported as the crashing rank's with its exception
(torchrun's error files name it), and cancel leaves no process."""
import signal
import sys

import pytest

from jobs.models import Image, Job, LogLine, MetricPoint, State
from tests.conftest import job_name, processes_marked, wait_for
from tests.integration.test_instances import add_instance, job_processes, sshds  # noqa: F401 (the sshd fixture)
from tests.integration.test_job_lifecycle import upload, wait_state

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
ENDED = {State.SUCCEEDED, State.FAILED, State.CANCELLED}

ALLREDUCE = b"""
import os, sys, time
import torch, torch.distributed as dist
import ringmaster_metrics
dist.init_process_group("gloo")
rank = dist.get_rank()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
print(f"rank={rank} of {dist.get_world_size()} sum={total.item():g}", flush=True)
ringmaster_metrics.log(step=1, loss=1.0 / (rank + 1))
ringmaster_metrics.log(step=2, loss=0.5 / (rank + 1))
if sys.argv[1:] == ["crash", str(rank)]:
    time.sleep(0.5)
    raise ZeroDivisionError("rank %d divided by zero" % rank)
if sys.argv[1:] == ["sleep"]:
    time.sleep(600)
if sys.argv[1:2] == ["lines"]:
    for line in range(int(sys.argv[2])):
        print(f"rank={rank} line={line}", flush=True)
        time.sleep(0.1)
dist.barrier()
"""


@pytest.fixture
def torch_image(db):
    return Image.objects.create(name="torch-cpu", python=sys.executable, launchers="torchrun")


def submit(http, *args, gpus=2, **fields):
    response = http.post(f"{http.base}/api/jobs/", json={
        "image": "torch-cpu", "gpus": gpus, "script": upload(http, ALLREDUCE, "allreduce.py"), "args": list(args),
        **fields})
    assert response.status_code == 201, response.text
    assert response.json()["launcher"] == "torchrun"
    return response.json()["id"]


def test_a_two_rank_torchrun_job_all_reduces_and_each_rank_has_its_lines_and_curve(http, torch_image):
    job_id = submit(http)
    job = wait_state(job_id, ENDED, timeout=180)
    lines = list(LogLine.objects.filter(job_id=job_id).order_by("seq").values_list("rank", "text"))
    assert job.state == State.SUCCEEDED, (job.reason, lines[-20:])
    said = {rank: text for rank, text in lines if text.startswith("rank=")}
    assert said == {0: "rank=0 of 2 sum=3", 1: "rank=1 of 2 sum=3"}
    curves = {(rank, step): value for rank, step, value in
              MetricPoint.objects.filter(job_id=job_id, name="loss").values_list("rank", "step", "value")}
    assert curves == {(0, 1): 1.0, (0, 2): 0.5, (1, 1): 0.5, (1, 2): 0.25}


def test_a_crash_on_rank_1_is_reported_as_rank_1s_with_its_exception(http, torch_image):
    job_id = submit(http, "crash", "1")
    job = wait_state(job_id, ENDED, timeout=180)
    assert job.state == State.FAILED
    assert job.failed_rank == 1, job.reason
    assert job.reason.startswith("rank 1: ZeroDivisionError: rank 1 divided by zero"), job.reason


def test_cancel_stops_every_process_of_a_torchrun_job(http, torch_image, settings):
    job_id = submit(http, "sleep")
    wait_for(lambda: LogLine.objects.filter(job_id=job_id, text__startswith="rank=").count() == 2,
             timeout=180, message="both ranks to all-reduce")
    marker = str((settings.RINGMASTER_JOBS_DIR / job_name(job_id)).resolve())
    assert len(processes_marked(marker, "RINGMASTER_JOB_DIR")) >= 3         # the agent and its workers
    assert http.post(f"{http.base}/api/jobs/{job_id}/cancel/").status_code == 202
    assert wait_state(job_id, ENDED, timeout=120).state == State.CANCELLED
    assert processes_marked(marker, "RINGMASTER_JOB_DIR") == []


@pytest.fixture
def two_instances(sshds):  # noqa: F811
    add_instance(sshds, "gpu-a", "127.0.0.2", 1)
    add_instance(sshds, "gpu-b", "127.0.0.3", 1)
    return sshds


def test_a_torchrun_job_on_two_instances_has_an_agent_on_each_and_all_reduces(http, torch_image, two_instances):
    job_id = submit(http, backend="instances")
    job = wait_state(job_id, ENDED, timeout=180)
    lines = list(LogLine.objects.filter(job_id=job_id).order_by("seq").values_list("rank", "text"))
    assert job.state == State.SUCCEEDED, (job.reason, lines[-20:])
    assert {rank: text for rank, text in lines if text.startswith("rank=")} == {0: "rank=0 of 2 sum=3",
                                                                                 1: "rank=1 of 2 sum=3"}
    assert MetricPoint.objects.filter(job_id=job_id, name="loss").values("rank").distinct().count() == 2
    started = job.events.filter(state=State.RUNNING).values_list("message", flat=True).first()
    assert started.startswith("torchrun started on gpu-a") and "gpu-a:1, gpu-b:1" in started, started


def test_a_crash_on_the_second_instance_fails_the_job_at_once_as_rank_1s(http, torch_image, two_instances):
    job_id = submit(http, "crash", "1", backend="instances")
    job = wait_state(job_id, ENDED, timeout=180)        # not after torchrun's 300 s exit barrier
    assert (job.state, job.failed_rank) == (State.FAILED, 1), job.reason
    assert job.reason.startswith("rank 1: ZeroDivisionError: rank 1 divided by zero"), job.reason
    wait_for(lambda: job_processes(two_instances, job_id) == [], timeout=60,
             message="the first instance's agent to stop with the job")


def test_cancel_stops_every_agent_and_worker_on_every_instance(http, torch_image, two_instances):
    job_id = submit(http, "sleep", backend="instances")
    wait_for(lambda: LogLine.objects.filter(job_id=job_id, text__startswith="rank=").count() == 2,
             timeout=180, message="both ranks to all-reduce")
    assert len(job_processes(two_instances, job_id)) >= 4          # an agent and a worker on each host
    assert http.post(f"{http.base}/api/jobs/{job_id}/cancel/").status_code == 202
    assert wait_state(job_id, ENDED, timeout=120).state == State.CANCELLED
    assert job_processes(two_instances, job_id) == []


def test_a_torchrun_job_on_instances_outlives_its_worker_and_keeps_its_whole_log(http, torch_image, two_instances,
                                                                                   celery_worker):
    job_id = submit(http, "lines", "80", backend="instances")
    wait_for(lambda: LogLine.objects.filter(job_id=job_id, text="rank=1 line=10").exists(), timeout=180,
             message="rank 1 to print its tenth line")
    celery_worker.kill(signal.SIGKILL)                   # its follower dies with it; the agents do not
    try:
        assert Job.objects.get(pk=job_id).state == State.RUNNING
        assert len(job_processes(two_instances, job_id)) >= 4
    finally:
        celery_worker.start()
    job = wait_state(job_id, ENDED, timeout=180)
    assert job.state == State.SUCCEEDED, job.reason
    lines = list(LogLine.objects.filter(job_id=job_id).order_by("seq").values_list("seq", "rank", "text"))
    assert [seq for seq, _, _ in lines] == list(range(len(lines)))         # re-attached where it left off
    for rank in (0, 1):
        assert [text for _, r, text in lines if r == rank and " line=" in text] == \
            [f"rank={rank} line={n}" for n in range(80)]
