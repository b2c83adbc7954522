"""Jobs side by side: what differs between them (image, launcher, GPUs, arguments, environment
values, script), each metric's curve per job (the mean of its ranks at each step), its last and
best value, and each job's duration and GPU-hours. The compare page and GET /api/compare/ show
what comparison() returns.

"Best" is the lowest value of a metric whose name says lower is better (a loss, an error, a time),
and the highest of any other (an accuracy, a throughput), as experiment trackers rank runs.
"""
import difflib
import re

from django.db.models import Avg
from django.utils import timezone

from jobs.domain import accounting
from jobs.models import MetricPoint

MIN_JOBS, MAX_JOBS = 2, 10
LOWER_IS_BETTER = re.compile(r"loss|err|perplexity|time|seconds|latency|wer|cer", re.IGNORECASE)


class CompareError(ValueError):
    """Jobs that cannot be compared, with what to give instead."""


def parse_ids(text):
    """The job ids of `jobs=1,2,3` (2 to 10 of them, each once, in the order given)."""
    words = [word.strip() for word in (text or "").split(",") if word.strip()]
    if not all(word.isdigit() and len(word) < 19 for word in words):
        raise CompareError("Give job ids separated by commas, e.g. jobs=12,15.")
    ids = list(dict.fromkeys(int(word) for word in words))
    if not MIN_JOBS <= len(ids) <= MAX_JOBS:
        raise CompareError(f"Compare {MIN_JOBS} to {MAX_JOBS} different jobs ({len(ids)} given).")
    return ids


def better(name):
    return "min" if LOWER_IS_BETTER.search(name) else "max"


def curves(job_ids):
    """{metric: {job id: [(step, mean of the ranks' values)]}}, by step; points without a step
    are left out (a summary printed once has no curve)."""
    found = {}
    rows = (MetricPoint.objects.filter(job_id__in=job_ids, step__isnull=False).values("name", "job_id", "step")
            .annotate(mean=Avg("value")).order_by("name", "job_id", "step"))
    for row in rows:
        found.setdefault(row["name"], {}).setdefault(row["job_id"], []).append((row["step"], row["mean"]))
    return found


def _script(job):
    """(what the script is called, its text or None)."""
    if job.script_id:
        return f"{job.script.name} ({job.script.sha256[:12]})", job.script.content
    return job.script_path, None


def _fields(job):
    """What a job was started with, as the compare table shows it."""
    return {
        "image": job.image.name, "launcher": job.launcher,
        "gpus": f"{job.gpus}..{job.max_gpus}" if job.max_gpus else str(job.gpus),
        "backend": job.backend, "args": " ".join(job.args),
        **{f"env {name}": str(value) for name, value in sorted(job.env.items())},
        "script": _script(job)[0],
    }


def _diffs(jobs):
    """Unified diffs of each job's script against the first job's, where the texts differ."""
    first_name, first_text = _script(jobs[0])
    found = []
    for job in jobs[1:]:
        name, text = _script(job)
        if first_text is not None and text is not None and text != first_text:
            found.append({"from": jobs[0].pk, "to": job.pk, "diff": "".join(difflib.unified_diff(
                first_text.splitlines(keepends=True), text.splitlines(keepends=True),
                fromfile=f"job {jobs[0].pk}: {first_name}", tofile=f"job {job.pk}: {name}"))})
    return found


def comparison(jobs, now=None):
    """What the compare page and API show of `jobs` (in the order given)."""
    now = now or timezone.now()
    fields = [_fields(job) for job in jobs]
    names = list(dict.fromkeys(name for row in fields for name in row))
    differs = [name for name in names if len({row.get(name, "") for row in fields}) > 1]
    series = curves([job.pk for job in jobs])
    rows = []
    for job, row in zip(jobs, fields):
        end = job.finished_at or (now if job.started_at else None)
        metrics = {}
        for name, per_job in series.items():
            points = per_job.get(job.pk)
            if points:
                values = [value for _, value in points]
                metrics[name] = {"last": values[-1], "best": (min if better(name) == "min" else max)(values),
                                 "better": better(name)}
        rows.append({
            "id": job.pk, "name": job.name, "state": job.state,
            "fields": {name: row.get(name, "") for name in names},
            "duration_seconds": (end - job.started_at).total_seconds() if job.started_at and end else None,
            "gpu_hours": accounting.job_gpu_seconds(job, now) / 3600 if job.started_at else 0.0,
            "metrics": metrics,
        })
    return {
        "jobs": rows, "fields": names, "differs": differs, "script_diffs": _diffs(jobs),
        "series": {name: {str(job_id): [[step, value] for step, value in points] for job_id, points in per_job.items()}
                   for name, per_job in series.items()},
    }
