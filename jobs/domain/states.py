"""The job state machine: the one place where a job's state changes.

    QUEUED -> LAUNCHING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED
    QUEUED | LAUNCHING -> CANCELLED,  QUEUED | LAUNCHING -> FAILED (launch trouble)
    RUNNING -> LAUNCHING: the cluster's queue (Kueue) preempted or evicted the running job; it
        waits there, launched, and runs again (LAUNCHING -> RUNNING) once re-admitted
    LAUNCHING | RUNNING -> QUEUED: its attempt failed with a cause its recovery policy restarts
        (restart(), never transition()); the scheduler admits its next attempt

Each admission starts an attempt (JobAttempt): made at QUEUED -> LAUNCHING, started at RUNNING,
ended (exit code, reason, GPU-seconds) when the job ends or restarts.

transition() locks the job row, checks the move, saves the job and records a JobEvent in the
same transaction, and tells live viewers once the transaction commits.

This module is also the one writer of what a job says about itself while its state stays: its
reason, its events (submitted, held, cancel requested, ...), and their announcements.
"""
from django.db import transaction
from django.utils import timezone

from jobs import backends
from jobs.backends.waits import Wait
from jobs.domain import accounting
from jobs.domain.live import publish_state, publish_states
from jobs.models import Job, JobAttempt, JobEvent, State

ALLOWED = {
    State.QUEUED: {State.LAUNCHING, State.CANCELLED, State.FAILED},
    State.LAUNCHING: {State.RUNNING, State.CANCELLED, State.FAILED, State.SUCCEEDED, State.QUEUED},
    State.RUNNING: {State.SUCCEEDED, State.FAILED, State.CANCELLED, State.LAUNCHING, State.QUEUED},
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
        if not can_transition(job.state, target) or target == State.QUEUED:   # QUEUED: restart()
            raise IllegalTransition(job, target)
        now = timezone.now()
        requeued = job.state == State.RUNNING and target == State.LAUNCHING
        admitted = job.state == State.QUEUED and target == State.LAUNCHING
        job.state = target
        for name, value in fields.items():
            setattr(job, name, value)
        if target == State.LAUNCHING and job.size is None:
            job.size = job.gpus               # admitted at its minimum; an elastic job may grow
        if target == State.RUNNING and job.started_at is None:
            job.started_at = now
        if target in (State.SUCCEEDED, State.FAILED, State.CANCELLED):
            job.finished_at = now
            # The one place what a job holds is freed: whichever way it ended, in this transaction.
            _release(job)
            if job.started_at and "gpu_seconds" not in fields:
                job.gpu_seconds = accounting.job_gpu_seconds(job, now)
        job.waits_for = ""
        if "reason" not in fields:
            job.reason = ""
        job.save()
        if admitted:
            JobAttempt.objects.get_or_create(job=job, number=job.attempt, defaults={"first_seq": job.next_seq})
        elif target == State.RUNNING:
            JobAttempt.objects.filter(job=job, number=job.attempt, started__isnull=True).update(started=now)
        elif job.is_terminal:
            _end_attempt(job, now, job.gpu_seconds, job.exit_code, job.reason or message)
        # The size it runs at from here: where GPU-seconds of an elastic job start counting, and
        # stop while a requeued job waits (0: it holds no GPUs of the cluster).
        size = job.size if target == State.RUNNING else (0 if requeued else None)
        JobEvent.objects.create(job=job, state=target, message=message or fields.get("reason", ""), gpus=size)
        transaction.on_commit(lambda: _announce(job))
    return job


def restart(job_id, *, reason, exit_code=None, message, restart_after=None, checkpoint=None):
    """End the active job's current attempt (it failed with `exit_code` and `reason`) and queue
    its next one: what it holds is freed, its output is followed afresh from the next attempt's
    (the log's seq carries on), and the scheduler admits it once `restart_after` has passed.
    `checkpoint`: its own newest checkpoint, the next attempt's RINGMASTER_CHECKPOINT (None:
    it starts as the first did). Returns the job, or None where it was not active any more."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state not in (State.LAUNCHING, State.RUNNING):
            return None
        now = timezone.now()
        _end_attempt(job, now, accounting.job_gpu_seconds(job, now), exit_code, reason)
        _release(job)
        job.state = State.QUEUED
        job.attempt += 1
        job.restart_after = restart_after
        job.size = None                         # admitted again at its minimum
        if checkpoint is not None:
            job.checkpoint, job.checkpoint_own = checkpoint, True
        # What a follow of the ended attempt found: the next one's follow starts from nothing.
        job.exit_code = job.failed_rank = None
        job.output_offset, job.output_state, job.follow_cursor = 0, {}, {}
        job.follower, job.follower_heartbeat = "", None
        wait = Wait("restart", attempt=job.attempt, at=restart_after) if restart_after else Wait("scheduler")
        job.reason, job.waits_for = wait.words, wait.kind
        job.save()
        # GPUs 0: it holds none while it waits (accounting counts nothing until it runs again).
        JobEvent.objects.create(job=job, state=State.QUEUED, message=message, gpus=0)
        transaction.on_commit(lambda: _announce(job))
    return job


def _end_attempt(job, now, job_gpu_seconds, exit_code, reason):
    """Record the end of the job's current attempt: its GPU-seconds are what the job used beyond
    its earlier attempts'."""
    earlier = sum(JobAttempt.objects.filter(job=job, number__lt=job.attempt).values_list("gpu_seconds", flat=True))
    JobAttempt.objects.filter(job=job, number=job.attempt, ended__isnull=True).update(
        ended=now, exit_code=exit_code, reason=(reason or "")[:500], gpu_seconds=max(0.0, job_gpu_seconds - earlier))


def resize(job_id, size, message):
    """An admitted elastic job now holds `size` GPUs (the scheduler decided, under its lock):
    stored with the event that says why, which also dates the change for accounting."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state not in (State.LAUNCHING, State.RUNNING) or job.size == size:
            return None
        job.size = size
        job.resized_at = timezone.now()
        job.save(update_fields=["size", "resized_at"])
        JobEvent.objects.create(job=job, message=message, gpus=size)
        transaction.on_commit(lambda: _announce(job))
    return job


def set_reason(job_id, reason, place=""):
    """Change the reason of a job that stays in its state (e.g. why it is still queued), shown
    with its `place` in the cluster's queue. An event records each new reason; a new place
    alone (the queue moving up) records none."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        shown = (reason + place)[:500]
        if job.reason == shown:
            return job
        job.reason = shown
        job.save(update_fields=["reason"])
        last = JobEvent.objects.filter(job=job).order_by("-id").values_list("message", flat=True).first()
        if not place or last != reason:
            JobEvent.objects.create(job=job, message=reason)
        transaction.on_commit(lambda: _announce(job))
    return job


def note(job_id, message):
    """Record something the job's owner should know that changes neither its state nor its reason."""
    JobEvent.objects.create(job_id=job_id, message=message)


def _release(job):
    try:
        backend = backends.of(job)
    except backends.UnknownBackend:   # a backend no longer enabled holds nothing here
        return
    backend.release(job.pk)


def submitted(job, by):
    """Record a new QUEUED job's first event (in the transaction that created it)."""
    JobEvent.objects.create(job=job, state=State.QUEUED, message=f"submitted by {by.get_username()}")


class NotQueued(Exception):
    pass


def change_queued(job_id, message, **fields):
    """Change a queued job's scheduling fields (held, priority, ...) and record why."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state != State.QUEUED:
            raise NotQueued(f"job {job_id} is not queued ({job.state.lower()})")
        for name, value in fields.items():
            setattr(job, name, value)
        job.save(update_fields=list(fields))
        JobEvent.objects.create(job=job, message=message)
        transaction.on_commit(lambda: _announce(job))
    return job


def request_cancel(job, message):
    """Mark a locked, active job for stopping (once); returns whether it was newly marked."""
    if job.cancel_requested:
        return False
    job.cancel_requested = True
    job.save(update_fields=["cancel_requested"])
    JobEvent.objects.create(job=job, message=message)
    return True


def set_queue_reasons(waits, waited_for):
    """Store why still-queued jobs wait ({id: Wait}) in a few statements, and tell live viewers.

    A job's events record what it waits for (Wait.kind: quota, capacity, held, ...) when that
    changes from what it waited for before (`waited_for`: {id: its Job.waits_for}), not every
    change of the numbers or of the job it waits behind, so a job that waits for a day does not
    collect thousands of events.
    """
    by_fields = {}
    for pk, wait in waits.items():
        by_fields.setdefault((wait.words, wait.kind), []).append(pk)
    for (reason, kind), ids in by_fields.items():
        for start in range(0, len(ids), 1000):
            Job.objects.filter(pk__in=ids[start:start + 1000], state=State.QUEUED).update(reason=reason,
                                                                                         waits_for=kind)
    JobEvent.objects.bulk_create(
        [JobEvent(job_id=pk, message=wait.words) for pk, wait in waits.items() if wait.kind != waited_for[pk]],
        batch_size=1000,
    )
    announced = [_Announced(pk, State.QUEUED, wait.words) for pk, wait in waits.items()]
    if announced:
        transaction.on_commit(lambda: publish_states(announced))


class _Announced:
    """What live viewers are told about a job (its id, state and reason)."""

    def __init__(self, pk, state, reason):
        self.pk, self.state, self.reason = pk, state, reason


def _announce(job):
    publish_state(job)
