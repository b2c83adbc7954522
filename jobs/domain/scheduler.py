"""The scheduler: admission of queued jobs, queue positions, and reconcile after a crash.

admit() is the one place where admission rules live; each backend answers for its own capacity
(jobs.backends.base.Admission), quotas for the user's and group's limits (jobs.domain.quotas).
"""
import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Case, ExpressionWrapper, F, Func, IntegerField, OuterRef, Q, Subquery, When
from django.utils import timezone

from jobs import backends, taskqueue
from jobs.backends.base import QUEUED_JOB_FIELDS, QueuedJob
from jobs.backends.waits import Wait
from jobs.domain import elastic, follow, quotas, states
from jobs.models import TERMINAL_STATES, Job, SchedulerLock, State

log = logging.getLogger(__name__)


def _lock_scheduler():
    """Serialise admission decisions across every web and worker process."""
    SchedulerLock.objects.get_or_create(pk=1)
    return SchedulerLock.objects.select_for_update().get(pk=1)


def admit():
    """Admit the queued jobs that fit, as quotas and capacity allow. Returns the admitted ids.

    It runs under the scheduler's row lock (one decision at a time across every process, so no
    quota or capacity is ever overbooked, even under races), on submit and whenever a job ends
    (the `dispatch` task), and from beat.

    Order: higher `priority` first, then earlier submission. Each job, in that order:

    1. held by an admin: stays queued ("held by <admin>"), holds nothing back; so does a
       restarted job until its backoff is over (jobs.domain.recovery);
    2. can never fit its limits (e.g. more GPUs than its per-job limit, after a quota was
       lowered): stays queued and says so, holds nothing back;
    3. shares a quota scope (its user, its group, per backend) with an earlier job that is
       waiting on that scope: waits behind it;
    4. would break a quota of one of its scopes: waits with the reason ("waiting for quota:
       group vision: 14 of 16 GPUs in use, needs 4") and *reserves* those scopes;
    5. does not fit its backend's free capacity: waits ("waiting for capacity: ...") and
       reserves that capacity, or waits behind the job that reserved it;
    6. otherwise it is admitted (LAUNCHING) and its GPUs count at once.

    Why a job waits is a Wait (jobs.backends.waits): its words become the job's reason, and a
    change of its kind (quota, capacity, held, ...) an event (states.set_queue_reasons).

    Elastic jobs (jobs.domain.elastic): in step 5 a job that does not fit first shrinks running
    elastic jobs of no higher priority, if that makes it fit; after the pass, running elastic
    jobs grow into what is free: into capacity a waiting job reserved only when that job can
    take it back (their priority is not higher than its own), so GPUs the job cannot use yet
    are lent, not left idle.

    Why: head-of-line blocking happens only within one constraint. A job blocked by its own
    user's or group's quota never holds back anybody else's job that fits (alice over her quota
    does not stop bob), and never reserves capacity. But within one constraint the queue order
    holds: the first job that does not fit reserves that constraint, so a large job is not
    starved by a stream of smaller jobs behind it that would each fit in what is left (no
    backfill; that would need trustworthy run-time estimates). The cost is that GPUs can stay
    idle while a large job at the head waits for enough of them; admins can reprioritise or
    hold jobs to change that. Once a GPU-hour window is used up, every job of that scope waits
    until old usage leaves the window (running jobs are not stopped).
    """
    admitted, waits, waited_for = [], {}, {}
    with transaction.atomic():
        _lock_scheduler()
        book = quotas.QuotaBook()
        reserved = {}                      # constraint key -> the first job (QueuedJob) waiting on it
        passes = {}                        # backend name -> its Admission, made on first need
        elastic.drop_lost_hosts(lambda name: _admission(passes, name, book), book)
        queue = (Job.objects.filter(state=State.QUEUED, cancel_requested=False)
                 .order_by("-priority", "created_at", "id")
                 .values_list(*QUEUED_JOB_FIELDS))
        now = timezone.now()
        for row in queue:
            job = QueuedJob(*row)
            if job.held:
                wait = Wait("held", by=job.held_by)
            elif job.restart_after is not None and job.restart_after > now:
                # Its backoff: it holds nothing back meanwhile (taskqueue.wake_scheduler_after wakes the
                # scheduler when it is over).
                wait = Wait("restart", attempt=job.attempt, at=job.restart_after)
            else:
                constraints = book.constraints(job.owner_id, job.owner, job.group_id, job.group, job.backend)
                admission = _admission(passes, job.backend, book)
                wait = _why_waiting(book, reserved, job, constraints, admission)
                if wait is None:
                    if states.transition(job.pk, State.LAUNCHING, message=admission.admitted_message(job),
                                         expect={State.QUEUED}):
                        admission.charge(job)
                        follow.hold_for_launch(job.pk)
                        book.charge(constraints, job.gpus, job.backend)
                        admitted.append(job.pk)
                    continue
            if wait.words != job.reason or wait.kind != job.waits_for:
                waits[job.pk], waited_for[job.pk] = wait, job.waits_for
        states.set_queue_reasons(waits, waited_for)
        elastic.grow(lambda name: _admission(passes, name, book), book, reserved, fresh=admitted)
        for job_id in admitted:
            taskqueue.run_job(job_id)
    return admitted


class _Unavailable:
    """The admission of a job whose backend is not enabled (any more): it waits, saying so."""

    def __init__(self, error):
        self.error = error

    def capacity_key(self, job):
        return ("unavailable", job.backend)

    def why_waiting(self, job):
        return Wait("unavailable", error=str(self.error))

    def room(self, job):
        return 0

    def lost(self, job):
        return []


def _admission(passes, name, book):
    if name not in passes:
        try:
            passes[name] = backends.get(name).admission(book)
        except backends.UnknownBackend as exc:
            passes[name] = _Unavailable(exc)
    return passes[name]


def _why_waiting(book, reserved, job, constraints, admission):
    """Why this job cannot be admitted now (a Wait, reserving what it waits for), or None: admit it."""
    never = book.never_fits(constraints, job.gpus)
    if never:
        return never
    for scope, _ in constraints:
        if scope.key in reserved:
            return Wait("quota_behind", scope=str(scope))
    blocked = book.blockers(constraints, job.gpus)
    if blocked:
        for scope, _ in blocked:
            reserved[scope.key] = job
        return Wait("quota", broken=[broken for _, broken in blocked])
    key = admission.capacity_key(job)
    if key in reserved:
        return admission.behind(job)
    wait = admission.why_waiting(job)
    if wait is not None and elastic.make_room(admission, book, job):
        wait = admission.why_waiting(job)
    if wait is not None:
        reserved[key] = job
    return wait


# --- queue positions --------------------------------------------------------------------------
def _queued_ahead_of(priority, created_at, pk):
    """Jobs that come before (priority, created_at, pk) in the scheduler's order."""
    return (Q(priority__gt=priority) | Q(priority=priority, created_at__lt=created_at)
            | Q(priority=priority, created_at=created_at, pk__lt=pk))


def _waiting():
    return Job.objects.filter(state=State.QUEUED, held=False, cancel_requested=False)


def queue_position(job):
    """1 for the first job in the scheduler's order, or None when the job is not waiting
    (not queued, or held). The order is priority, then submit time, across all backends."""
    if job.state != State.QUEUED or job.held or job.cancel_requested:
        return None
    return _waiting().filter(_queued_ahead_of(job.priority, job.created_at, job.pk)).count() + 1


def with_queue_position(jobs):
    """`jobs` annotated with `queue_pos` (as queue_position), in the same single query."""
    ahead = _waiting().filter(_queued_ahead_of(OuterRef("priority"), OuterRef("created_at"), OuterRef("pk")))
    count = ahead.order_by().values(n=Func(F("pk"), function="COUNT"))
    return jobs.annotate(queue_pos=Case(
        When(state=State.QUEUED, held=False, cancel_requested=False,
             then=ExpressionWrapper(Subquery(count) + 1, output_field=IntegerField())),
        default=None, output_field=IntegerField(),
    ))


# --- reconcile --------------------------------------------------------------------------------
def _launching_since(job):
    event = job.events.filter(state=State.LAUNCHING).order_by("-ts").first()
    return event.ts if event else job.created_at


def _launch_times_out(job):
    try:
        return backends.of(job).launch_times_out
    except backends.UnknownBackend:
        return True


def reconcile():
    """After any crash or restart: re-attach to running jobs, fail hung launches, admit.

    Returns the ids of the jobs that were handed to a new follower.
    """
    timeout = settings.RINGMASTER_LAUNCH_TIMEOUT_SECONDS
    reattached = []
    for job in follow.orphaned_jobs():
        if (job.state == State.LAUNCHING and _launch_times_out(job)
                and _launching_since(job) < timezone.now() - timedelta(seconds=timeout)):
            states.transition(job.pk, State.FAILED, expect={State.LAUNCHING},
                              reason=f"the launch did not start within {timeout} s")
            continue
        if follow.hand_over(job):
            taskqueue.run_job(job.pk)
            reattached.append(job.pk)
    release_leftovers()
    admit()
    return reattached


def release_leftovers():
    """Free what ended jobs still hold (GPU slots and indices on this machine or an instance),
    whatever left it behind. Returns the ids of those jobs."""
    ended = list(Job.objects.filter(state__in=TERMINAL_STATES, allocations__isnull=False).distinct())
    for job in ended:
        log.warning("job %s ended but still held GPU slots: released", job.pk)
        try:
            backends.of(job).release(job.pk)
        except backends.UnknownBackend:
            job.allocations.all().delete()
    return [job.pk for job in ended]
