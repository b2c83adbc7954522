"""The study pages: a user's studies, and one study's trials (params, state, objective, job)."""
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from jobs.domain import studies


@login_required
def study_list(request):
    mine = list(studies.visible_studies(request.user))
    return render(request, "jobs/study_list.html", {"studies": [(study, studies.best(study)) for study in mine]})


@login_required
def study_detail(request, study_id):
    study = get_object_or_404(studies.visible_studies(request.user), pk=study_id)
    trials = list(study.trials.select_related("job").order_by("number"))
    names = list(study.spec["space"])
    return render(request, "jobs/study_detail.html", {
        "study": study, "best": studies.best(study), "names": names,
        "rows": [(trial, [trial.params.get(name) for name in names], _duration(trial.job),
                  trial.job.gpu_seconds / 3600 if trial.job else None) for trial in trials],
    })


def _duration(job):
    """A trial job's running time in seconds so far (None before it started)."""
    if job is None or job.started_at is None:
        return None
    return ((job.finished_at or timezone.now()) - job.started_at).total_seconds()


@login_required
@require_POST
def study_stop(request, study_id):
    study = get_object_or_404(studies.visible_studies(request.user), pk=study_id)
    studies.stop(study, by=request.user)
    return redirect("study-detail", study_id=study.pk)
