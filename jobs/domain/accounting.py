"""Accounting: GPU-seconds per job (GPUs x running time), and per user, group, backend and day.

A job's running time is started_at (RUNNING) to finished_at, whatever the end: succeeded, failed
(a crash, a time limit) or cancelled while running; jobs.domain.states.transition records both times and
`gpu_seconds` in the same row and transaction as the final state. A job that never ran (cancelled
while queued, a launch that failed) used nothing. A running job counts up to now.

Why a query over the job table and no separate UsageDay table: the job rows are already the
record, written once with the state change, so usage survives restarts and there is nothing to
keep in step (no double count when a finish is retried, no repair after a crash). Days are made by
cutting each job's running interval at midnight (settings.TIME_ZONE), so a three-day job counts on
each of its three days. The cost is one indexed query over the jobs that ran in the range; with
years of a busy cluster on one page, a summary table filled from these same functions would be
the next step.
"""
import csv
from collections import defaultdict
from datetime import datetime, time, timedelta

from django.db.models import Q
from django.utils import timezone

from jobs.models import Job

NO_GROUP = "(no group)"


def job_gpu_seconds(job, now=None):
    """GPU-seconds a job has used: recorded once it ended, so far while it runs."""
    if job.started_at is None:
        return 0.0
    if job.finished_at is not None:
        return job.gpu_seconds
    return max(((now or timezone.now()) - job.started_at).total_seconds(), 0.0) * job.gpus


def day_start(day):
    return timezone.make_aware(datetime.combine(day, time.min))


def last_days(count, today=None):
    """The `count` days ending today (local dates), oldest first."""
    today = today or timezone.localdate()
    return [today - timedelta(days=offset) for offset in range(count - 1, -1, -1)]


def ran_between(start, end, jobs=None):
    """Jobs whose running time overlaps [start, end)."""
    jobs = Job.objects.all() if jobs is None else jobs
    return (jobs.filter(started_at__isnull=False, started_at__lt=end)
            .filter(Q(finished_at__isnull=True) | Q(finished_at__gt=start)))


def daily_usage(first_day, last_day, jobs=None, now=None):
    """{(day, user, group, backend): GPU-seconds} for the days first_day..last_day (inclusive).

    `jobs` narrows the jobs counted (e.g. one owner's). Each job's interval is cut at midnight.
    """
    now = now or timezone.now()
    start, end = day_start(first_day), min(day_start(last_day + timedelta(days=1)), now)
    usage = defaultdict(float)
    rows = (ran_between(start, end, jobs).order_by()
            .values_list("owner__username", "charged_group__name", "backend", "gpus", "started_at", "finished_at"))
    for user, group, backend, gpus, started, finished in rows.iterator(chunk_size=5000):
        moment, stop = max(started, start), min(finished or now, end)
        while moment < stop:
            day = timezone.localdate(moment)
            boundary = min(day_start(day + timedelta(days=1)), stop)
            usage[(day, user, group or NO_GROUP, backend)] += (boundary - moment).total_seconds() * gpus
            moment = boundary
    return usage


def totals(usage, by):
    """Sum daily usage by some of its key parts: by=("group",), ("day", "group"), ...

    Returns {key: GPU-seconds}, the key a tuple of the parts asked for.
    """
    names = ("day", "user", "group", "backend")
    picks = [names.index(name) for name in by]
    summed = defaultdict(float)
    for key, seconds in usage.items():
        summed[tuple(key[i] for i in picks)] += seconds
    return summed


def series_by_group(usage, days):
    """{"days": [iso dates], "series": {group: [GPU-hours per day]}} for a chart."""
    per_day = totals(usage, ("group", "day"))
    groups = sorted({group for group, _ in per_day}, key=lambda g: (g == NO_GROUP, g))
    return {
        "days": [day.isoformat() for day in days],
        "series": {group: [round(per_day.get((group, day), 0.0) / 3600, 3) for day in days] for group in groups},
    }


CSV_HEADER = ["day", "user", "group", "backend", "gpu_hours", "gpu_seconds"]


def write_csv(usage, stream):
    writer = csv.writer(stream)
    writer.writerow(CSV_HEADER)
    for (day, user, group, backend), seconds in sorted(usage.items()):
        writer.writerow([day.isoformat(), user, "" if group == NO_GROUP else group, backend,
                         f"{seconds / 3600:.4f}", f"{seconds:.1f}"])
