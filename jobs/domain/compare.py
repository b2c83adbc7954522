"""Jobs side by side: what differs between them (image, launcher, GPUs, arguments, environment
values, script or project: which files, and how), each metric's curve per job (the mean of its ranks at each step), its last and
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
from runners import projects

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
    """(what the job runs, as the compare table names it: a script, or a project's snapshot and
    entry point; its files {path: bytes}, or None for a script inside the image)."""
    if job.project_id:
        origin = f" at {job.project_commit[:12]}" if job.project_commit else ""
        label = f"project {job.project.sha256[:12]}{origin}: {job.entry_point}"
        return label, {file.path: file.content for file in projects.unpack(bytes(job.project.archive))}
    if job.script_id:
        return f"{job.script.name} ({job.script.sha256[:12]})", {job.script.name: job.script.content.encode()}
    return job.script_path, None


def _fields(job, label):
    """What a job was started with, as the compare table shows it."""
    return {
        "image": job.image.name, "launcher": job.launcher,
        "gpus": f"{job.gpus}..{job.max_gpus}" if job.max_gpus else str(job.gpus),
        "backend": job.backend, "args": " ".join(job.args),
        **{f"env {name}": str(value) for name, value in sorted(job.env.items())},
        "script": label,
    }


def _text(content):
    try:
        return content.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def _diff(first, other, first_job, other_job):
    """(unified diff text, {"added", "removed", "changed"}) of two jobs' files. Two one-file
    scripts are diffed whatever their names; projects file by file, by path."""
    if len(first) == 1 and len(other) == 1 and first.keys() != other.keys():
        (first_name, first_content), = first.items()
        (other_name, other_content), = other.items()
        pairs, summary = [(first_name, other_name)], {"added": [], "removed": [], "changed": [other_name]}
        first, other = {first_name: first_content}, {other_name: other_content}
    else:
        paths = sorted(set(first) | set(other))
        summary = {"added": [p for p in paths if p not in first], "removed": [p for p in paths if p not in other],
                   "changed": [p for p in paths if p in first and p in other and first[p] != other[p]]}
        pairs = [(p if p in first else None, p if p in other else None) for p in paths
                 if p not in first or p not in other or first[p] != other[p]]
    text = []
    for old, new in pairs:
        before = _text(first[old]) if old else []
        after = _text(other[new]) if new else []
        label_old = f"job {first_job.pk}: {old}" if old else "/dev/null"
        label_new = f"job {other_job.pk}: {new}" if new else "/dev/null"
        if before is None or after is None:
            text.append(f"Binary files {label_old} and {label_new} differ\n")
        else:
            text.append("".join(difflib.unified_diff(before, after, fromfile=label_old, tofile=label_new)))
    return "".join(text), summary


def _diffs(jobs, code):
    """Each job's files against the first job's, where they differ: its unified diff and which
    files were added, removed or changed."""
    found = []
    first = code[0][1]
    for job, (_, files) in zip(jobs[1:], code[1:]):
        if first is not None and files is not None and files != first:
            diff, summary = _diff(first, files, jobs[0], job)
            found.append({"from": jobs[0].pk, "to": job.pk, "diff": diff, "files": summary})
    return found


def comparison(jobs, now=None):
    """What the compare page and API show of `jobs` (in the order given)."""
    now = now or timezone.now()
    code = [_script(job) for job in jobs]
    fields = [_fields(job, label) for job, (label, _) in zip(jobs, code)]
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
        "jobs": rows, "fields": names, "differs": differs, "script_diffs": _diffs(jobs, code),
        "series": {name: {str(job_id): [[step, value] for step, value in points] for job_id, points in per_job.items()}
                   for name, per_job in series.items()},
    }
