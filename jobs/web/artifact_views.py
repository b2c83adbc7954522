"""The job page's artifacts: download one file or all (.tar.gz), "Fetch now", and "Rerun from
checkpoint" (the same checks as /api/jobs/<id>/artifacts/ and rerun-from-checkpoint/)."""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_GET, require_POST

from jobs import taskqueue
from jobs.domain import artifacts, services
from jobs.domain.services import visible_jobs
from jobs.web.artifact_api import archive_response, file_response
from jobs.web.forms import JobForm


def _job(request, job_id):
    return get_object_or_404(visible_jobs(request.user), pk=job_id)


@login_required
@require_GET
def artifact_file(request, job_id, name):
    job = _job(request, job_id)
    try:
        return file_response(job, name)
    except artifacts.BadName as exc:
        return HttpResponseBadRequest(str(exc))


@login_required
@require_GET
def artifact_archive(request, job_id):
    return archive_response(_job(request, job_id))


@login_required
@require_POST
def artifact_fetch(request, job_id):
    job = _job(request, job_id)
    if artifacts.fetches(job):
        taskqueue.collect_artifacts(job.pk)
        messages.success(request, f"Fetching the artifacts of job {job.pk}; reload the page in a moment.")
    return redirect("job-detail", job_id=job.pk)


@login_required
@require_POST
def rerun_from_checkpoint(request, job_id):
    job = _job(request, job_id)
    checkpoint = artifacts.newest_checkpoint(job)
    if checkpoint is None:
        messages.error(request, f"Cannot rerun job {job.pk} from a checkpoint: {artifacts.no_checkpoint(job)}")
        return redirect("job-detail", job_id=job.pk)
    form = JobForm(data=services.resubmit_data(job, request.user), user=request.user)
    if not form.is_valid():
        problems = "; ".join(" ".join(errors) for errors in form.errors.values())
        messages.error(request, f"Cannot rerun job {job.pk}: {problems}")
        return redirect("job-detail", job_id=job.pk)
    new = services.submit(request.user, form, parent=job, checkpoint=checkpoint)
    messages.success(request, f"Job {new.pk} starts from {checkpoint} of job {job.pk}.")
    for warning in form.warnings:
        messages.warning(request, warning)
    return redirect("job-detail", job_id=new.pk)
