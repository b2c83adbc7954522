"""The state machine is the only way a state changes; admission never exceeds capacity."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.domain import scheduler, states
from jobs.models import Job, JobEvent, Script, State
from tests.conftest import admit_from_threads

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(make_user, image):
    owner = make_user("alice")
    script = Script.objects.create(owner=owner, name="t.py", sha256="0" * 64, size=1, content="x")
    return Job.objects.create(owner=owner, image=image, gpus=2, script=script, time_limit_minutes=5)


def test_the_happy_path_records_an_event_per_state(job):
    for target in (State.LAUNCHING, State.RUNNING):
        states.transition(job.pk, target)
    assert Job.objects.get(pk=job.pk).started_at is not None
    before = timezone.now()
    Job.objects.filter(pk=job.pk).update(started_at=before - timedelta(minutes=90))   # ran 90 minutes
    states.transition(job.pk, State.SUCCEEDED)
    late = (timezone.now() - before).total_seconds()           # how long the end took, by the test's clock
    job.refresh_from_db()
    assert job.state == State.SUCCEEDED and before <= job.finished_at <= before + timedelta(seconds=late)
    assert 10800 <= job.gpu_seconds <= 10800 + 2 * late          # 2 GPUs x 90 min = 10,800 GPU-seconds
    assert list(JobEvent.objects.filter(job=job).values_list("state", flat=True)) == [
        "LAUNCHING", "RUNNING", "SUCCEEDED"]


@pytest.mark.parametrize("path, illegal", [
    ([], State.RUNNING),
    ([], State.SUCCEEDED),
    ([State.LAUNCHING, State.RUNNING], State.QUEUED),
    ([State.LAUNCHING, State.RUNNING, State.SUCCEEDED], State.FAILED),
    ([State.CANCELLED], State.LAUNCHING),
])
def test_illegal_transitions_raise_and_change_nothing(job, path, illegal):
    for target in path:
        states.transition(job.pk, target)
    before = Job.objects.get(pk=job.pk).state
    with pytest.raises(states.IllegalTransition):
        states.transition(job.pk, illegal)
    assert Job.objects.get(pk=job.pk).state == before


def test_expect_makes_a_racing_second_finish_harmless(job):
    states.transition(job.pk, State.LAUNCHING)
    states.transition(job.pk, State.RUNNING)
    assert states.transition(job.pk, State.CANCELLED, expect={State.RUNNING}) is not None
    assert states.transition(job.pk, State.FAILED, expect={State.RUNNING}) is None
    assert Job.objects.get(pk=job.pk).state == State.CANCELLED


def test_transition_refuses_fields_outside_its_remit(job):
    with pytest.raises(TypeError):
        states.transition(job.pk, State.LAUNCHING, owner_id=99)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("row_locks")
def test_concurrent_admission_never_exceeds_capacity(make_user, image, settings):
    """Eight schedulers at once, on PostgreSQL: the local slots are never overbooked."""
    settings.RINGMASTER_LOCAL_GPUS = 4
    owner = make_user("alice")
    script = Script.objects.create(owner=owner, name="t.py", sha256="0" * 64, size=1, content="x")
    for _ in range(6):
        Job.objects.create(owner=owner, image=image, gpus=2, script=script, time_limit_minutes=5)

    admitted, errors = admit_from_threads(8)
    assert not errors
    jobs = list(Job.objects.order_by("created_at", "id"))
    assert sorted(admitted) == [jobs[0].pk, jobs[1].pk]                     # 2 x 2 GPUs = 4, oldest first
    waiting = Job.objects.filter(state=State.QUEUED).order_by("created_at", "id")
    assert waiting.count() == 4
    assert waiting[0].reason == "waiting for capacity: 4 of 4 GPUs in use, this job needs 2"
    assert waiting[1].reason == "waiting behind an earlier job for capacity (local)"
    assert [scheduler.queue_position(j) for j in waiting] == [1, 2, 3, 4]
