"""Storing a job's output: per-rank lines with a gap-free seq, and the metric points in them.

append_output() is a compare-and-set on the job's output offset, under the job's row lock: a
batch is stored only if it starts exactly where the stored output ends. Two followers of one
job (a re-attach racing a slow old one) therefore can never store a line twice or skip one.

On PostgreSQL the rows go in with COPY: bulk_create spent most of a batch building model
instances and INSERT parameters, and COPY stores the same rows in about a third of that time
(BENCHMARKS.md, "ingest"). Other databases (SQLite, the embedded default) use bulk_create. Either
way the rows, the row lock, the offset check and the announcement after commit are the same.
"""
import io

from django.db import connection, transaction
from django.utils import timezone

from runners.output import extract_metrics, parse_rank_failure

from jobs.domain import logwire
from jobs.domain.live import lines_message, publish
from jobs.models import Job, LogLine, MetricPoint

# PostgreSQL text cannot hold NUL; a program that prints one must not stop its job's log.
_NUL, _NUL_STANDIN = "\x00", "\ufffd"


def _clean(text):
    return text.replace(_NUL, _NUL_STANDIN) if _NUL in text else text


def _copy_text(text):
    """A value in COPY's text format (str.replace chains beat str.translate here by 8x)."""
    return (text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
            .replace(_NUL, _NUL_STANDIN))


def append_output(job_id, lines, start, end, splitter_state, follower=None, cursor=None):
    """Store `lines` (runners.output.Line) that came from output bytes [start, end), and the
    runner's `cursor` at `end` if it keeps one.

    Returns False, storing nothing, if the stored output does not end at `start` or another
    follower holds the job; the caller should stop following.
    """
    now = timezone.now()
    with transaction.atomic():
        # The fields read as values, and written with one UPDATE: no model instance to build and
        # save on each batch (a worker following hundreds of jobs spent a third of its time there).
        job = (Job.objects.select_for_update().filter(pk=job_id).values(*HELD_FIELDS).first())
        if not takes(job, start, follower):
            return False
        rows, points, changed = rows_of(job_id, job, lines, now)
        if connection.vendor == "postgresql":
            copy_rows(rows, points, now)
        else:
            _create_rows(rows, points)
        changed.update(output_offset=end, output_state=splitter_state)
        if cursor is not None:
            changed["follow_cursor"] = cursor
        Job.objects.filter(pk=job_id).update(**changed)
        announce_after_commit(job_id, rows, points)
    return True


HELD_FIELDS = ("pk", "output_offset", "follower", "next_seq", "failed_rank", "exit_code", "max_gpus")


def takes(job, start, follower):
    """Whether a batch from output byte `start`, by `follower`, is the next one of `job` (its
    HELD_FIELDS, read under its row lock): the stored output ends there and no other follower
    holds the job."""
    return job is not None and job["output_offset"] == start and not (
        follower and job["follower"] and job["follower"] != follower)


def rows_of(job_id, job, lines, now):
    """(log rows, metric points, job fields changed) of `lines` stored after `job` (its
    HELD_FIELDS); the rows carry the job id first, as COPY takes them."""
    seq = job["next_seq"]
    changed = {}
    rows, points = [], []
    for line in lines:
        ts = timezone.make_aware(line.ts) if line.ts and timezone.is_naive(line.ts) else (line.ts or now)
        rows.append((job_id, seq, line.rank, line.stream, ts, line.text))
        for metric in extract_metrics(line.text):
            step = metric.step if metric.step is not None else seq
            points.append((job_id, line.rank, seq, step, metric.name, metric.value, ts))
        # An elastic job's ranks end on every shrink (Horovod stops them: "Process 3 exit with
        # status code 134"); that is no failure, so only a fixed job's first rank exit is kept.
        if line.rank is None and job["failed_rank"] is None and not job["max_gpus"] and not changed:
            failure = parse_rank_failure(line.text)
            if failure:
                changed["failed_rank"], changed["exit_code"] = failure
        seq += 1
    changed["next_seq"] = seq
    return rows, points, changed


def announce_after_commit(job_id, rows, points):
    if rows:
        transaction.on_commit(lambda: _announce(job_id, rows, points), robust=True)


def _announce(job_id, rows, points):
    publish(*announcement(job_id, rows, points))


def announcement(job_id, rows, points):
    """(job id, message) telling the job's viewers about stored rows, with the lines themselves
    (encoded once here)."""
    rows = [(seq, rank, stream, ts, _clean(text)) for _, seq, rank, stream, ts, text in rows]
    points = [(seq, _clean(name), rank, step, value, ts) for _, rank, seq, step, name, value, ts in points]
    return job_id, lines_message(rows[-1][0], rows[0][0] - 1, logwire.lines_message(rows),
                                 logwire.metrics_message(points))


def _create_rows(rows, points):
    LogLine.objects.bulk_create(
        [LogLine(job_id=job_id, seq=seq, rank=rank, stream=stream, ts=ts, text=_clean(text))
         for job_id, seq, rank, stream, ts, text in rows], batch_size=2000)
    MetricPoint.objects.bulk_create(
        [MetricPoint(job_id=job_id, rank=rank, seq=seq, step=step, name=_clean(name), value=value, ts=ts)
         for job_id, rank, seq, step, name, value, ts in points], batch_size=2000)


def _columns(model, *names):
    return ", ".join(connection.ops.quote_name(model._meta.get_field(name).column) for name in names)


def _copy(cursor, model, columns, text):
    # Lone surrogates (possible in a metric name read from JSON) cannot be encoded: "?" instead.
    data = io.BytesIO(text.encode("utf-8", "replace"))
    cursor.copy_expert(f"COPY {connection.ops.quote_name(model._meta.db_table)} ({columns}) FROM STDIN", data,
                       size=1 << 20)


def copy_rows(rows, points, now):
    """COPY the rows of rows_of (of one job or many; text format: tab separated, \\N for NULL,
    backslash escapes)."""
    default_ts = now.isoformat()

    def ts_text(ts):
        return default_ts if ts is now else ts.isoformat()

    def rank_text(rank):
        return "\\N" if rank is None else str(rank)

    with connection.cursor() as cursor:
        if rows:
            _copy(cursor, LogLine, _columns(LogLine, "job", "seq", "rank", "stream", "ts", "text"), "".join(
                f"{job_id}\t{seq}\t{rank_text(rank)}\t{stream}\t{ts_text(ts)}\t{_copy_text(text)}\n"
                for job_id, seq, rank, stream, ts, text in rows))
        if points:
            _copy(cursor, MetricPoint, _columns(MetricPoint, "job", "rank", "seq", "step", "name", "value", "ts"),
                  "".join(f"{job_id}\t{rank_text(rank)}\t{seq}\t{step}\t{_copy_text(name)}\t"
                          f"{value!r}\t{ts_text(ts)}\n"
                          for job_id, rank, seq, step, name, value, ts in points))


def last_lines(job, rank=None, count=5):
    """The last `count` lines of a rank (stderr first, as that is where tracebacks go)."""
    lines = LogLine.objects.filter(job=job, rank=rank)
    stderr = list(lines.filter(stream="stderr").order_by("-seq")[:count])
    chosen = stderr or list(lines.order_by("-seq")[:count])
    return [line.text for line in reversed(chosen)]
