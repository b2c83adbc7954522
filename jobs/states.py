"""The job state machine: the one place where a job's state changes.

    QUEUED -> LAUNCHING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED
    QUEUED | LAUNCHING -> CANCELLED,  QUEUED | LAUNCHING -> FAILED (launch trouble)

transition() locks the job row, checks the move, saves the job and records a JobEvent in the
same transaction, and tells live viewers once the transaction commits.
"""
from django.db import transaction
from django.utils import timezone

from .models import Job, JobEvent, SlotAllocation, State

ALLOWED = {
    State.QUEUED: {State.LAUNCHING, State.CANCELLED, State.FAILED},
    State.LAUNCHING: {State.RUNNING, State.CANCELLED, State.FAILED, State.SUCCEEDED},
    State.RUNNING: {State.SUCCEEDED, State.FAILED, State.CANCELLED},
    State.SUCCEEDED: set(),
    State.FAILED: set(),
    State.CANCELLED: set(),
}
# LAUNCHING -> SUCCEEDED: a job so short that its end is seen before its start was recorded.

# Fields a transition may set along with the state.
_SETTABLE = {"reason", "exit_code", "failed_rank", "gpu_seconds"}


class IllegalTransition(Exception):
    def __init__(self, job, target):
        super().__init__(f"job {job.pk}: {job.state} -> {target} is not allowed")
        self.job, self.target = job, target


def can_transition(current, target):
    return target in ALLOWED[State(current)]


def transition(job_id, target, *, message="", expect=None, **fields):
    """Move job `job_id` to `target`; return the saved Job.

    `expect` (a set of states): if the job's current state is not in it, nothing changes and
    None is returned. This is how two processes racing to finish one job stay harmless.
    Any other illegal move raises IllegalTransition.
    """
    unknown = set(fields) - _SETTABLE
    if unknown:
        raise TypeError(f"transition() cannot set {sorted(unknown)}")
    target = State(target)
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if expect is not None and job.state not in expect:
            return None
        if not can_transition(job.state, target):
            raise IllegalTransition(job, target)
        now = timezone.now()
        job.state = target
        for name, value in fields.items():
            setattr(job, name, value)
        if target == State.RUNNING and job.started_at is None:
            job.started_at = now
        if target in (State.SUCCEEDED, State.FAILED, State.CANCELLED):
            job.finished_at = now
            # The one place slots are freed: whichever way the job ended, in this transaction.
            SlotAllocation.objects.filter(job_id=job_id).delete()
            if job.started_at and "gpu_seconds" not in fields:
                job.gpu_seconds = (now - job.started_at).total_seconds() * job.gpus
        if target != State.QUEUED and "reason" not in fields:
            job.reason = ""
        job.save()
        JobEvent.objects.create(job=job, state=target, message=message or fields.get("reason", ""))
        transaction.on_commit(lambda: _announce(job))
    return job


def set_reason(job_id, reason):
    """Change the reason of a job that stays in its state (e.g. why it is still queued)."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.reason == reason:
            return job
        job.reason = reason
        job.save(update_fields=["reason"])
        JobEvent.objects.create(job=job, message=reason)
        transaction.on_commit(lambda: _announce(job))
    return job


def _announce(job):
    from .live import publish_state

    publish_state(job)
