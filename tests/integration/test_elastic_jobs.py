"""Elastic jobs end to end on this machine and on instances: real horovodrun in elastic mode, a
real Celery worker, and two GPUs played by tests/fakegpu/nvidia-smi (or two 1-slot instances over
a real sshd). The job grows when another job ends, shrinks when a queued job needs the GPUs (which
then starts on the ones it gave back), and ends SUCCEEDED with its log continuous across both
resets. Each scenario is the smallest that resizes (1 to 2 ranks and back): every rank a test
starts costs CPU time that the suite's other tests share."""
import re
import signal
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.domain import scheduler
from jobs.backends.instances.models import Instance
from jobs.models import Job, JobEvent, State
from tests import sshd
from tests.conftest import ELASTIC_SETTLE_SECONDS, wait_for
from tests.integration.test_instances import add_instance, sshds  # noqa: F401 (the sshd fixture)
from tests.integration.test_gpu_binding import A100, ENDED, allocation, bindings, go, submit
from tests.integration.test_job_lifecycle import stored_lines, upload, wait_state

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# Trains until a file "go" appears in the job's folder, committing its state every step (where
# Horovod also applies a resize); rank 0 says each step and the size it ran at. A step every half
# second: each costs every rank CPU time that the suite's other tests share.
ELASTIC = b"""
import os, time
import horovod.torch as hvd
import torch

hvd.init()
print(f"BOUND rank={hvd.rank()} local_rank={hvd.local_rank()} host={os.environ.get('HOROVOD_HOSTNAME')} "
      f"visible={os.environ.get('CUDA_VISIBLE_DEVICES', '-')}", flush=True)
model = torch.nn.Linear(4, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())


@hvd.elastic.run
def train(state):
    deadline = time.time() + 240
    while True:
        stop = hvd.allreduce(torch.tensor([1.0 if os.path.exists("go") or time.time() > deadline else 0.0]),
                             name="stop").item()
        if stop > 0:
            return
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        state.step += 1
        if hvd.rank() == 0:
            print(f"STEP {state.step} size={hvd.size()}", flush=True)
        state.commit()
        time.sleep(0.5)


state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)
train(state)
if hvd.rank() == 0:
    print(f"DONE step={state.step} size={hvd.size()}", flush=True)
"""
STEP = re.compile(r"STEP (\d+) size=(\d+)")


def steps(job_id):
    return [(int(m[1]), int(m[2])) for line in stored_lines(job_id) if (m := STEP.search(line.text))]


def wait_size(job_id, size, after_step=0):
    """The first step rank 0 ran at `size` ranks after `after_step`."""
    def reached():
        return next((step for step, ranks in steps(job_id) if ranks == size and step > after_step), None)
    return wait_for(reached, timeout=150, interval=0.3, message=f"job {job_id} to train on {size} ranks")


def size_messages(job_id):
    return list(JobEvent.objects.filter(job_id=job_id, gpus__isnull=False).order_by("id").values_list("gpus", "message"))


def test_an_elastic_job_grows_into_freed_gpus_and_shrinks_for_a_queued_job(http, local_gpus, celery_worker):
    local_gpus([A100] * 2)
    blocker = submit(http, gpus=1)
    bindings(blocker, 1)
    response = http.post(f"{http.base}/api/jobs/", json={
        "image": "horovod-cpu", "script": upload(http, ELASTIC, "elastic.py"), "gpus": 1, "max_gpus": 2})
    assert response.status_code == 201, response.text
    elastic = response.json()["id"]
    first = wait_size(elastic, 1)
    assert allocation(elastic) == [("local", [1])]

    go(blocker)                                                  # a GPU frees up: the job grows into it
    assert wait_state(blocker, ENDED).state == State.SUCCEEDED
    grown = wait_size(elastic, 2, after_step=first)
    assert Job.objects.get(pk=elastic).size == 2
    assert size_messages(elastic)[-1] == (2, "grew to 2 GPUs: 1 GPU free on this machine")
    assert allocation(elastic) == [("local", [1, 0])]
    # The rank started for the growth sees the job's GPUs as they are now: local rank 1 is GPU 0.
    visible = {tuple(seen) for _, _, seen in bindings(elastic, 2).values()}
    assert (1, 0) in visible

    queued = submit(http, gpus=1)                               # no GPU free: the elastic job gives 1 back
    assert {tuple(seen) for _, _, seen in bindings(queued, 1).values()} == {(0,)}
    assert size_messages(elastic)[-1] == (1, f"shrank to 1 GPU for job {queued}")
    assert allocation(elastic) == [("local", [1])] and allocation(queued) == [("local", [0])]
    wait_size(elastic, 1, after_step=grown)

    go(elastic)
    job = wait_state(elastic, ENDED, timeout=150)
    assert job.state == State.SUCCEEDED, job.reason
    assert (job.exit_code, job.failed_rank) == (0, None)         # the rank stopped by the shrink failed nothing
    go(queued)
    assert wait_state(queued, ENDED).state == State.SUCCEEDED
    lines = stored_lines(elastic)
    assert [line.seq for line in lines] == list(range(len(lines)))
    done = [line.text for line in lines if "DONE" in line.text]
    assert len(done) == 1 and done[0].endswith("size=1")
    ran = sorted({step for step, _ in steps(elastic)})
    assert ran == list(range(1, ran[-1] + 1))                  # no step lost across the resets
    assert [size for size, _ in size_messages(elastic)] == [1, 2, 1]


def test_a_shrink_decided_while_the_worker_is_down_is_applied_when_it_comes_back(http, local_gpus, celery_worker,
                                                                                 settings):
    settings.RINGMASTER_ELASTIC_SETTLE_SECONDS = ELASTIC_SETTLE_SECONDS      # this process admits too
    local_gpus([A100] * 2)
    response = http.post(f"{http.base}/api/jobs/", json={
        "image": "horovod-cpu", "script": upload(http, ELASTIC, "elastic.py"), "gpus": 1, "max_gpus": 2})
    elastic = response.json()["id"]
    wait_size(elastic, 2)                                        # nothing else runs: launched at 2
    settled = Job.objects.get(pk=elastic).started_at + timedelta(seconds=ELASTIC_SETTLE_SECONDS)
    wait_for(lambda: timezone.now() > settled, timeout=60, message="the job to settle (its ranks are up)")
    celery_worker.kill(signal.SIGKILL)                           # its follower dies with it
    try:
        queued = submit(http, gpus=1)
        scheduler.admit()                                        # the shrink is decided meanwhile
        assert Job.objects.get(pk=elastic).size == 1
        assert Job.objects.get(pk=queued).state == State.LAUNCHING
        before = len(stored_lines(elastic))
    finally:
        celery_worker.start()
    # The new follower applies the size: the job trains on 1 rank, and the queued job runs on
    # the GPU it gave back.
    last_at_2 = max(step for step, size in steps(elastic) if size == 2)
    wait_size(elastic, 1, after_step=last_at_2)
    assert {tuple(seen) for _, _, seen in bindings(queued, 1).values()} == {(1,)}
    go(elastic, queued)
    job = wait_state(elastic, ENDED, timeout=150)
    assert job.state == State.SUCCEEDED, job.reason
    assert wait_state(queued, ENDED).state == State.SUCCEEDED
    lines = stored_lines(elastic)
    assert len(lines) > before and [line.seq for line in lines] == list(range(len(lines)))
    ran = sorted({step for step, _ in steps(elastic)})
    assert ran == list(range(1, ran[-1] + 1))


@pytest.mark.skipif(not sshd.available(), reason="needs Debian's openssh-server (/usr/sbin/sshd)")
def test_on_instances_a_job_grows_onto_a_second_host_and_survives_losing_it(http, sshds, celery_worker):  # noqa: F811
    add_instance(sshds, "gpu-a", "127.0.0.2", 1)
    add_instance(sshds, "gpu-b", "127.0.0.3", 1)
    response = http.post(f"{http.base}/api/jobs/", json={
        "image": "horovod-cpu", "script": upload(http, ELASTIC, "elastic.py"), "gpus": 1, "max_gpus": 2,
        "backend": "instances"})
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    # Admitted on one instance and grown by the other's slots in the same pass (nothing else waits
    # for them), so it is launched on both.
    grown = wait_size(job_id, 2)
    assert allocation(job_id) == [("gpu-a", []), ("gpu-b", [])]
    assert size_messages(job_id)[0] == (2, "grew to 2 GPUs: 1 GPU free on gpu-b")
    bound = bindings(job_id, 2)
    assert {host for _, host, _ in bound.values()} == {"127.0.0.2", "127.0.0.3"}
    # The host goes once the job trains steadily on 2 ranks: lost right after the growth (the
    # state sync), a survivor was seen to die of a Gloo abort ("op.preamble.length <= op.nbytes.
    # 8 vs 4"), which Horovod does not recover from and no launcher could.
    grown = wait_size(job_id, 2, after_step=grown + 2)

    lost = sshds["servers"][1]
    lost.kill()                                     # gpu-b goes away: its sshd and the ranks under it
    try:
        wait_for(lambda: any(m.startswith("lost gpu-b (") for _, m in size_messages(job_id)), timeout=150,
                 message="the job to drop the lost host")
        size, message = size_messages(job_id)[-1]
        # Why the instance is lost is what its health check saw (a refused connection, or a check
        # cut off as the host went), named in the event.
        health = Instance.objects.get(name="gpu-b").health_reason
        assert (size, message) == (1, f"lost gpu-b ({health}): continuing on 1 GPU")
        assert allocation(job_id) == [("gpu-a", [])]
        assert not Instance.objects.get(name="gpu-b").healthy
        wait_size(job_id, 1, after_step=grown)
        go(job_id, jobs_dir=sshds["work_dir"])
        job = wait_state(job_id, ENDED, timeout=150)
        assert job.state == State.SUCCEEDED, job.reason
    finally:
        lost.start()
    lines = stored_lines(job_id)
    assert [line.seq for line in lines] == list(range(len(lines)))
    ran = sorted({step for step, _ in steps(job_id)})
    # Horovod places a new host's ranks as it likes: where rank 0 ran on the lost host, the line of
    # the step it was in dies with that host (the survivors finished and committed that step).
    lost_steps = 1 if bound[0][1] == "127.0.0.3" else 0
    assert len(set(range(1, ran[-1] + 1)) - set(ran)) <= lost_steps, ran
