"""What users and admins do to jobs: submit, cancel, hold, release, reprioritise, tag and note,
store a script.

Views, the API, Celery tasks and management commands all come through here; admission and
queue positions are the scheduler's (jobs.domain.scheduler).
"""
from django.db import IntegrityError, transaction
from django.db.models import Q

from jobs import backends, taskqueue
from jobs.backends.waits import Wait
from jobs.domain import states
from jobs.domain.states import NotQueued  # noqa: F401  (callers catch it from here)
from jobs.models import Job, Project, Script, State


class CannotCancel(Exception):
    pass


def visible_jobs(user):
    """The jobs a user may see: their own; staff see every job. Others' jobs are 404."""
    # A project's snapshot (its archive) is read only where its files are.
    jobs = Job.objects.select_related("owner", "image", "script", "charged_group", "project").defer("project__archive")
    return jobs if user.is_staff else jobs.filter(owner=user)


def visible_scripts(user):
    """The scripts a user may run: their own uploads and the example library."""
    return Script.objects.filter(Q(owner=user) | Q(owner__isnull=True))


def submit(user, form, parent=None, checkpoint=""):
    """Create a QUEUED job from a valid JobForm and ask the scheduler to look at it. `parent`:
    the job it reruns, one the user can see (the rerun view's; the page form cleans its own);
    `checkpoint`: the parent's artifact it starts from (RINGMASTER_CHECKPOINT). The form's
    warnings (what the job is created despite) are events of the job, after its first."""
    fields = form.job_fields()
    if parent is not None:
        fields["parent"] = parent
        fields["checkpoint"] = checkpoint
    _keep_origin(fields)
    upload = form.cleaned_data.get("script_file")
    with transaction.atomic():
        if upload:
            fields["script"] = store_script(user, upload)
            fields["script_path"] = ""
        job = Job.objects.create(owner=user, state=State.QUEUED, **Wait("scheduler").stored(), **fields)
        backends.of(job).record(job, form.cleaned_data)
        states.submitted(job, by=user)
        for warning in form.warnings:
            states.note(job.pk, f"Warning: {warning}")
        taskqueue.wake_scheduler()
    return job


def _keep_origin(fields):
    """A rerun of a job that ran a project fetched from git runs the same snapshot (resubmit_data
    gives its id, nothing is fetched again) and records the same repository and commit."""
    parent, project = fields.get("parent"), fields.get("project")
    if parent is not None and project is not None and not fields.get("project_commit") \
            and parent.project_id and parent.project_commit and parent.project.sha256 == project.sha256:
        fields["project_url"], fields["project_commit"] = parent.project_url, parent.project_commit


def resubmit_data(job, user=None):
    """The API-shaped settings of `job`, to submit it again (as `user`: a script of another
    user's job, which staff may rerun, becomes a copy of their own)."""
    data = {
        "name": job.name, "image": job.image_id, "launcher": job.launcher, "gpus": job.gpus, "args": job.args,
        "env": job.env,
        "backend": job.backend, "time_limit_minutes": job.time_limit_minutes,
    }
    if job.gpu_model:
        data["gpu_model"] = job.gpu_model
    if job.tags:
        data["tags"] = list(job.tags)       # a rerun is found by the same tags; its note is its own
    if job.max_gpus:
        data["max_gpus"] = job.max_gpus      # a rerun of an elastic job is elastic too
    if job.checkpoint_pattern:
        data["checkpoint_pattern"] = job.checkpoint_pattern
    if job.max_restarts:
        data.update(max_restarts=job.max_restarts, restart_on_exit_codes=list(job.restart_on_exit_codes),
                    restart_on=list(job.restart_on))
    if job.charged_group_id:
        data["group"] = job.charged_group.name
    try:
        data.update(backends.of(job).field_values(job))
    except backends.UnknownBackend:
        pass                        # the form says the backend is not enabled
    if job.project_id:
        data["project"], data["entry_point"] = job.project_id, job.entry_point
        if user is not None and job.project.owner_id != user.pk:        # staff rerunning another's
            data["project"] = copy_project(job.project, user).pk
    elif job.script_id:
        data["script"] = job.script_id
        if user is not None and not visible_scripts(user).filter(pk=job.script_id).exists():
            script = job.script
            data["script"] = store_script(user, {"name": script.name, "content": script.content,
                                                 "sha256": script.sha256, "size": script.size}).pk
    else:
        data["script_path"] = job.script_path
    return data


def copy_project(project, owner):
    """`owner`'s own snapshot of the same files (the one they have, or a copy)."""
    copy, _ = Project.objects.get_or_create(owner=owner, sha256=project.sha256, defaults={
        "files": project.files, "size": project.size, "listing": project.listing, "archive": project.archive})
    return copy


def annotate(job, changes):
    """Set a job's tags and/or note (`changes`: JobNotesForm.changes()). Only those columns are
    written: a follower updating the job's output at the same moment keeps its own."""
    if changes:
        Job.objects.filter(pk=job.pk).update(**changes)
        for name, value in changes.items():
            setattr(job, name, value)
    return job


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


def _change_queued(job, message, **fields):
    """Change a queued job's scheduling fields, record who did it (in `message`), and let the
    scheduler look."""
    with transaction.atomic():
        changed = states.change_queued(job.pk, message, **fields)
        taskqueue.wake_scheduler()
    return changed


def hold(job, by):
    """Keep a queued job from being admitted until it is released."""
    name = by.get_username()
    return _change_queued(job, f"held by {name}", held=True, held_by=by, **Wait("held", by=name).stored())


def release(job, by):
    return _change_queued(job, f"released by {by.get_username()}", held=False, held_by=None,
                          **Wait("scheduler").stored())


def set_priority(job, priority, by):
    return _change_queued(job, f"priority set to {priority} by {by.get_username()}", priority=priority)


def cancel(job, by, reason=""):
    """Cancel a job. A queued job ends at once; a running one is stopped by a worker. `reason`:
    why, where it is not a person's decision (a study pruned the trial): the job's event says it."""
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        if locked.is_terminal:
            raise CannotCancel(f"job {job.pk} has already ended ({locked.state.lower()})")
        if locked.state == State.QUEUED:
            # It may have been the job others waited behind: let the scheduler look again.
            taskqueue.wake_scheduler()
            return states.transition(job.pk, State.CANCELLED, message=reason or f"cancelled by {by.get_username()}")
        if states.request_cancel(locked, reason or f"cancel requested by {by.get_username()}"):
            taskqueue.stop_job(job.pk)
    return locked
