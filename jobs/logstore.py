"""Storing a job's output: per-rank lines with a gap-free seq, and the metric points in them.

append_output() is a compare-and-set on the job's output offset, under the job's row lock: a
batch is stored only if it starts exactly where the stored output ends. Two followers of one
job (a re-attach racing a slow old one) therefore can never store a line twice or skip one.
"""
from django.db import transaction
from django.utils import timezone

from runners.output import extract_metrics, parse_rank_failure

from .live import publish_lines
from .models import Job, LogLine, MetricPoint


def append_output(job_id, lines, start, end, splitter_state, follower=None):
    """Store `lines` (runners.output.Line) that came from output bytes [start, end).

    Returns False, storing nothing, if the stored output does not end at `start` or another
    follower holds the job; the caller should stop following.
    """
    now = timezone.now()
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.output_offset != start or (follower and job.follower and job.follower != follower):
            return False
        seq = job.next_seq
        rows, points = [], []
        for line in lines:
            ts = timezone.make_aware(line.ts) if line.ts and timezone.is_naive(line.ts) else (line.ts or now)
            rows.append(LogLine(job_id=job_id, seq=seq, rank=line.rank, stream=line.stream, ts=ts, text=line.text))
            for metric in extract_metrics(line.text):
                step = metric.step if metric.step is not None else seq
                points.append(MetricPoint(job_id=job_id, rank=line.rank, seq=seq, step=step, name=metric.name,
                                          value=metric.value, ts=ts))
            if line.rank is None and job.failed_rank is None:
                failure = parse_rank_failure(line.text)
                if failure:
                    job.failed_rank, job.exit_code = failure
            seq += 1
        LogLine.objects.bulk_create(rows, batch_size=2000)
        MetricPoint.objects.bulk_create(points, batch_size=2000)
        job.next_seq = seq
        job.output_offset = end
        job.output_state = splitter_state
        job.follower_heartbeat = now
        job.save(update_fields=["next_seq", "output_offset", "output_state", "follower_heartbeat",
                                "failed_rank", "exit_code"])
        if rows:
            transaction.on_commit(lambda: publish_lines(job_id, seq - 1))
    return True


def last_lines(job, rank=None, count=5):
    """The last `count` lines of a rank (stderr first, as that is where tracebacks go)."""
    lines = LogLine.objects.filter(job=job, rank=rank)
    stderr = list(lines.filter(stream="stderr").order_by("-seq")[:count])
    chosen = stderr or list(lines.order_by("-seq")[:count])
    return [line.text for line in reversed(chosen)]
