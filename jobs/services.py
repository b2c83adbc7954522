"""What users and the scheduler do to jobs: submit, admit, cancel, store a script.

Views, the API, the CLI, Celery tasks and management commands all come through here.
"""
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.utils import timezone

from . import states
from .models import ACTIVE_STATES, Backend, Job, JobEvent, SchedulerLock, Script, State


class CannotCancel(Exception):
    pass


def visible_jobs(user):
    """The jobs a user may see: their own; staff see every job. Others' jobs are 404."""
    jobs = Job.objects.select_related("owner", "image", "script")
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


def _local_gpus_in_use():
    active = Job.objects.filter(backend=Backend.LOCAL, state__in=ACTIVE_STATES)
    return active.aggregate(total=Sum("gpus"))["total"] or 0


def admit_queued():
    """Admit queued jobs, oldest first, as far as capacity allows. Returns the admitted ids.

    Admission is first come, first served per backend: once a job does not fit, later jobs of
    the same backend wait behind it, so a large job is never starved by a stream of small ones.
    """
    from .tasks import run_job

    admitted = []
    with transaction.atomic():
        _lock_scheduler()
        capacity = settings.RINGMASTER_LOCAL_GPUS
        in_use = _local_gpus_in_use()
        blocked = None
        for job in Job.objects.filter(state=State.QUEUED).order_by("created_at", "id"):
            if job.cancel_requested:
                continue
            if blocked is None and in_use + job.gpus <= capacity:
                states.transition(job.pk, State.LAUNCHING, message="admitted", expect={State.QUEUED})
                # A pending claim: reconcile leaves the job to the run_job task sent below.
                Job.objects.filter(pk=job.pk).update(follower_heartbeat=timezone.now())
                in_use += job.gpus
                admitted.append(job.pk)
                continue
            if blocked is None:
                blocked = job
                reason = f"waiting for capacity: {in_use} of {capacity} GPUs in use, this job needs {job.gpus}"
            else:
                reason = f"waiting behind job {blocked.pk} for capacity ({in_use} of {capacity} GPUs in use)"
            states.set_reason(job.pk, reason)
        for job_id in admitted:
            transaction.on_commit(lambda job_id=job_id: run_job.delay(job_id))
    return admitted


def queue_position(job):
    """1 for the next job to be admitted, or None when the job is not queued."""
    if job.state != State.QUEUED:
        return None
    earlier = Job.objects.filter(state=State.QUEUED, created_at__lt=job.created_at).count()
    same_time = Job.objects.filter(state=State.QUEUED, created_at=job.created_at, pk__lt=job.pk).count()
    return earlier + same_time + 1


def cancel(job, by):
    """Cancel a job. A queued job ends at once; a running one is stopped by a worker."""
    from .tasks import stop_job

    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        if locked.is_terminal:
            raise CannotCancel(f"job {job.pk} has already ended ({locked.state.lower()})")
        if locked.state == State.QUEUED:
            return states.transition(job.pk, State.CANCELLED, message=f"cancelled by {by.get_username()}")
        if not locked.cancel_requested:
            locked.cancel_requested = True
            locked.save(update_fields=["cancel_requested"])
            JobEvent.objects.create(job=locked, message=f"cancel requested by {by.get_username()}")
            transaction.on_commit(lambda: stop_job.delay(job.pk))
    return locked
