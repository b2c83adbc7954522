"""Elastic torchrun jobs end to end: real torchrun agents (one per GPU, `--nnodes=MIN:MAX`, c10d
rendezvous), a real Celery worker, GPUs played by tests/fakegpu/nvidia-smi on this machine and
by 1-slot instances over a real sshd on loopback. The job grows when a GPU frees up (a new agent
joins; torchrun restarts every worker in the larger world), shrinks for a queued job (the agent
of a given-back GPU stops; the other restarts without it), resumes each time from its own
checkpoint, and ends SUCCEEDED at its last step. Each scenario is the smallest that resizes (1
to 2 workers and back): every process a test starts costs CPU time that the suite's other tests
share."""
import re
import sys
from pathlib import Path

import pytest

from jobs.models import Image, State
from tests import sshd
from tests.conftest import wait_for
from tests.integration.test_elastic_jobs import size_messages
from tests.integration.test_gpu_binding import A100, ENDED, allocation, go, submit
from tests.integration.test_instances import add_instance, sshds  # noqa: F401 (the sshd fixture)
from tests.integration.test_job_lifecycle import stored_lines, upload, wait_state

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# Trains until a file "go" appears in the job's folder, then 3 steps more. Every worker saves the
# step it reached (checkpoint.pt, atomically) and a restarted world resumes from the newest one;
# each worker says the GPU it sees once, rank 0 says each step and the world it ran in. A step
# every half second, as in test_elastic_jobs.
ELASTIC = b"""
import os, time
import torch, torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print(f"SEES rank={rank} visible={os.environ.get('CUDA_VISIBLE_DEVICES', '-')}", flush=True)

def saved():
    try:
        return torch.load("checkpoint.pt")["step"]
    except Exception:
        return 0

newest = torch.tensor([saved()])
dist.all_reduce(newest, op=dist.ReduceOp.MAX)
step, last = newest.item(), None
deadline = time.time() + 240
while last is None or step < last:
    if last is None:
        stop = torch.tensor([1 if os.path.exists("go") or time.time() > deadline else 0])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            last = step + 3
    total = torch.tensor([1.0])
    dist.all_reduce(total)
    step += 1
    if rank == 0:
        print(f"STEP {step} size={int(total.item())}", flush=True)
    torch.save({"step": step}, f"checkpoint.pt.{os.getpid()}")
    os.replace(f"checkpoint.pt.{os.getpid()}", "checkpoint.pt")
    time.sleep(0.5)
if rank == 0:
    print(f"DONE step={step} size={world}", flush=True)
dist.destroy_process_group()
"""
STEP = re.compile(r"STEP (\d+) size=(\d+)")
SEES = re.compile(r"SEES rank=(\d+) visible=(\S+)")
EXAMPLE = Path(__file__).resolve().parents[2] / "jobs" / "examples" / "elastic_ddp_train.py"


@pytest.fixture
def torch_image(db):
    return Image.objects.create(name="torch-cpu", python=sys.executable, launchers="torchrun")


def steps(job_id):
    return [(int(m[1]), int(m[2])) for line in stored_lines(job_id) if (m := STEP.search(line.text))]


def wait_size(job_id, size, after_step=0):
    """The first step rank 0 ran in a world of `size` after `after_step`."""
    def reached():
        return next((step for step, ranks in steps(job_id) if ranks == size and step > after_step), None)
    try:
        return wait_for(reached, timeout=180, interval=0.3, message=f"job {job_id} to train on {size} workers")
    except AssertionError:
        print("\n".join(line.text for line in stored_lines(job_id) if "METRIC" not in line.text and "STEP" not in line.text)[:6000])
        raise


def seen_gpus(job_id):
    """The GPU each worker process saw, in the order they said it."""
    return [m[2] for line in stored_lines(job_id) if (m := SEES.search(line.text))]


def submit_elastic(http, **fields):
    response = http.post(f"{http.base}/api/jobs/", json={
        "image": "torch-cpu", "script": upload(http, ELASTIC, "elastic.py"), "gpus": 1, "max_gpus": 2, **fields})
    assert response.status_code == 201, response.text
    assert response.json()["launcher"] == "torchrun"
    return response.json()["id"]


def assert_ended_at_its_last_step(job_id):
    job = wait_state(job_id, ENDED, timeout=180)
    assert job.state == State.SUCCEEDED, (job.reason, [line.text for line in stored_lines(job_id)][-30:])
    assert (job.exit_code, job.failed_rank) == (0, None)      # the workers stopped by a resize failed nothing
    done = [line.text for line in stored_lines(job_id) if "DONE" in line.text]
    ran = [step for step, _ in steps(job_id)]
    assert done == [f"DONE step={ran[-1]} size={steps(job_id)[-1][1]}"]
    return ran


def test_on_this_machine_an_elastic_torchrun_job_grows_into_freed_gpus_and_shrinks_for_a_queued_job(
        http, local_gpus, celery_worker, torch_image):
    local_gpus([A100] * 2)
    blocker = submit(http, gpus=1)
    wait_for(lambda: allocation(blocker), timeout=60, message="the first job to hold a GPU")
    elastic = submit_elastic(http)
    first = wait_size(elastic, 1)
    assert allocation(elastic) == [("local", [1])]
    assert seen_gpus(elastic) == ["1"]                         # an agent per GPU: its worker sees its own

    go(blocker)                                                # a GPU frees up: an agent joins
    assert wait_state(blocker, ENDED).state == State.SUCCEEDED
    grown = wait_size(elastic, 2, after_step=first)
    assert size_messages(elastic)[-1] == (2, "grew to 2 GPUs: 1 GPU free on this machine")
    assert sorted(seen_gpus(elastic)[1:]) == ["0", "1"]

    queued = submit(http, gpus=1)                              # no GPU free: an agent stops
    wait_for(lambda: allocation(queued) == [("local", [0])], timeout=60, message="the queued job to start")
    assert size_messages(elastic)[-1] == (1, f"shrank to 1 GPU for job {queued}")
    wait_size(elastic, 1, after_step=grown)

    go(elastic, queued)
    ran = assert_ended_at_its_last_step(elastic)
    assert wait_state(queued, ENDED).state == State.SUCCEEDED
    # Each restart resumes at the newest checkpoint: no step is skipped, and a step that a restart
    # cut short is run again.
    assert sorted(set(ran)) == list(range(1, ran[-1] + 1))
    assert [size for size, _ in size_messages(elastic)][:3] == [1, 2, 1]     # (it may grow again as they end)


@pytest.mark.skipif(not sshd.available(), reason="needs Debian's openssh-server (/usr/sbin/sshd)")
def test_on_instances_an_elastic_torchrun_job_grows_onto_a_freed_host_and_shrinks_for_a_queued_job(
        http, sshds, celery_worker, torch_image):  # noqa: F811
    add_instance(sshds, "gpu-a", "127.0.0.2", 1)
    add_instance(sshds, "gpu-b", "127.0.0.3", 1)
    hold = upload(http, b"import os, time\nwhile not os.path.exists('go'): time.sleep(0.1)\n", "hold.py")
    blocker = submit(http, gpus=1, backend="instances", image="torch-cpu", script=hold)
    wait_for(lambda: allocation(blocker), timeout=60, message="the first job to hold an instance")
    elastic = submit_elastic(http, backend="instances")
    first = wait_size(elastic, 1)
    (held,) = allocation(elastic)
    other = "gpu-b" if held[0] == "gpu-a" else "gpu-a"

    go(blocker, jobs_dir=sshds["work_dir"])                   # the other instance frees up: its agent joins
    assert wait_state(blocker, ENDED).state == State.SUCCEEDED
    grown = wait_size(elastic, 2, after_step=first)
    assert [name for name, _ in allocation(elastic)] == [held[0], other]
    assert size_messages(elastic)[-1] == (2, f"grew to 2 GPUs: 1 GPU free on {other}")

    queued = submit(http, gpus=1, backend="instances", image="torch-cpu", script=hold)
    wait_for(lambda: [name for name, _ in allocation(queued)] == [other], timeout=120,
             message="the queued job to start on the GPUs the elastic job gave back")
    assert size_messages(elastic)[-1] == (1, f"shrank to 1 GPU for job {queued}")
    wait_size(elastic, 1, after_step=grown)

    go(elastic, queued, jobs_dir=sshds["work_dir"])
    ran = assert_ended_at_its_last_step(elastic)
    assert wait_state(queued, ENDED).state == State.SUCCEEDED
    assert sorted(set(ran)) == list(range(1, ran[-1] + 1))
    assert [size for size, _ in size_messages(elastic)][:3] == [1, 2, 1]


def test_the_elastic_example_trains_to_its_last_step(http, torch_image):
    job_id = submit_elastic(http, script=upload(http, EXAMPLE.read_bytes(), EXAMPLE.name),
                            args=["--steps", "6", "--checkpoint-every", "3"])
    job = wait_state(job_id, ENDED, timeout=180)
    texts = [line.text for line in stored_lines(job_id)]
    assert job.state == State.SUCCEEDED, (job.reason, texts[-20:])
    size = job.size          # its largest, where this machine had the slots free at its start
    assert f"finished at step 6 on {size} workers" in texts
    assert sorted(t for t in texts if t.startswith("rank ")) == [f"rank {r} of {size}: starting" for r in range(size)]
