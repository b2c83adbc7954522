"""A job's limits of processes and memory (runners.limits), held by the kernel on this machine: a
fork bomb and a memory hog each fail with the limit they ran into as their reason, through the real
worker and sandbox, while a job beside them runs to its end."""
import os
import shutil
import sys

import pytest

from jobs.models import Image, LogLine, State
from tests.integration.test_job_lifecycle import upload, wait_state

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
ENDED = {State.SUCCEEDED, State.FAILED, State.CANCELLED}

# Forks until it cannot; the children wait for it to end (the pipe's end closes) and go with it.
FORK_BOMB = b"""
import os
r, w = os.pipe()
forked = 0
try:
    while True:
        if os.fork() == 0:
            os.close(w)
            os.read(r, 1)
            os._exit(0)
        forked += 1
finally:
    print("forked", forked, flush=True)
"""
MEMORY_HOG = b"""
hog = bytearray(400 << 20)          # zero-filled: every page is touched
print("allocated", len(hog), flush=True)
"""
BYSTANDER = b"""
import hashlib, time
start, rounds = time.monotonic(), 0
while time.monotonic() - start < 1:
    hashlib.sha256(b"x" * (1 << 20)).digest()
    rounds += 1
print("bystander done", rounds > 0, flush=True)
"""


@pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                    reason="needs bubblewrap, and root for the job's cgroups (or its own uid, for RLIMIT_NPROC)")
def test_a_fork_bomb_and_a_memory_hog_fail_with_their_limit_while_the_job_beside_them_succeeds(http):
    Image.objects.create(name="capped-processes", python=sys.executable, max_processes=32)
    Image.objects.create(name="capped-memory", python=sys.executable, memory_mib=200)
    jobs = {}
    for name, image, script in [("bomb", "capped-processes", FORK_BOMB), ("hog", "capped-memory", MEMORY_HOG),
                                ("bystander", "horovod-cpu", BYSTANDER)]:
        response = http.post(f"{http.base}/api/jobs/", json={
            "image": image, "gpus": 1, "script": upload(http, script, f"{name}.py")})
        assert response.status_code == 201, response.text
        jobs[name] = response.json()["id"]
    ended = {name: wait_state(job_id, ENDED, timeout=120) for name, job_id in jobs.items()}

    assert ended["bomb"].state == State.FAILED
    assert "hit its limit of 32 processes" in ended["bomb"].reason, ended["bomb"].reason
    assert ended["hog"].state == State.FAILED
    assert "hit its memory limit of 200 MiB" in ended["hog"].reason, ended["hog"].reason
    assert ended["bystander"].state == State.SUCCEEDED, ended["bystander"].reason
    assert LogLine.objects.filter(job_id=jobs["bystander"], text="bystander done True").exists()
