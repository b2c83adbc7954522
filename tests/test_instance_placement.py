"""Where a job's slots go: as few instances as possible, only healthy and enabled ones, and the
reason when it does not fit. Slots are freed by the state machine whichever way a job ends."""
import pytest

from jobs.domain import states
from jobs.backends.instances.backend import Pool
from jobs.backends.instances.models import Instance
from jobs.models import Job, SlotAllocation, State

pytestmark = pytest.mark.django_db


def instance(name, gpus, healthy=True, enabled=True, models=None, reason="not checked yet"):
    """An instance; `models`: the names nvidia-smi gave its GPUs, index by index (None: no nvidia-smi)."""
    inventory = [{"index": i, "uuid": f"GPU-{name}-{i}", "name": model, "memory_mib": 81920}
                 for i, model in enumerate(models or [])]
    return Instance.objects.create(name=name, host=f"{name}.example", user="u", gpus=gpus, healthy=healthy,
                                   enabled=enabled, gpu_inventory=inventory, health_reason=reason)


def placed(gpus, model=""):
    """(placement as [(instance name, slots)] or None, the words of the wait or None)."""
    placement, wait = Pool().place(gpus, model)
    return ([(i.name, n) for i, n in placement] if placement else None), (wait.words if wait else None)


def test_a_job_that_fits_on_one_instance_goes_to_the_tightest_one():
    instance("a", 8), instance("b", 4), instance("c", 2)
    assert placed(4) == ([("b", 4)], None)
    assert placed(2) == ([("c", 2)], None)
    assert placed(8) == ([("a", 8)], None)


def test_a_larger_job_spans_the_fewest_instances():
    instance("a", 4), instance("b", 4), instance("c", 2), instance("d", 1)
    assert placed(9) == ([("a", 4), ("b", 4), ("c", 1)], None)


def test_unhealthy_and_disabled_instances_get_nothing_and_the_reason_names_the_one_that_is_down():
    instance("a", 4), instance("off", 8, enabled=False)
    instance("sick", 8, healthy=False, reason="instance sick (u@sick.example:22): cannot reach the host: Connection refused")
    assert placed(8) == (None, "waiting for instances: needs 8 GPUs, largest free block 4 "
                               "(4 free on 1 of 1 healthy instances); not healthy: sick (instance sick "
                               "(u@sick.example:22): cannot reach the host: Connection refused)")


def test_no_healthy_instance():
    instance("sick", 8, healthy=False)
    assert placed(1) == (None, "waiting for instances: needs 1 GPU, no healthy enabled instance; "
                               "not healthy: sick (not checked yet)")


def test_allocated_slots_are_not_free_and_are_freed_when_the_job_ends(make_user, image):
    a = instance("a", 4)
    job = Job.objects.create(owner=make_user(), image=image, gpus=3, script_path="x.py", backend="instances",
                             time_limit_minutes=5, state=State.RUNNING)
    pool = Pool()
    pool.allocate(job.pk, [(a, 3)])
    assert placed(2)[1] == "waiting for instances: needs 2 GPUs, largest free block 1 (1 free on 1 of 1 healthy instances)"
    states.transition(job.pk, State.FAILED, reason="boom")
    assert not SlotAllocation.objects.exists()
    assert placed(4) == ([("a", 4)], None)


def allocation_of(job):
    names = dict(Instance.objects.values_list("pk", "name"))
    return [(names[a.host_id], a.slots, a.gpu_indices) for a in SlotAllocation.objects.filter(job=job)]


def running_job(owner, image, gpus, model=""):
    return Job.objects.create(owner=owner, image=image, gpus=gpus, script_path="x.py", backend="instances",
                              time_limit_minutes=5, state=State.RUNNING, gpu_model=model)


def test_jobs_on_one_instance_own_disjoint_gpu_indices_and_freed_ones_are_given_again(make_user, image):
    a = instance("a", 4, models=["NVIDIA A100-SXM4-80GB"] * 4)
    owner = make_user()
    first, second, third = (running_job(owner, image, 2) for _ in range(3))
    for job in (first, second):
        pool = Pool()
        pool.allocate(job.pk, pool.place(2)[0])
    assert allocation_of(first) == [("a", 2, [0, 1])]
    assert allocation_of(second) == [("a", 2, [2, 3])]
    assert placed(2)[0] is None
    states.transition(first.pk, State.SUCCEEDED)
    pool = Pool()
    pool.allocate(third.pk, pool.place(2)[0])
    assert allocation_of(third) == [("a", 2, [0, 1])]
    assert SlotAllocation.objects.filter(host_id=a.pk).count() == 2


def test_an_instance_offers_only_as_many_gpus_as_it_is_set_to(make_user, image):
    instance("a", 2, models=["NVIDIA H100 80GB HBM3"] * 8)
    job = running_job(make_user(), image, 2)
    pool = Pool()
    assert pool.capacity() == 2
    pool.allocate(job.pk, pool.place(2)[0])
    assert allocation_of(job) == [("a", 2, [0, 1])]


def test_a_job_asking_for_a_gpu_model_goes_only_where_that_model_is_free(make_user, image):
    instance("t4", 4, models=["Tesla T4"] * 4)
    instance("mixed", 4, models=["Tesla T4", "NVIDIA A100-SXM4-40GB", "Tesla T4", "NVIDIA A100-SXM4-40GB"])
    job = running_job(make_user(), image, 2, model="a100")
    pool = Pool()
    placement, _ = pool.place(2, "a100")
    pool.allocate(job.pk, placement, "a100")
    assert allocation_of(job) == [("mixed", 2, [1, 3])]
    assert placed(1, "A100") == (None, "waiting for instances: needs 1 A100 GPU, largest free block 0 "
                                       "(0 free on 0 of 2 healthy instances)")
    assert placed(1, "V100") == (None, "waiting for instances: needs 1 V100 GPU, no healthy instance has V100 "
                                       "GPUs (models: NVIDIA A100-SXM4-40GB, Tesla T4)")
    assert placed(4) == ([("t4", 4)], None)


def test_an_instance_without_nvidia_smi_offers_cpu_slots_without_indices(make_user, image):
    instance("cpu", 4)
    job = running_job(make_user(), image, 3)
    pool = Pool()
    pool.allocate(job.pk, pool.place(3)[0])
    assert allocation_of(job) == [("cpu", 3, [])]
    assert placed(2)[1].startswith("waiting for instances: needs 2 GPUs, largest free block 1")


def test_reconcile_frees_an_allocation_that_outlived_its_job(make_user, image):
    from jobs.domain import scheduler

    instance("a", 2, models=["Tesla T4"] * 2)
    job = running_job(make_user(), image, 2)
    pool = Pool()
    pool.allocate(job.pk, pool.place(2)[0])
    Job.objects.filter(pk=job.pk).update(state=State.FAILED)     # ended behind the state machine's back
    assert placed(1)[0] is None
    assert scheduler.release_leftovers() == [job.pk]
    assert placed(2) == ([("a", 2)], None)


def test_the_admin_and_the_staff_cluster_page_show_each_instances_gpus_and_which_a_job_holds(
        client, make_user, image):
    staff = make_user("root", is_staff=True, is_superuser=True)
    a = instance("gpu-a", 2, models=["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"], reason="ok: 2 GPUs")
    instance("gpu-b", 1, healthy=False, reason="cannot reach the host: Connection refused")
    job = Job.objects.create(owner=staff, image=image, gpus=1, script_path="x.py", backend="instances",
                             time_limit_minutes=5, state=State.RUNNING)
    SlotAllocation.objects.create(job=job, host_id=a.pk, slots=1, position=0, gpu_indices=[1])
    client.force_login(staff)

    page = client.get("/capacity/").content.decode()
    row_a = page[page.index('data-instance="gpu-a"'):page.index('data-instance="gpu-b"')]
    assert '0: NVIDIA A100-SXM4-80GB, 81920 MiB</span>' in row_a
    assert '1: NVIDIA A100-SXM4-80GB, 81920 MiB (in use)</span>' in row_a
    row_b = page[page.index('data-instance="gpu-b"'):]
    assert "unhealthy" in row_b and "Connection refused" in row_b and "not checked yet" in row_b

    listing = client.get("/admin/instances/instance/").content.decode()
    assert "2 × NVIDIA A100-SXM4-80GB (81920 MiB)" in listing
    change = client.get(f"/admin/instances/instance/{a.pk}/change/").content.decode()
    assert "0: NVIDIA A100-SXM4-80GB, 81920 MiB <small>GPU-gpu-a-0</small>" in change
    assert "1: NVIDIA A100-SXM4-80GB, 81920 MiB (in use) <small>GPU-gpu-a-1</small>" in change


def test_a_job_larger_than_all_the_instances_together_is_refused_naming_them(api_client, alice, image):
    instance("gpu-a", 8), instance("gpu-b", 8, healthy=False), instance("off", 64, enabled=False)
    client = api_client(alice)
    body = {"image": image.name, "script_path": "x.py", "backend": "instances"}
    response = client.post("/api/jobs/", {**body, "gpus": 17}, format="json")
    assert response.status_code == 400
    assert response.json() == {"gpus": ["The GPU instances hold 16 GPUs in all (gpu-a: 8, gpu-b: 8); "
                                        "a job cannot ask for more."]}
    response = client.post("/api/jobs/", {**body, "gpus": 16}, format="json")      # waits for gpu-b
    assert response.status_code == 201, response.json()


def test_with_no_instance_the_backend_is_not_offered_and_the_api_says_what_an_admin_must_add(
        api_client, client, alice, image):
    body = {"image": image.name, "script_path": "x.py", "gpus": 1, "backend": "instances"}
    api = api_client(alice)
    response = api.post("/api/jobs/", body, format="json")
    assert response.status_code == 400
    assert response.json() == {"backend": ["No GPU instance is registered (or enabled): an admin adds one with "
                                           "manage.py add_instance, or in the admin under Instances."]}
    client.force_login(alice)
    assert 'value="instances"' not in client.get("/jobs/new/").content.decode()
    instance("gpu-a", 2, enabled=False)                                   # a disabled one is not one either
    assert api.post("/api/jobs/", body, format="json").status_code == 400
    instance("gpu-b", 2)
    assert 'value="instances"' in client.get("/jobs/new/").content.decode()
    assert api.post("/api/jobs/", body, format="json").status_code == 201
