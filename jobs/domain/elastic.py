"""Elastic jobs: when the scheduler grows a running job into idle GPUs, and shrinks one so a
waiting job can start. The one place for these rules; jobs.domain.scheduler.admit() calls them
under its lock, in the same pass that admits queued jobs.

- An elastic job (Job.max_gpus set) is admitted at its minimum (Job.gpus), like any job, and
  is resized only once it has settled: run RINGMASTER_ELASTIC_SETTLE_SECONDS since it started
  and since its last resize. Horovod ignores a change that comes before its ranks are up, and
  one that comes while a reset is under way (a growth's new ranks still starting) can leave the
  ranks each waiting on the others for ever (Horovod issue #3494, which the rank launcher
  runners/job_python/ringmaster_rank.py also works around).
- **Shrink**: a queued job that does not fit its backend's free capacity takes GPUs from running
  elastic jobs whose GPUs it could use (Admission.shares_capacity) whose priority is not higher than its own (lowest priority
  first, then the newest), never below their minimum, if that frees enough for it.
- **Grow**: after the queue pass, a running elastic job takes the free GPUs of its backend, up to
  its maximum, unless a queued job waits for one of the job's quota scopes; its quotas (GPUs at
  once, per job, GPU-hours) hold at every size. A job admitted in the same pass grows too,
  before it is launched: one that finds GPUs free starts at its largest size, with no resize
  for Horovod to miss while its ranks start.
- **Lend**: free GPUs that a queued job reserved but cannot use yet (it needs more than are
  free) are grown into too, by jobs whose priority is not higher than the queued job's: that
  job shrinks them (the first rule) as soon as what is free and what was lent hold it, so the
  GPUs work meanwhile instead of waiting idle for the rest. The event says so ("... until job
  812 can start"). A job of higher priority does not borrow: the queued job could not take
  the GPUs back.

A backend may keep a job at its size (Admission.fixed_size: Kueue's jobs on Kubernetes), which
the job's first event says.

What changes is Job.size, with an event that says why (jobs.domain.states.resize), and the
backend's record of what the job holds (Admission.resize). The job's follower sees the new size
and tells the runner (runners.base.Runner.resize), which changes what Horovod's host discovery
prints; Horovod adds or stops ranks at the script's next commit.
"""
from dataclasses import replace
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from jobs.backends.base import QUEUED_JOB_FIELDS, QueuedJob
from jobs.backends.waits import gpu_count
from jobs.domain import states
from jobs.models import Job, State

def _running(settled=True, **filters):
    """Running elastic jobs; `settled`: only those Horovod can resize now (settled_since())."""
    jobs = Job.objects.filter(state=State.RUNNING, cancel_requested=False, max_gpus__isnull=False, **filters)
    if settled:
        since = settled_since()
        jobs = jobs.filter(Q(resized_at__isnull=True) | Q(resized_at__lte=since), started_at__lte=since)
    rows = jobs.values_list(*QUEUED_JOB_FIELDS)
    return [QueuedJob(*row) for row in rows]


def _launching(ids):
    rows = (Job.objects.filter(pk__in=list(ids), state=State.LAUNCHING, max_gpus__isnull=False)
            .values_list(*QUEUED_JOB_FIELDS))
    return [QueuedJob(*row) for row in rows]


def settled_since():
    """Jobs started (and last resized) before this have run RINGMASTER_ELASTIC_SETTLE_SECONDS at
    that size: their ranks are up, so Horovod acts on a change of hosts (one it sees before rank 0
    is ready it drops for good; one during a reset may hang the job)."""
    return timezone.now() - timedelta(seconds=settings.RINGMASTER_ELASTIC_SETTLE_SECONDS)


def make_room(admission, book, job):
    """Shrink running elastic jobs so `job` (queued, waiting for capacity) fits; whether it did."""
    room = admission.room(job)
    if room is None:
        return False
    missing = job.gpus - room
    candidates = sorted((other for other in _running(backend=job.backend, priority__lte=job.priority)
                         if other.gpus_in_use > other.gpus and admission.shares_capacity(job, other)
                         and not admission.fixed_size(other)),
                        key=lambda other: (other.priority, -other.pk))
    if missing <= 0 or sum(other.gpus_in_use - other.gpus for other in candidates) < missing:
        return False
    for other in candidates:
        if missing <= 0:
            break
        step = admission.step(other)
        give = min(other.gpus_in_use - other.gpus, -(-missing // step) * step)
        _resize(admission, book, other, other.gpus_in_use - give, f"shrank to {gpu_count(other.gpus_in_use - give)} for job {job.pk}")
        missing = job.gpus - admission.room(job)
    return missing <= 0


def grow(admission_of, book, reserved, fresh=()):
    """Grow running elastic jobs, and those admitted in this pass (`fresh` ids: not launched
    yet, so they start at the size they get), into free GPUs: those no queued job reserved, and
    those lent by a queued job that can take them back (`reserved`: constraint key -> the first
    QueuedJob waiting on it). Returns their ids."""
    grown = []
    candidates = _running() + _launching(fresh)
    jobs = sorted((job for job in candidates if job.gpus_in_use < job.max_gpus), key=lambda job: (-job.priority, job.pk))
    for job in jobs:
        admission = admission_of(job.backend)
        fixed = admission.fixed_size(job)
        if fixed:
            if job.pk in fresh:
                states.note(job.pk, f"runs at {gpu_count(job.gpus_in_use)}, its minimum, {fixed}")
            continue
        constraints = book.constraints(job.owner_id, job.owner, job.group_id, job.group, job.backend)
        waiting = reserved.get(admission.capacity_key(job))
        if waiting is not None and waiting.priority < job.priority:
            continue                                     # it could not take the GPUs back
        if any(scope.key in reserved for scope, _ in constraints):
            continue
        more = min(room for room in (job.max_gpus - job.gpus_in_use, admission.room(job),
                                     book.growth_room(constraints, job.gpus_in_use)) if room is not None)
        more -= more % admission.step(job)
        if more > 0:
            lent = f", until job {waiting.pk} can start" if waiting is not None else ""
            _resize(admission, book, job, job.gpus_in_use + more,
                    lambda: f"grew to {gpu_count(job.gpus_in_use + more)}: {gpu_count(more)} free {admission.where(job)}{lent}",
                    constraints)
            grown.append(job.pk)
    return grown


def drop_lost_hosts(admission_of, book):
    """Running elastic jobs go on without hosts their backend lost (Admission.lost), when what is
    left holds their minimum; a job left below it keeps the host and says it waits for it."""
    for job in _running(settled=False):
        admission = admission_of(job.backend)
        for name, why, held in admission.lost(job):
            constraints = book.constraints(job.owner_id, job.owner, job.group_id, job.group, job.backend)
            if job.gpus_in_use - held < job.gpus:
                states.set_reason(job.pk, f"lost {name} ({why}): {gpu_count(job.gpus_in_use - held)} left, fewer than the "
                                          f"{job.gpus} the job needs; Horovod waits for hosts to come back")
                continue
            admission.drop(job, name)
            size = job.gpus_in_use - held
            book.resize(constraints, -held, job.backend)
            states.resize(job.pk, size, f"lost {name} ({why}): continuing on {gpu_count(size)}")
            job = replace(job, size=size)


def _resize(admission, book, job, size, message, constraints=None):
    """`message`: a string, or a function that says it once the backend has placed the change."""
    if constraints is None:
        constraints = book.constraints(job.owner_id, job.owner, job.group_id, job.group, job.backend)
    admission.resize(job, size)
    book.resize(constraints, size - job.gpus_in_use, job.backend)
    states.resize(job.pk, size, message() if callable(message) else message)
