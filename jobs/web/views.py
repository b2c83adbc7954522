"""The browser's pages: job form, job detail (and its MPIJob), cancel, rerun, tags and note."""
import json

from asgiref.sync import sync_to_async
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, JsonResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from jobs.domain import artifacts, logquery, projects, recovery, scheduler, services, tbmetrics
from jobs.domain.services import visible_jobs
from jobs import backends
from jobs.web.forms import JobForm, JobNotesPageForm
from jobs.web.pageform import JobPageForm

# The job page lists this many artifacts; the archive holds them all.
MAX_ARTIFACTS_SHOWN = 200


@login_required
def job_new(request):
    if request.method == "POST":
        form = JobPageForm(data=request.POST, files=request.FILES, user=request.user)
        if form.is_valid():
            job = services.submit(request.user, form)
            messages.success(request, f"Job {job.pk} submitted.")
            for warning in form.warnings:
                messages.warning(request, warning)
            return redirect("job-detail", job_id=job.pk)
        upload = form.cleaned_data.get("script_file")
        if upload and "script" not in form.errors:    # kept: correcting another field needs no new upload
            form.keep_upload(services.store_script(request.user, upload))
    else:
        form = JobPageForm(user=request.user)
    return render(request, "jobs/job_form.html", {"form": form, "parent": _parent(request, form)})


def _parent(request, form):
    """The job the form reruns, where the user can see it."""
    pk = form["parent"].value()
    if pk in (None, "") or not str(pk).isdigit() or int(pk) >= 2 ** 31:
        return None
    return visible_jobs(request.user).filter(pk=int(pk)).first()


@login_required
def job_detail(request, job_id):
    """The job page. Its log view and charts load and follow the output in the browser
    (frontend/static/ringmaster/job.js): the tail over the API, then live over the websocket."""
    job = get_object_or_404(visible_jobs(request.user), pk=job_id)
    return _job_page(request, job, JobNotesPageForm(initial={"tags": ", ".join(job.tags), "note": job.note}))


def _job_page(request, job, notes_form, status=200):
    backend = _backend_of(job)
    tree = artifacts.walk(job)
    return render(request, "jobs/job_detail.html", {
        "job": job,
        "parent": visible_jobs(request.user).filter(pk=job.parent_id).first() if job.parent_id else None,
        "backend_label": backend.label if backend else job.backend,
        "backend_links": backend.links(job) if backend else [],
        "backend_values": _backend_values(backend, job),
        "events": job.events.all(),
        "ranks": range(job.gpus),
        "last_seq": job.next_seq - 1,
        "tensorboard_mark": tbmetrics.last_id(job.pk),     # read before the page reads the points
        "queue_position": scheduler.queue_position(job),
        "size_history": [[event.ts.isoformat(), event.gpus] for event in job.events.all() if event.gpus is not None],
        "notes_form": notes_form,
        "project_files": projects.job_files(job) if job.project_id else [],
        "artifacts": tree.files[:MAX_ARTIFACTS_SHOWN + 1],
        "artifacts_skipped": tree.skipped,
        "max_artifacts_shown": MAX_ARTIFACTS_SHOWN,
        "artifacts_note": artifacts.note(job),
        "fetches_artifacts": artifacts.fetches(job) and not job.is_terminal,
        "checkpoint": artifacts.newest_checkpoint(job),
        "attempts": job.attempts.all(),
        "restarts_left": recovery.restarts_left(job),
    }, status=status)


def _backend_values(backend, job):
    """[(label, value)] of the job's backend's own fields (a kubernetes job's cluster)."""
    values = backend.field_values(job) if backend else {}
    return [(name.replace("_", " ").capitalize(), value) for name, value in values.items()]


def _backend_of(job):
    try:
        return backends.of(job)
    except backends.UnknownBackend:
        return None


@login_required
def job_mpijob(request, job_id):
    """The object a job's backend creates for it (a kubernetes job's MPIJob), for the owner and
    staff: the same JSON as `manage.py render_mpijob`; ?format=json gives the bare document.
    404 for a job whose backend creates none."""
    job = get_object_or_404(visible_jobs(request.user), pk=job_id)
    backend = _backend_of(job)
    try:
        made = backend.document(job) if backend else None
    except ValueError as exc:
        return render(request, "jobs/mpijob.html", {"job": job, "backend_label": backend.label,
                                                    "backend_values": _backend_values(backend, job),
                                                    "problems": [str(exc)]}, status=409)
    if made is None:
        raise Http404("This job's backend creates no document.")
    kind, document = made
    if request.GET.get("format") == "json":
        return JsonResponse(document, json_dumps_params={"indent": 2})
    return render(request, "jobs/mpijob.html", {
        "job": job, "kind": kind, "backend_label": backend.label, "backend_values": _backend_values(backend, job),
        "document": json.dumps(document, indent=2),
        "problems": backend.document_problems(document)})


@login_required
def job_log_download(request, job_id):
    """The whole log as a text file: every rank (each line tagged), or one (?rank=)."""
    job = get_object_or_404(visible_jobs(request.user), pk=job_id)
    try:
        rank = logquery.parse_rank(request.GET.get("rank"))
    except ValueError:
        raise Http404("No such rank.")
    suffix = "" if rank is logquery.ALL_RANKS else f"-rank-{logquery.rank_tag(rank)}"
    response = StreamingHttpResponse(_async_chunks(logquery.download_chunks(job, rank)),
                                     content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="ringmaster-job-{job.pk}{suffix}.log"'
    return response


async def _async_chunks(chunks):
    """Serve a sync generator of database reads from the ASGI server without blocking it."""
    done = object()
    while (chunk := await sync_to_async(next)(chunks, done)) is not done:
        yield chunk


@login_required
@require_POST
def job_cancel(request, job_id):
    job = get_object_or_404(visible_jobs(request.user), pk=job_id)
    try:
        services.cancel(job, by=request.user)
        messages.info(request, f"Cancelling job {job.pk}.")
    except services.CannotCancel as exc:
        messages.error(request, str(exc))
    return redirect("job-detail", job_id=job.pk)


@login_required
@require_POST
def job_notes(request, job_id):
    """The job page's tags and note form (the same checks as PATCH /api/jobs/<id>/)."""
    job = get_object_or_404(visible_jobs(request.user), pk=job_id)
    form = JobNotesPageForm(request.POST)
    if not form.is_valid():                 # shown again with what was typed and why it was refused
        return _job_page(request, job, form, status=400)
    services.annotate(job, form.changes())
    messages.success(request, f"Saved the tags and note of job {job.pk}.")
    return redirect("job-detail", job_id=job.pk)


@login_required
def job_file(request, job_id, path):
    """One file of the job's project, shown as text (or said to be binary, with its download)."""
    job = get_object_or_404(visible_jobs(request.user), pk=job_id)
    try:
        content = projects.job_file(job, path)
    except KeyError:
        raise Http404("No such file in the job's project.") from None
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return render(request, "jobs/job_file.html", {"job": job, "path": path, "text": text, "size": len(content)})


@login_required
@require_http_methods(["GET", "POST"])
def job_rerun(request, job_id):
    """GET: the job form filled in from the job, to edit and submit (the new job's parent is
    this one). POST: submit it again at once with the same settings, through the same validation."""
    job = get_object_or_404(visible_jobs(request.user), pk=job_id)
    data = services.resubmit_data(job, request.user)
    if request.method == "GET":
        if not job.image.enabled:
            messages.warning(request, f"Image {job.image.name} of job {job.pk} is no longer enabled: choose another.")
        form = JobPageForm(user=request.user, initial=JobPageForm.initial_from(job, data))
        return render(request, "jobs/job_form.html", {"form": form, "parent": job})
    form = JobForm(data=data, user=request.user)
    if not form.is_valid():
        problems = "; ".join(("" if field == "__all__" else f"{_label(form, field)}: ") + " ".join(errs)
                             for field, errs in form.errors.items())
        messages.error(request, f"Cannot rerun job {job.pk}: {problems}")
        return redirect("job-detail", job_id=job.pk)
    new = services.submit(request.user, form, parent=job)
    messages.success(request, f"Job {new.pk} submitted with the settings of job {job.pk}.")
    for warning in form.warnings:
        messages.warning(request, warning)
    return redirect("job-detail", job_id=new.pk)


def _label(form, name):
    """How a message names a field: its label ("Script path"), never its name."""
    field = form.fields.get(name)
    return field.label if field is not None and field.label else name.replace("_", " ").capitalize()
