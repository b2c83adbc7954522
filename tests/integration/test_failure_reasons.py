"""A failure names the rank that caused it, with real horovodrun on this machine through the real
worker: horovodrun names the first process it reaps, which is often a rank that only died
because another one failed first (HorovodInternalError: "Horovod has been shut down")."""
import pytest

from jobs.models import State
from tests.integration.test_job_lifecycle import upload, wait_state

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
ENDED = {State.SUCCEEDED, State.FAILED, State.CANCELLED}

RANK_1_FAILS = b"""
import os, signal, sys, time
import torch
import horovod.torch as hvd

hvd.init()
if hvd.rank() == 1:
    time.sleep(1)
    if sys.argv[1] == "raise":
        raise RuntimeError("boom")
    os.kill(os.getpid(), signal.SIGKILL)          # as the kernel's out-of-memory killer does
for i in range(600):
    hvd.allreduce(torch.ones(1), name=f"x{i}")
    time.sleep(0.1)
"""


def run(http, how):
    response = http.post(f"{http.base}/api/jobs/", json={
        "image": "horovod-cpu", "gpus": 2, "script": upload(http, RANK_1_FAILS, "rank1.py"), "args": [how]})
    assert response.status_code == 201, response.text
    return wait_state(response.json()["id"], ENDED, timeout=120)


def test_the_rank_that_raised_first_is_named_not_the_one_horovod_stopped_then(http):
    job = run(http, "raise")
    assert job.state == State.FAILED
    assert job.failed_rank == 1
    assert job.reason == "rank 1: RuntimeError: boom (rank 0 then stopped: HorovodInternalError)"


def test_a_rank_killed_by_a_signal_says_so(http):
    job = run(http, "kill")
    assert job.state == State.FAILED
    assert job.failed_rank == 1 and job.exit_code == 137
    killed = ("rank 1 exited with code 137: killed by signal 9 (SIGKILL; the kernel's out-of-memory killer sends "
              "it when memory runs out)")
    # horovodrun stops rank 0 as soon as it reaps rank 1; rank 0 says why it stopped only if it
    # noticed the lost peer first, and then the reason says so too.
    assert job.reason in (killed, killed + " (rank 0 then stopped: HorovodInternalError)")
