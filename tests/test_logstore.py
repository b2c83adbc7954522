"""What a follower stores is what its lines say, line by line: any text (tabs, backslashes, NUL,
line ends: COPY's escapes), each line's time, rank and seq, the metric points extract_metrics
finds in each line, and the first rank failure the launcher reports. logstore.prepare makes a
batch column by column and escapes it once per batch; this checks it against the database."""
from datetime import datetime, timedelta

from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.domain.logstore import append_output
from jobs.models import Job, LogLine, MetricPoint
from runners.output import Line, extract_metrics, parse_rank_failure

TEXTS = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="a\t\\\x00\n\r é", max_size=12),
    st.sampled_from(['RINGMASTER_METRIC {"step": 4, "loss": 0.25, "acc": 0.5}', 'RINGMASTER_METRIC {"lr": 1e-3}',
                     'RINGMASTER_METRIC {"na\\u0000me\\t\\\\": 2}', 'RINGMASTER_METRIC {"\\ud800lr": 3}',
                     "Iter #7: 81.5 img/sec per GPU",
                     "Process 3 exit with status code 2.", "Process 1 exit with status code 9."]),
)


LINES = st.lists(st.builds(
    Line,
    rank=st.one_of(st.none(), st.integers(0, 63)),
    stream=st.sampled_from(["stdout", "stderr"]),
    text=TEXTS,
    ts=st.one_of(st.none(), st.datetimes(min_value=datetime(2026, 1, 2), max_value=datetime(2026, 12, 30))),
), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=LINES, lines=LINES)
def test_stored_lines_points_and_failure_are_what_each_line_says(image, script, alice, before, lines):
    job = Job.objects.create(owner=alice, image=image, gpus=1, script=script, time_limit_minutes=5)
    assert_stored_as_each_line_says(append_output, job, before, lines)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=LINES, lines=LINES)
def test_the_workers_group_writer_stores_what_each_line_says(transactional_db, image, script, alice, before, lines):
    """The same through the worker's group writer, as followers store (the batch prepared under
    the job's row lock, the job's seq, offset and splitter state in the round's one UPDATE)."""
    from jobs.domain import dbpool, logbatch

    job = Job.objects.create(owner=alice, image=image, gpus=1, script=script, time_limit_minutes=5)
    try:
        assert_stored_as_each_line_says(logbatch.append, job, before, lines)
    finally:
        dbpool.pool().close_all()           # the test database is dropped at the end of the session


def stored_name(name):
    """A metric's name as stored: NUL replaced, a lone surrogate (JSON's "\\ud800") made "?"."""
    return name.replace("\x00", "\ufffd").encode("utf-8", "replace").decode()


def assert_stored_as_each_line_says(store, job, before, lines):
    assert store(job.pk, before, 0, 10, {})                  # seqs go on from the batch before
    started = timezone.now()
    assert store(job.pk, lines, 10, 20, {"at": 20})
    ended = timezone.now()

    first = len(before)
    stored = list(LogLine.objects.filter(job=job, seq__gte=first).order_by("seq")
                  .values_list("seq", "rank", "stream", "ts", "text"))
    assert [(seq, rank, stream, text) for seq, rank, stream, _, text in stored] == [
        (first + index, line.rank, line.stream, line.text.replace("\x00", "\ufffd"))
        for index, line in enumerate(lines)]
    for (_, _, _, ts, _), line in zip(stored, lines):
        if line.ts is None:
            assert started - timedelta(seconds=1) <= ts <= ended
        else:
            assert ts == timezone.make_aware(line.ts)
    unstamped = {ts for (_, _, _, ts, _), line in zip(stored, lines) if line.ts is None}
    assert len(unstamped) <= 1                                 # one time for the batch's unstamped lines

    points = list(MetricPoint.objects.filter(job=job, seq__gte=first).order_by("id")
                  .values_list("seq", "rank", "step", "name", "value"))
    assert points == [
        (first + index, line.rank, first + index if metric.step is None else metric.step,
         stored_name(metric.name), metric.value)
        for index, line in enumerate(lines) for metric in extract_metrics(line.text.replace("\x00", "\ufffd"))]

    job.refresh_from_db()
    failures = [parse_rank_failure(line.text) for line in before + lines if line.rank is None]
    assert (job.failed_rank, job.exit_code) == next(filter(None, failures), (None, None))
    assert (job.next_seq, job.output_offset, job.output_state) == (len(before) + len(lines), 20, {"at": 20})
