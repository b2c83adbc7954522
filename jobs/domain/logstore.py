"""Storing a job's output: per-rank lines with a gap-free seq, and the metric points in them.

append_output() is a compare-and-set on the job's output offset, under the job's row lock: a
batch is stored only if it starts exactly where the stored output ends. Two followers of one
job (a re-attach racing a slow old one) therefore can never store a line twice or skip one.

On PostgreSQL the rows go in with COPY: bulk_create spends most of a batch building model
instances and INSERT parameters, and COPY stores the same rows in about a third of that time.
Other databases (SQLite, the embedded default) use bulk_create. Either way the rows, the row
lock, the offset check and the announcement after commit are the same.
"""
import functools
import io
from typing import NamedTuple

from django.db import connection, transaction
from django.utils import timezone

from runners.output import extract_metrics, first_rank_failure, lines_with_metrics

from jobs.database import on_postgresql
from jobs.domain import logwire
from jobs.domain.live import heard, lines_message, publish_many_later
from jobs.models import Job, LogLine, MetricPoint

# PostgreSQL text cannot hold NUL; a program that prints one must not stop its job's log.
_NUL, _NUL_STANDIN = "\x00", "\ufffd"


def _clean(text):
    return text.replace(_NUL, _NUL_STANDIN) if _NUL in text else text


def _needs_copy_escape(text):
    """Whether `text` holds a character COPY's text format escapes (five substring tests: a
    regex search of the same takes eighteen times as long)."""
    return "\\" in text or "\t" in text or "\n" in text or "\r" in text or _NUL in text


def _copy_text(text):
    """A value in COPY's text format (str.replace chains, which beat str.translate here by 8x)."""
    if not _needs_copy_escape(text):
        return text
    return (text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
            .replace(_NUL, _NUL_STANDIN))


def _copy_texts_of(texts):
    """`texts` as COPY text values: asked once of their join, as a batch's lines mostly need no
    escape (a test per line costs the 64-rank benchmark's follower two thirds of its COPY formatting)."""
    return list(map(_copy_text, texts)) if _needs_copy_escape("".join(texts)) else texts


def append_output(job_id, lines, start, end, splitter_state, follower=None, cursor=None):
    """Store `lines` (runners.output.Line) that came from output bytes [start, end), and the
    runner's `cursor` at `end` if it keeps one.

    Returns False, storing nothing, if the stored output does not end at `start` or another
    follower holds the job; the caller should stop following.
    """
    now = timezone.now()
    with transaction.atomic():
        # The fields read as values, and written with one UPDATE: no model instance to build and
        # save on each batch (that would take a third of the time of a worker following hundreds of jobs).
        job = (Job.objects.select_for_update().filter(pk=job_id).values(*HELD_FIELDS).first())
        if not takes(job, start, follower):
            return False
        rows, points, changed = rows_of(job_id, job, lines, now)
        if on_postgresql():
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


class Prepared(NamedTuple):
    """A batch of one job's lines made ready to store from seq `first_seq` on: its log rows (the
    job id first, as COPY takes them), metric points, the first rank failure the launcher
    reported in it, and on PostgreSQL the COPY text of both. A follower prepares its batch
    while the writer stores the one before it (jobs.domain.logbatch)."""

    first_seq: int
    rows: list
    points: list
    failure: tuple | None
    copy_lines: str | None
    copy_points: str | None

    def changes(self, job):
        """The job's fields (HELD_FIELDS, read under its row lock) once this batch is stored."""
        changed = {"next_seq": self.first_seq + len(self.rows)}
        # An elastic job's ranks end on every shrink (Horovod stops them: "Process 3 exit with
        # status code 134"); that is no failure, so only a fixed job's first rank exit is kept.
        if self.failure and job["failed_rank"] is None and not job["max_gpus"]:
            changed["failed_rank"], changed["exit_code"] = self.failure
        return changed


def prepare(job_id, lines, first_seq, now, copy_text=None):
    """The Prepared batch of `lines` (runners.output.Line) from seq `first_seq` on; lines without
    a time of their own get `now`. `copy_text`: make the COPY text (default: on PostgreSQL).

    Made column by column, with no Python step per line where a batch's lines share what they
    are (a loop over every line here would take a third of a 64-rank job's follower's time)."""
    if lines:
        ranks, streams, texts, stamps = zip(*lines)
    else:
        ranks = streams = texts = stamps = ()
    if _NUL in "".join(texts):
        texts = [_clean(text) for text in texts]      # one clean text for the database and the viewers
    if stamps.count(None) == len(stamps):
        times = [now] * len(lines)
    else:
        times = [now if ts is None else timezone.make_aware(ts) if timezone.is_naive(ts) else ts for ts in stamps]
    rows = list(zip([job_id] * len(lines), range(first_seq, first_seq + len(lines)), ranks, streams, times, texts))
    points = []
    for index in lines_with_metrics(texts):
        seq, rank, ts = first_seq + index, ranks[index], times[index]
        for metric in extract_metrics(texts[index]):
            step = metric.step if metric.step is not None else seq
            points.append((job_id, rank, seq, step, _clean(metric.name), metric.value, ts))
    failure = None
    if None in ranks:
        failure = first_rank_failure([texts[index] for index, rank in enumerate(ranks) if rank is None])
    if copy_text is None:
        copy_text = on_postgresql()
    texts = copy_texts(rows, points, now) if copy_text else (None, None)
    return Prepared(first_seq, rows, points, failure, *texts)


def rows_of(job_id, job, lines, now):
    """(log rows, metric points, job fields changed) of `lines` stored after `job` (its
    HELD_FIELDS)."""
    made = prepare(job_id, lines, job["next_seq"], now, copy_text=False)
    return made.rows, made.points, made.changes(job)


def announce_after_commit(job_id, rows, points):
    if rows:
        transaction.on_commit(lambda: publish_many_later(lambda: announcements(job_id, rows, points)), robust=True)


# A push's lines, about (their text): a large batch goes out as several pushes, each small enough
# to carry its lines. One push for a 1 MiB chunk is too large to travel, and every viewer would
# read the whole chunk back from the database (BENCHMARKS.md, ingest).
PUSH_TEXT_BYTES = 256 << 10
_LINE_OVERHEAD = 100                    # a line's JSON beside its text: seq, rank, stream, time


def announcements(job_id, rows, points):
    """[(job id, message)] telling the job's viewers about stored rows, with the lines themselves
    (encoded once here), in pushes of about PUSH_TEXT_BYTES each, in seq order. Where nobody
    watches the job, only where they end: that push is left out (jobs.domain.audience)."""
    if not heard(job_id):
        return [(job_id, lines_message(rows[-1][1]))]
    messages, start, size, taken = [], 0, 0, 0
    for end, row in enumerate(rows):
        size += len(row[5]) + _LINE_OVERHEAD
        if size >= PUSH_TEXT_BYTES or end == len(rows) - 1:
            last, first_point = row[1], taken
            while taken < len(points) and points[taken][2] <= last:     # points are in seq order
                taken += 1
            messages.append(_push(job_id, rows[start:end + 1], points[first_point:taken]))
            start, size = end + 1, 0
    return messages


def _push(job_id, rows, points):
    lines = [row[1:] for row in rows]           # (seq, rank, stream, ts, text), clean (rows_of)
    points = [(seq, name, rank, step, value, ts) for _, rank, seq, step, name, value, ts in points]
    return job_id, lines_message(rows[-1][1], rows[0][1] - 1, logwire.lines_message(lines),
                                 logwire.metrics_message(points))


def _create_rows(rows, points):
    LogLine.objects.bulk_create(
        [LogLine(job_id=job_id, seq=seq, rank=rank, stream=stream, ts=ts, text=text)
         for job_id, seq, rank, stream, ts, text in rows], batch_size=2000)
    MetricPoint.objects.bulk_create(
        [MetricPoint(job_id=job_id, rank=rank, seq=seq, step=step, name=name, value=value, ts=ts)
         for job_id, rank, seq, step, name, value, ts in points], batch_size=2000)


@functools.cache
def _copy_statement(model, *names):
    """COPY's statement for `names` of `model` (made once: quoting the same names each time
    would take a tenth of a one-line writer round)."""
    columns = ", ".join(connection.ops.quote_name(model._meta.get_field(name).column) for name in names)
    return f"COPY {connection.ops.quote_name(model._meta.db_table)} ({columns}) FROM STDIN"


def _copy(cursor, statement, text):
    # Lone surrogates (possible in a metric name read from JSON) cannot be encoded: "?" instead.
    cursor.copy_expert(statement, io.BytesIO(text.encode("utf-8", "replace")), size=1 << 20)


def copy_texts(rows, points, now):
    """The COPY text (tab separated, \\N for NULL, backslash escapes) of rows and points as
    prepare() makes them, of one job or many."""
    default_ts = now.isoformat()
    null = "\\N"
    texts = _copy_texts_of([row[5] for row in rows])
    lines_text = "".join([
        f"{job_id}\t{seq}\t{null if rank is None else rank}\t{stream}\t"
        f"{default_ts if ts is now else ts.isoformat()}\t{text}\n"
        for (job_id, seq, rank, stream, ts, _), text in zip(rows, texts)])
    names = _copy_texts_of([point[4] for point in points])
    points_text = "".join([
        f"{job_id}\t{null if rank is None else rank}\t{seq}\t{step}\t{name}\t"
        f"{value!r}\t{default_ts if ts is now else ts.isoformat()}\n"
        for (job_id, rank, seq, step, _, value, ts), name in zip(points, names)])
    return lines_text, points_text


def copy_rows(rows, points, now):
    copy(*copy_texts(rows, points, now))


def copy(lines_text, points_text):
    """COPY log rows and metric points in copy_texts()'s text."""
    with connection.cursor() as cursor:
        if lines_text:
            _copy(cursor, _copy_statement(LogLine, "job", "seq", "rank", "stream", "ts", "text"), lines_text)
        if points_text:
            _copy(cursor, _copy_statement(MetricPoint, "job", "rank", "seq", "step", "name", "value", "ts"),
                  points_text)


def last_lines(job, rank=None, count=5):
    """The last `count` lines of a rank (stderr first, as that is where tracebacks go)."""
    lines = LogLine.objects.filter(job=job, rank=rank)
    stderr = list(lines.filter(stream="stderr").order_by("-seq")[:count])
    chosen = stderr or list(lines.order_by("-seq")[:count])
    return [line.text for line in reversed(chosen)]
