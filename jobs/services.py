"""What users and the scheduler do to jobs: submit, admit, cancel, store a script.

Views, the API, the CLI, Celery tasks and management commands all come through here.
"""
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Case, ExpressionWrapper, F, Func, IntegerField, OuterRef, Q, Subquery, When
from django.utils import timezone

from . import instances, quotas, states
from .live import publish_state, publish_states
from .models import Backend, Job, JobEvent, SchedulerLock, Script, State


class CannotCancel(Exception):
    pass


def visible_jobs(user):
    """The jobs a user may see: their own; staff see every job. Others' jobs are 404."""
    jobs = Job.objects.select_related("owner", "image", "script", "charged_group", "cluster")
    return jobs if user.is_staff else jobs.filter(owner=user)


def submit(user, form):
    """Create a QUEUED job from a valid JobForm and ask the scheduler to look at it."""
    from .tasks import dispatch

    fields = form.job_fields()
    upload = form.cleaned_data.get("script_file")
    with transaction.atomic():
        if upload:
            fields["script"] = store_script(user, upload)
            fields["script_path"] = ""
        job = Job.objects.create(owner=user, state=State.QUEUED, reason="waiting for the scheduler", **fields)
        JobEvent.objects.create(job=job, state=State.QUEUED, message=f"submitted by {user.get_username()}")
        transaction.on_commit(lambda: dispatch.delay(job.pk))
    return job


def resubmit_data(job):
    """The API-shaped settings of `job`, to submit it again."""
    data = {
        "name": job.name, "image": job.image_id, "gpus": job.gpus, "args": job.args, "env": job.env,
        "backend": job.backend, "time_limit_minutes": job.time_limit_minutes,
    }
    if job.charged_group_id:
        data["group"] = job.charged_group.name
    if job.cluster_id:
        data["cluster"] = job.cluster.name
    if job.script_id:
        data["script"] = job.script_id
    else:
        data["script_path"] = job.script_path
    return data


def store_script(owner, upload):
    """Keep an uploaded script by content hash; the same file uploaded twice is stored once.

    `upload` is ScriptUploadForm's cleaned `file`: {"name", "content", "sha256", "size"}.
    """
    lookup = {"owner": owner, "name": upload["name"], "sha256": upload["sha256"]}
    try:
        with transaction.atomic():
            script, _ = Script.objects.get_or_create(
                **lookup, defaults={"content": upload["content"], "size": upload["size"]}
            )
    except IntegrityError:  # the same upload, twice at once
        script = Script.objects.get(**lookup)
    return script


def _lock_scheduler():
    """Serialise admission decisions across every web and worker process."""
    SchedulerLock.objects.get_or_create(pk=1)
    return SchedulerLock.objects.select_for_update().get(pk=1)


def backend_capacity(backend):
    """GPUs `backend` can run at once; None where the backend queues beyond its size itself."""
    if backend == Backend.LOCAL:
        return settings.RINGMASTER_LOCAL_GPUS
    if backend == Backend.INSTANCES:
        return instances.capacity()
    return None


def admit():
    """Admit the queued jobs that fit, as quotas and capacity allow. Returns the admitted ids.

    The one place where admission rules live. It runs under the scheduler's row lock (one
    decision at a time across every process, so no quota or capacity is ever overbooked, even
    under races), on submit and whenever a job ends (the `dispatch` task), and from beat.

    Order: higher `priority` first, then earlier submission. Each job, in that order:

    1. held by an admin: stays queued ("held by <admin>"), holds nothing back;
    2. can never fit its limits (e.g. more GPUs than its per-job limit, after a quota was
       lowered): stays queued and says so, holds nothing back;
    3. shares a quota scope (its user, its group, per backend) with an earlier job that is
       waiting on that scope: waits behind it;
    4. would break a quota of one of its scopes: waits with the reason ("waiting for quota:
       group vision: 14 of 16 GPUs in use, needs 4") and *reserves* those scopes;
    5. does not fit the backend's free GPUs: waits ("waiting for capacity: ...") and reserves
       the backend's capacity, or waits behind the job that reserved it;
    6. otherwise it is admitted (LAUNCHING) and its GPUs count at once.

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
    from .tasks import run_job

    admitted, reasons, old_reasons = [], {}, {}
    with transaction.atomic():
        _lock_scheduler()
        book = quotas.QuotaBook()
        reserved = {}                      # constraint key -> the first job waiting on it
        slots = _Slots()                   # instance slots: locked and placed on first need
        clusters = None                    # GPUs per cluster: read on first need
        queue = (Job.objects.filter(state=State.QUEUED, cancel_requested=False)
                 .order_by("-priority", "created_at", "id")
                 .values_list("id", "owner_id", "owner__username", "charged_group_id", "charged_group__name",
                              "backend", "cluster_id", "gpus", "held", "held_by__username", "reason"))
        for pk, owner_id, owner, group_id, group, backend, cluster_id, gpus, held, held_by, old_reason in queue:
            if held:
                reason = f"held by {held_by or 'an admin'}"
            else:
                constraints = book.constraints(owner_id, owner, group_id, group, backend)
                if backend == Backend.KUBERNETES and clusters is None:
                    from .clusters import ClusterUse

                    clusters = ClusterUse()
                reason = _why_waiting(book, reserved, pk, constraints, backend, gpus, slots, (clusters, cluster_id))
                if reason is None:
                    if states.transition(pk, State.LAUNCHING, message=slots.admitted_message(pk),
                                         expect={State.QUEUED}):
                        slots.allocate(pk)
                        if backend == Backend.KUBERNETES:
                            clusters.charge(cluster_id, gpus)
                        # A pending claim: reconcile leaves the job to the run_job task sent below.
                        Job.objects.filter(pk=pk).update(follower_heartbeat=timezone.now())
                        book.charge(constraints, gpus, backend)
                        admitted.append(pk)
                    continue
            if reason != old_reason:
                reasons[pk], old_reasons[pk] = reason, old_reason
        _write_reasons(reasons, old_reasons)
        for job_id in admitted:
            transaction.on_commit(lambda job_id=job_id: run_job.delay(job_id))
    return admitted


class _Slots:
    """The instances backend's part of one admission pass: its instance rows are locked (FOR
    UPDATE) the first time a job needs them; a job that fits gets a placement, written as
    SlotAllocation rows when it is admitted."""

    def __init__(self):
        self.pool, self.plans = None, {}

    def place(self, pk, gpus):
        if self.pool is None:
            self.pool = instances.Pool()
        placement, reason = self.pool.place(gpus)
        if placement is not None:
            self.plans[pk] = placement
        return reason

    def admitted_message(self, pk):
        if pk not in self.plans:
            return "admitted"
        return "admitted: " + ", ".join(f"{i.name}:{n}" for i, n in self.plans[pk])

    def allocate(self, pk):
        if pk in self.plans:
            self.pool.allocate(pk, self.plans.pop(pk))


def _why_waiting(book, reserved, pk, constraints, backend, gpus, slots=None, cluster=(None, None)):
    """Why this job cannot be admitted now (reserving what it waits for), or None: admit it.
    `cluster`: (jobs.clusters.ClusterUse, the job's cluster id) for a kubernetes job."""
    never = book.never_fits(constraints, gpus)
    if never:
        return f"can never start: {never}"
    for scope, _ in constraints:
        if scope.key in reserved:
            return f"waiting behind an earlier job for the quota of {scope}"
    blocked = book.blockers(constraints, gpus)
    if blocked:
        for scope, _ in blocked:
            reserved[scope.key] = pk
        return "waiting for quota: " + "; ".join(message for _, message in blocked)
    if backend == Backend.INSTANCES:
        # Slots on instances, as few as possible; the first job that does not fit reserves them.
        if ("capacity", backend) in reserved:
            return f"waiting behind an earlier job for capacity ({backend})"
        reason = (slots or _Slots()).place(pk, gpus)
        if reason is not None:
            reserved[("capacity", backend)] = pk
        return reason
    if backend == Backend.KUBERNETES:
        use, cluster_id = cluster
        key = ("capacity", backend, cluster_id)
        if key in reserved:
            return "waiting behind an earlier job for capacity on its cluster"
        reason = use.why_waiting(cluster_id, gpus) if use else None
        if reason is not None:
            reserved[key] = pk
        return reason
    capacity = backend_capacity(backend)
    if capacity is None:
        return None
    if ("capacity", backend) in reserved:
        return f"waiting behind an earlier job for capacity ({backend})"
    in_use = book.backend_gpus(backend)
    if in_use + gpus > capacity:
        reserved[("capacity", backend)] = pk
        return f"waiting for capacity: {in_use} of {capacity} GPUs in use, this job needs {gpus}"
    return None


def _write_reasons(reasons, old_reasons):
    """Store new reasons of still-queued jobs in a few statements, and tell live viewers.

    A job's events record what it waits for when that changes (quota, capacity, held, ...),
    not every change of the numbers or of the job it waits behind, so a job that waits for a
    day does not collect thousands of events.
    """
    by_reason = {}
    for pk, reason in reasons.items():
        by_reason.setdefault(reason, []).append(pk)
    for reason, ids in by_reason.items():
        for start in range(0, len(ids), 1000):
            Job.objects.filter(pk__in=ids[start:start + 1000], state=State.QUEUED).update(reason=reason)
    JobEvent.objects.bulk_create(
        [JobEvent(job_id=pk, message=reason) for pk, reason in reasons.items()
         if _waits_for(reason) != _waits_for(old_reasons[pk])],
        batch_size=1000,
    )
    announced = [_Announced(pk, State.QUEUED, reason) for pk, reason in reasons.items()]
    if announced:
        transaction.on_commit(lambda: publish_states(announced))


_WAITS_FOR = {
    "waiting for quota": "quota", "waiting behind an earlier job for the quota": "quota",
    "waiting for capacity": "capacity", "waiting behind an earlier job for capacity": "capacity",
    "waiting for instances": "capacity",
}


def _waits_for(reason):
    """What a waiting job waits for, without the numbers: "quota", "capacity", or the reason."""
    return next((kind for prefix, kind in _WAITS_FOR.items() if reason.startswith(prefix)), reason)


class _Announced:
    """What live viewers are told about a job (its id, state and reason)."""

    def __init__(self, pk, state, reason):
        self.pk, self.state, self.reason = pk, state, reason


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


class NotQueued(Exception):
    pass


def _change_queued(job, by, message, **fields):
    """Change a queued job's scheduling fields, record who did it, and let the scheduler look."""
    from .tasks import dispatch

    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        if locked.state != State.QUEUED:
            raise NotQueued(f"job {job.pk} is not queued ({locked.state.lower()})")
        for name, value in fields.items():
            setattr(locked, name, value)
        locked.save(update_fields=list(fields))
        JobEvent.objects.create(job=locked, message=message)
        transaction.on_commit(lambda: publish_state(locked))
        transaction.on_commit(lambda: dispatch.delay(job.pk))
    return locked


def hold(job, by):
    """Keep a queued job from being admitted until it is released."""
    name = by.get_username()
    return _change_queued(job, by, f"held by {name}", held=True, held_by=by, reason=f"held by {name}")


def release(job, by):
    return _change_queued(job, by, f"released by {by.get_username()}", held=False, held_by=None,
                          reason="waiting for the scheduler")


def set_priority(job, priority, by):
    return _change_queued(job, by, f"priority set to {priority} by {by.get_username()}", priority=priority)


def cancel(job, by):
    """Cancel a job. A queued job ends at once; a running one is stopped by a worker."""
    from .tasks import dispatch, stop_job

    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        if locked.is_terminal:
            raise CannotCancel(f"job {job.pk} has already ended ({locked.state.lower()})")
        if locked.state == State.QUEUED:
            # It may have been the job others waited behind: let the scheduler look again.
            transaction.on_commit(lambda: dispatch.delay())
            return states.transition(job.pk, State.CANCELLED, message=f"cancelled by {by.get_username()}")
        if not locked.cancel_requested:
            locked.cancel_requested = True
            locked.save(update_fields=["cancel_requested"])
            JobEvent.objects.create(job=locked, message=f"cancel requested by {by.get_username()}")
            transaction.on_commit(lambda: stop_job.delay(job.pk))
    return locked
