"""The browser's pages: job list, job form, job detail, cancel and rerun."""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from . import services
from .services import visible_jobs
from .forms import JobForm, JobPageForm
from .models import LogLine

PAGE_SIZE = 25
LOG_LINES_ON_PAGE = 5000


@login_required
def job_list(request):
    jobs = visible_jobs(request.user)
    if request.GET.get("mine"):
        jobs = jobs.filter(owner=request.user)
    page = Paginator(jobs, PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "jobs/job_list.html", {"page": page, "jobs": page.object_list})


@login_required
def job_new(request):
    if request.method == "POST":
        form = JobPageForm(data=request.POST, files=request.FILES, user=request.user)
        if form.is_valid():
            job = services.submit(request.user, form)
            messages.success(request, f"Job {job.pk} submitted.")
            return redirect("job-detail", job_id=job.pk)
    else:
        form = JobPageForm(user=request.user)
    return render(request, "jobs/job_form.html", {"form": form})


@login_required
def job_detail(request, job_id):
    job = get_object_or_404(visible_jobs(request.user), pk=job_id)
    lines = list(LogLine.objects.filter(job=job).order_by("-seq")[:LOG_LINES_ON_PAGE])[::-1]
    ranks = sorted({line.rank for line in lines}, key=lambda r: (r is None, r or 0))
    return render(request, "jobs/job_detail.html", {
        "job": job,
        "events": job.events.all(),
        "lines": lines,
        "ranks": ranks,
        "truncated": job.next_seq > len(lines),
        "queue_position": services.queue_position(job),
    })


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
def job_rerun(request, job_id):
    """Submit a job again with the same settings, through the same validation."""
    job = get_object_or_404(visible_jobs(request.user), pk=job_id)
    form = JobForm(data=services.resubmit_data(job), user=request.user)
    if not form.is_valid():
        problems = "; ".join(f"{field}: {' '.join(errs)}" for field, errs in form.errors.items())
        messages.error(request, f"Cannot rerun job {job.pk}: {problems}")
        return redirect("job-detail", job_id=job.pk)
    new = services.submit(request.user, form)
    messages.success(request, f"Job {new.pk} submitted with the settings of job {job.pk}.")
    return redirect("job-detail", job_id=new.pk)
