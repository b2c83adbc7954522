"""Where a job's slots go: as few instances as possible, only healthy and enabled ones, and the
reason when it does not fit. Slots are freed by the state machine whichever way a job ends."""
import pytest

from jobs.domain import states
from jobs.backends.instances import Pool
from jobs.models import Instance, Job, SlotAllocation, State

pytestmark = pytest.mark.django_db


def instance(name, gpus, healthy=True, enabled=True):
    return Instance.objects.create(name=name, host=f"{name}.example", user="u", gpus=gpus, healthy=healthy,
                                   enabled=enabled)


def placed(gpus):
    placement, reason = Pool().place(gpus)
    return ([(i.name, n) for i, n in placement] if placement else None), reason


def test_a_job_that_fits_on_one_instance_goes_to_the_tightest_one():
    instance("a", 8), instance("b", 4), instance("c", 2)
    assert placed(4) == ([("b", 4)], None)
    assert placed(2) == ([("c", 2)], None)
    assert placed(8) == ([("a", 8)], None)


def test_a_larger_job_spans_the_fewest_instances():
    instance("a", 4), instance("b", 4), instance("c", 2), instance("d", 1)
    assert placed(9) == ([("a", 4), ("b", 4), ("c", 1)], None)


def test_unhealthy_and_disabled_instances_get_nothing_and_the_reason_says_what_is_free():
    instance("a", 4), instance("sick", 8, healthy=False), instance("off", 8, enabled=False)
    assert placed(8) == (None, "waiting for instances: needs 8 GPUs, largest free block 4 "
                               "(4 free on 1 of 1 healthy instances)")


def test_no_healthy_instance():
    instance("sick", 8, healthy=False)
    assert placed(1) == (None, "waiting for instances: needs 1 GPUs, no healthy enabled instance")


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
