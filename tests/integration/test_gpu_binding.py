"""Jobs own their GPUs, end to end: real horovodrun on this machine and over SSH (two real sshd
on loopback), a real Celery worker and uvicorn, and NVIDIA's nvidia-smi played by
tests/fakegpu/nvidia-smi (NVIDIA's documented CSV query format) for GPUs this machine lacks.

Every rank prints what it was given: CUDA_VISIBLE_DEVICES and its local rank, as horovodrun
hands them to the process (what hvd.local_rank() reads; the script imports neither torch nor
Horovod, about 2 CPU-seconds a rank). Jobs hold on until the test lets them go (go()), so that
they run side by side.
"""
import re
import signal
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from jobs.backends.instances import backend as instances
from jobs.backends.instances.models import Instance
from jobs.models import Job, SlotAllocation, State, SystemSample
from tests import sshd
from tests.conftest import install_fake_nvidia_smi, job_name, job_processes, wait_for
from tests.integration.test_instances import add_instance, sshds  # noqa: F401 (the sshd fixture)
from tests.integration.test_job_lifecycle import stored_lines, upload, wait_state

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
A100 = "NVIDIA A100-SXM4-80GB"
ENDED = {State.SUCCEEDED, State.FAILED, State.CANCELLED}

SHOW_BINDING = b"""
import os, time

print(f"BOUND rank={os.environ['HOROVOD_RANK']} local_rank={os.environ['HOROVOD_LOCAL_RANK']} "
      f"host={os.environ.get('HOROVOD_HOSTNAME')} "
      f"visible={os.environ.get('CUDA_VISIBLE_DEVICES', '-')}", flush=True)
deadline = time.time() + 240
while not os.path.exists("go") and time.time() < deadline:     # in the job's folder (see go())
    time.sleep(0.1)
"""
BOUND = re.compile(r"BOUND rank=(\d+) local_rank=(\d+) host=(\S+) visible=(\S+)")


def submit(http, **fields):
    response = http.post(f"{http.base}/api/jobs/", json={
        "image": "horovod-cpu", "script": upload(http, SHOW_BINDING, "show_binding.py"), **fields})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def go(*job_ids, jobs_dir=None):
    """Let the jobs end: a file in each one's folder (on this machine a job sees no other folder
    of the machine's /tmp: it runs in a sandbox)."""
    for job_id in job_ids:
        (Path(jobs_dir or settings.RINGMASTER_JOBS_DIR) / job_name(job_id) / "go").touch()


def bindings(job_id, ranks):
    """{rank: (local rank, host, [visible indices])} once every rank has said it."""
    def said():
        seen = {}
        for line in stored_lines(job_id):
            match = BOUND.search(line.text)
            if match:
                rank, local, host, visible = match.groups()
                seen[int(rank)] = (int(local), host, [int(i) for i in visible.split(",")] if visible != "-" else [])
        return seen if len(seen) == ranks else None
    return wait_for(said, timeout=120, message=f"job {job_id}'s {ranks} ranks to print their GPUs")


def allocation(job_id):
    names = dict(Instance.objects.values_list("pk", "name"))
    return [(names[a.host_id] if a.host_id else "local", a.gpu_indices)
            for a in SlotAllocation.objects.filter(job_id=job_id).order_by("position")]


def gpus_of(binding):
    """The GPU each rank uses by the Horovod convention: its local rank among the visible ones."""
    return {rank: visible[local] for rank, (local, _, visible) in binding.items()}


def test_two_jobs_on_this_machines_four_gpus_get_disjoint_gpus_and_a_third_waits_for_freed_ones(
        http, local_gpus, celery_worker, tmp_path):
    local_gpus([A100] * 4)
    first, second = submit(http, gpus=2), submit(http, gpus=2)
    one, two = bindings(first, 2), bindings(second, 2)

    # Each rank sees exactly its job's GPUs, and local rank k is the job's k-th GPU.
    assert {tuple(visible) for _, _, visible in one.values()} == {(0, 1)}
    assert {tuple(visible) for _, _, visible in two.values()} == {(2, 3)}
    assert sorted(gpus_of(one).values()) == [0, 1] and sorted(gpus_of(two).values()) == [2, 3]
    assert allocation(first) == [("local", [0, 1])] and allocation(second) == [("local", [2, 3])]

    third = submit(http, gpus=2)
    job = wait_for(lambda: (j := Job.objects.get(pk=third)).reason.startswith("waiting for capacity") and j,
                   timeout=60, message="the third job to wait for GPUs")
    assert job.state == State.QUEUED
    assert job.reason == "waiting for capacity: 4 of 4 GPUs of this machine in use, this job needs 2 GPUs (0 free)"

    go(first)
    assert wait_state(first, ENDED).state == State.SUCCEEDED
    assert {tuple(visible) for _, _, visible in bindings(third, 2).values()} == {(0, 1)}   # the freed ones
    assert allocation(third) == [("local", [0, 1])] and allocation(first) == []
    go(second, third)
    assert wait_state(second, ENDED).state == State.SUCCEEDED
    assert wait_state(third, ENDED).state == State.SUCCEEDED
    assert not SlotAllocation.objects.exists()


def rank_gpus(job_id):
    """CUDA_VISIBLE_DEVICES of the job's live rank processes, read from the processes themselves."""
    return sorted(p.environ()["CUDA_VISIBLE_DEVICES"] for p in job_processes(job_id)
                  if "CUDA_VISIBLE_DEVICES" in p.environ())


def test_a_worker_killed_mid_job_changes_neither_the_allocation_nor_the_binding(http, local_gpus, celery_worker,
                                                                                 tmp_path):
    local_gpus([A100] * 4)
    job_id = submit(http, gpus=2)
    bindings(job_id, 2)
    before = allocation(job_id), rank_gpus(job_id)
    assert before == ([("local", [0, 1])], ["0,1", "0,1"])

    celery_worker.kill(signal.SIGKILL)                                     # the follower dies with it
    try:
        assert Job.objects.get(pk=job_id).state == State.RUNNING
    finally:
        celery_worker.start()
    started = SystemSample.objects.filter(job_id=job_id).order_by("-id").values_list("id", flat=True).first() or 0
    wait_for(lambda: SystemSample.objects.filter(job_id=job_id, id__gt=started).exists(), timeout=90,
             message="a new follower to sample the job again")       # it has re-attached
    assert (allocation(job_id), rank_gpus(job_id)) == before
    other = submit(http, gpus=2)                          # the job's GPUs are still its own
    assert {tuple(v) for _, _, v in bindings(other, 2).values()} == {(2, 3)}
    go(job_id, other)
    assert wait_state(job_id, ENDED).state == State.SUCCEEDED
    assert wait_state(other, ENDED).state == State.SUCCEEDED


def test_a_job_asking_for_a_model_this_machine_lacks_is_refused_naming_the_models_there_are(http, local_gpus):
    local_gpus(["Tesla T4"] * 2)
    response = http.post(f"{http.base}/api/jobs/", json={
        "image": "horovod-cpu", "script_path": "x.py", "gpus": 1, "gpu_model": "A100"})
    assert response.status_code == 400
    assert response.json() == {"gpu_model": ["No GPU is a A100 on This machine; the models there "
                                             "are: Tesla T4."]}
    response = http.post(f"{http.base}/api/jobs/", json={"image": "horovod-cpu", "script_path": "x.py", "gpus": 3})
    assert response.status_code == 400 and "at most 2 GPUs per job" in response.json()["gpus"][0]


def test_this_machines_broken_nvidia_smi_places_nothing_and_the_job_says_why(http, local_gpus, tmp_path):
    local_gpus([A100] * 2, behaviour="fail")
    job_id = submit(http, gpus=1)
    job = wait_for(lambda: (j := Job.objects.get(pk=job_id)).reason.startswith("waiting for this machine") and j,
                   timeout=60, message="the job to wait for this machine's GPUs")
    assert job.state == State.QUEUED
    assert job.reason.startswith("waiting for this machine's GPUs: nvidia-smi failed (exit code 9): "
                                 "'Failed to initialize NVML: Driver/library version mismatch'")
    local_gpus([A100] * 2)                                  # the driver is back: the job starts
    http.post(f"{http.base}/api/jobs/{job_id}/cancel/")     # (a cancel wakes the scheduler too)
    assert wait_state(job_id, ENDED).state == State.CANCELLED


def test_telemetry_of_a_job_on_this_machines_gpus_reaches_the_metrics_api_with_an_idle_hint(
        http, local_gpus, tmp_path):
    local_gpus([A100] * 4, utilization=[7, 11, 95, 95])
    job_id = submit(http, gpus=2)
    bindings(job_id, 2)

    def system():
        data = http.get(f"{http.base}/api/jobs/{job_id}/metrics/").json()["system"]
        return data if data["hint"] and len({s["ts"] for s in data["samples"]}) >= 6 else None
    data = wait_for(system, timeout=60, message="six samples and the idle hint")
    assert data["collected"] is True
    assert {(s["host"], s["device"]) for s in data["samples"]} == {("localhost", "gpu0"), ("localhost", "gpu1")}
    gpu0 = [s for s in data["samples"] if s["device"] == "gpu0"][0]
    assert (gpu0["utilization"], gpu0["memory_used"], gpu0["memory_total"], gpu0["power"]) == (7, 2048, 81920, 100)
    assert re.fullmatch(r"GPU utilization 9% over the last \d+ minutes?: is the input pipeline the bottleneck\?",
                        data["hint"])
    go(job_id)
    assert wait_state(job_id, ENDED).state == State.SUCCEEDED


def test_without_gpus_a_job_shows_the_cpu_and_memory_of_its_processes(http, tmp_path):
    job_id = submit(http, gpus=2)
    bindings(job_id, 2)
    loaded = timezone.now()                  # both ranks have torch loaded (samples before may not)
    samples = wait_for(lambda: (s := list(SystemSample.objects.filter(job_id=job_id, utilization__isnull=False,
                                                                      ts__gt=loaded))) and s,
                       timeout=60, message="a CPU sample after the ranks started")
    assert {(s.host, s.device) for s in SystemSample.objects.filter(job_id=job_id)} == {("localhost", "cpu")}
    assert all(s.memory_used > 50 and s.memory_total > s.memory_used for s in samples)   # two python+torch ranks
    go(job_id)
    assert wait_state(job_id, ENDED).state == State.SUCCEEDED


# --- instances ----------------------------------------------------------------------------------
def gpu_instance(sshds, tmp_path, name, address, names, **config):  # noqa: F811
    fake = install_fake_nvidia_smi(tmp_path / f"gpus-{name}", names, **config)
    return add_instance(sshds, name, address, len(names), setup=f'PATH="{fake.parent}:$PATH"; export PATH')


@pytest.mark.skipif(not sshd.available(), reason="needs Debian's openssh-server (/usr/sbin/sshd)")
def test_instance_gpus_are_seen_by_the_health_check_and_bound_per_host(http, sshds, tmp_path, celery_worker):  # noqa: F811
    a = gpu_instance(sshds, tmp_path, "gpu-a", "127.0.0.2", [A100] * 4, utilization=[50, 60, 70, 80])
    b = gpu_instance(sshds, tmp_path, "gpu-b", "127.0.0.3", ["Tesla T4"] * 2)
    assert instances.check(a) == (True, f"ok: 4 GPUs seen by nvidia-smi ({A100})")
    a.refresh_from_db()
    assert [(g["index"], g["name"], g["memory_mib"]) for g in a.gpu_inventory] == [(i, A100, 81920) for i in range(4)]
    Instance.objects.filter(pk=b.pk).update(gpu_inventory=[
        {"index": i, "name": "Tesla T4", "uuid": f"GPU-{i}", "memory_mib": 15360} for i in range(2)])
    celery_worker.idle()             # the health check's scheduler pass is over

    small = submit(http, gpus=2, backend="instances", gpu_model="a100")
    assert {tuple(v) for _, _, v in bindings(small, 2).values()} == {(0, 1)}
    wide = submit(http, gpus=4, backend="instances")
    # 2 free on gpu-a (indices 2, 3) and 2 on gpu-b (0, 1): each rank sees its own host's.
    by_host = {}
    for rank, (local, host, visible) in bindings(wide, 4).items():
        by_host.setdefault(host, set()).add((tuple(visible), local))
    assert by_host == {"127.0.0.2": {((2, 3), 0), ((2, 3), 1)}, "127.0.0.3": {((0, 1), 0), ((0, 1), 1)}}
    assert allocation(wide) == [("gpu-a", [2, 3]), ("gpu-b", [0, 1])]

    samples = wait_for(lambda: (s := set(SystemSample.objects.filter(job_id=wide).values_list(
        "host", "device", "utilization"))) >= {("gpu-a", "gpu2", 70), ("gpu-a", "gpu3", 80)} and s,
        timeout=60, message="samples of the wide job's GPUs on gpu-a")
    assert {(h, d) for h, d, _ in samples} <= {("gpu-a", "gpu2"), ("gpu-a", "gpu3"), ("gpu-b", "gpu0"), ("gpu-b", "gpu1")}

    response = http.post(f"{http.base}/api/jobs/", json={"image": "horovod-cpu", "script_path": "x.py", "gpus": 1,
                                                          "backend": "instances", "gpu_model": "V100"})
    assert response.status_code == 400
    assert response.json() == {"gpu_model": [f"No GPU is a V100 on GPU instances over SSH; the models there are: "
                                             f"{A100}, Tesla T4."]}
    go(small, wide, jobs_dir=sshds["work_dir"])
    assert wait_state(small, ENDED).state == State.SUCCEEDED
    assert wait_state(wide, ENDED).state == State.SUCCEEDED


@pytest.mark.skipif(not sshd.available(), reason="needs Debian's openssh-server (/usr/sbin/sshd)")
@pytest.mark.parametrize("behaviour, words", [
    ("fail", "nvidia-smi failed (exit code 9): Failed to initialize NVML: Driver/library version mismatch"),
    ("garbage", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"),
    ("hang", "nvidia-smi did not answer within"),
])
def test_an_instance_whose_nvidia_smi_is_broken_is_unhealthy_with_its_output(sshds, tmp_path, db, behaviour, words):  # noqa: F811
    instance = gpu_instance(sshds, tmp_path, "gpu-a", "127.0.0.2", [A100] * 2, behaviour=behaviour)
    healthy, reason = instances.check(instance)
    assert not healthy and words in reason, reason
    stored = Instance.objects.get(pk=instance.pk)
    assert not stored.healthy and words in stored.health_reason and stored.gpu_inventory == []
