"""Accounting: GPU-seconds per job (GPUs x running time), and per user, group, backend and day.

A job's running time is started_at (RUNNING) to finished_at, whatever the end: succeeded, failed
(a crash, a time limit) or cancelled while running; jobs.domain.states.transition records both times and
`gpu_seconds` in the same row and transaction as the final state. A job that never ran (cancelled
while queued, a launch that failed) used nothing. A running job counts up to now. A job whose size
changed while it ran counts the size it had over time, from its events that carry one: an elastic
job's resizes, and a requeued job's time back in the cluster's queue (size 0) until it ran again.

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

from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from jobs.models import Job, JobEvent

NO_GROUP = "(no group)"


def segments(started, end, gpus, changes=()):
    """[(from, to, GPUs)] of a job that ran from `started` to `end`, starting at `gpus` GPUs and
    changing size at each (moment, GPUs) of `changes` (an elastic job's; none for a fixed one)."""
    found, moment, current = [], started, gpus
    for at, size in sorted(changes):
        if at >= end:
            break
        if at > moment:
            found.append((moment, at, current))
            moment = at
        current = size
    if end > moment:
        found.append((moment, end, current))
    return found


def sized_over_time():
    """The jobs whose GPUs changed while they ran (a Q over Job): elastic jobs, and jobs the
    cluster's queue stopped for a while (an event of size 0). The rest held `gpus` throughout."""
    return Q(max_gpus__isnull=False) | Exists(JobEvent.objects.filter(job=OuterRef("pk"), gpus=0))


def size_changes(job_ids):
    """{job id: [(moment, GPUs)]}: the size history of elastic jobs (their events that carry one)."""
    changes = defaultdict(list)
    rows = JobEvent.objects.filter(job_id__in=list(job_ids), gpus__isnull=False).order_by("ts", "id")
    for job_id, at, size in rows.values_list("job_id", "ts", "gpus"):
        changes[job_id].append((at, size))
    return changes


def job_gpu_seconds(job, now=None):
    """GPU-seconds a job has used: recorded once it ended, so far while it runs. An elastic job
    counts the GPUs it held over time, not its largest size."""
    if job.started_at is None:
        return 0.0
    if job.finished_at is not None and job.gpu_seconds:
        return job.gpu_seconds
    end = job.finished_at or now or timezone.now()
    changes = size_changes([job.pk]).get(job.pk, [])
    return sum((b - a).total_seconds() * size for a, b, size in segments(job.started_at, end, job.gpus, changes))


def running_seconds(job, now=None):
    """Seconds the job has run: from its first start to its end (or now), less the time the
    cluster's queue held it after a preemption or eviction (its size-0 stretches). What its time
    limit counts."""
    if job.started_at is None:
        return 0.0
    end = job.finished_at or now or timezone.now()
    changes = size_changes([job.pk]).get(job.pk, [])
    return sum((b - a).total_seconds() for a, b, size in segments(job.started_at, end, job.gpus, changes) if size)


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
    ran = ran_between(start, end, jobs).order_by()
    changes = size_changes(ran.filter(sized_over_time()).values_list("pk", flat=True))
    rows = ran.values_list("pk", "owner__username", "charged_group__name", "backend", "gpus", "started_at",
                           "finished_at")
    for pk, user, group, backend, gpus, started, finished in rows.iterator(chunk_size=5000):
        for first, last, size in segments(started, finished or now, gpus, changes.get(pk, ())):
            moment, stop = max(first, start), min(last, end)
            while moment < stop:
                day = timezone.localdate(moment)
                boundary = min(day_start(day + timedelta(days=1)), stop)
                usage[(day, user, group or NO_GROUP, backend)] += (boundary - moment).total_seconds() * size
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
