"""TensorBoard scalars as metric points: what a job's SummaryWriter writes under its output
folder (runners.tbscalars) is stored beside its RINGMASTER_METRIC points, named by tag, with no
change to the script. Beat reads the running jobs' folders every RINGMASTER_TENSORBOARD_SECONDS
(jobs.tasks.scrape_tensorboard), and once more when a job's artifacts are collected at its end.

A worker keeps one reader per job, so each read costs only the new events. A tag's steps are
stored once, in rising order: a reader made afresh (another worker, a restart) or a file read
again (brought back anew from an instance) skips the steps already stored. The points carry
seq TB_SEQ: they come from no log line, so they stand outside the websocket's line sequence.
GET /api/jobs/<id>/metrics/ shows them; once stored, they are pushed to the job's viewers
(live.publish_points), and a viewer that connects with ?tb_since=<id> (the job page's mark:
last_id when the page was made) is sent those stored after that id (jobs.web.consumers).
"""
import math
import threading
from datetime import datetime, timezone

from django.db import transaction
from django.db.models import Max

from jobs.domain import artifacts, live
from jobs.models import Job, MetricPoint, State
from runners.tbscalars import ScalarReader

TB_SEQ = -1
_readers = {}                 # job id -> (folder, ScalarReader, {tag: last stored step})
_lock = threading.Lock()


def _reader(job, folder):
    entry = _readers.get(job.pk)
    if entry is None or entry[0] != folder:
        if entry is not None:
            entry[1].close()
        stored = (MetricPoint.objects.filter(job_id=job.pk, seq=TB_SEQ).values("name")
                  .annotate(last=Max("step")).values_list("name", "last"))
        entry = _readers[job.pk] = (folder, ScalarReader(folder), dict(stored))
    return entry


def scrape(job, last=False):
    """Store the scalars `job`'s event files gained since the last look; `last`: the job has
    ended, forget its reader. Returns how many points were stored."""
    folder = artifacts.root(job)
    with _lock:
        if folder is None:
            entry = _readers.pop(job.pk, None)
            if entry is not None:
                entry[1].close()
            return 0
        _, reader, stored = _reader(job, folder)
        try:
            points = reader.read()
        finally:
            if last:
                reader.close()
                _readers.pop(job.pk, None)
        fresh = [MetricPoint(job_id=job.pk, rank=None, seq=TB_SEQ, step=point.step, name=point.tag[:100],
                             value=point.value, ts=datetime.fromtimestamp(point.wall_time, tz=timezone.utc))
                 for point in points
                 if point.step > stored.get(point.tag[:100], -math.inf) and math.isfinite(point.value)]
        MetricPoint.objects.bulk_create(fresh)
        for point in fresh:
            stored[point.name] = max(point.step, stored.get(point.name, -math.inf))
    if fresh:
        rows = [(point.pk, point.seq, point.name, point.rank, point.step, point.value, point.ts) for point in fresh]
        transaction.on_commit(lambda: live.publish_points(job.pk, rows))
    return len(fresh)


def scrape_running():
    """One look at every running job's event files."""
    return sum(scrape(job) for job in Job.objects.filter(state=State.RUNNING, artifacts_deleted_at__isnull=True))


def last_id(job_id):
    """The id of the job's last stored TensorBoard point, 0 if none: a viewer's mark (tb_since)."""
    return (MetricPoint.objects.filter(job_id=job_id, seq=TB_SEQ).aggregate(last=Max("id"))["last"] or 0)


def stored_after(job_id, after, limit):
    """Up to `limit` of the job's TensorBoard points with an id past `after`, in id order, as
    (id, seq, name, rank, step, value, ts) rows."""
    return list(MetricPoint.objects.filter(job_id=job_id, seq=TB_SEQ, id__gt=after).order_by("id")
                .values_list("id", "seq", "name", "rank", "step", "value", "ts")[:limit])
