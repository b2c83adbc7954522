"""What the jobs a worker process follows print, stored together: one transaction a round.

Each follower stored each batch of its job in a transaction of its own (BEGIN, the job's row
locked and checked, COPY, UPDATE, COMMIT): a worker following 200 jobs that print a line a
second spent 70% of its interpreter's time in those round trips (BENCHMARKS.md §15), and 1,000
jobs were out of reach. Here the followers hand their batches in and wait; one of them (the
first to arrive while no round runs) stores every batch handed in so far, in one transaction:
the jobs' rows locked and checked in one SELECT, every line in one COPY, every job's offset,
seq and cursor in one UPDATE. Then it hands the next round to a follower that waits, if any.

The jobs' rows are locked in id order, as the followers' heartbeat locks them, so the two never
deadlock; a round that meets a deadlock with other work anyway is tried again. A round that
fails otherwise is stored again batch by batch, so that an error raises only in the follower
whose batch fails alone, as append_output's own would have.

Each batch keeps append_output's rule: it is stored only if it starts where its job's stored
output ends and no other follower holds the job (checked under the row lock, in order, so two
batches of one job in a round are checked one after the other); the follower gets False
otherwise, and only its batch is left out. Not on PostgreSQL (the embedded default's SQLite,
one writer anyway), a batch is stored alone with append_output.
"""
import json
import logging
import threading

from django.db import OperationalError, connection, transaction
from django.utils import timezone

from jobs.domain import dbpool, live, logstore
from jobs.models import Job

log = logging.getLogger(__name__)
MAX_ROUND = 500                 # batches stored in one transaction at most
DEADLOCK_ATTEMPTS = 3
DEADLOCK_DETECTED = "40P01"     # PostgreSQL's SQLSTATE


class _Batch:
    __slots__ = ("job_id", "lines", "start", "end", "state", "follower", "cursor", "stored", "error", "lead", "done")

    def __init__(self, job_id, lines, start, end, state, follower, cursor):
        self.job_id, self.lines, self.start, self.end = job_id, lines, start, end
        self.state, self.follower, self.cursor = state, follower, cursor
        self.stored, self.error, self.lead = None, None, False
        self.done = threading.Event()


class GroupWriter:
    def __init__(self):
        self._lock = threading.Lock()
        self._waiting = []
        self._writing = False

    def append(self, job_id, lines, start, end, splitter_state, follower=None, cursor=None):
        """append_output's contract (True: stored; False: nothing stored, stop following), for
        a caller that holds no borrowed database connection: it borrows one only to lead a round."""
        batch = _Batch(job_id, lines, start, end, splitter_state, follower, cursor)
        with self._lock:
            self._waiting.append(batch)
            batch.lead = not self._writing
            self._writing = True
        if not batch.lead:
            batch.done.wait()
        if batch.stored is None and batch.error is None:    # this follower leads a round (its batch is in it)
            self._round()
        if batch.error is not None:
            raise batch.error           # as append_output would have, in this follower's thread
        return batch.stored

    def _round(self):
        with self._lock:
            taken, self._waiting = self._waiting[:MAX_ROUND], self._waiting[MAX_ROUND:]
        try:
            try:
                _store_retrying(taken)
            except Exception:
                # One job's batch must not stop every follower of the round: each alone, so that
                # only a batch that fails by itself raises (in its own follower).
                log.exception("storing %s jobs' output together failed; storing each alone", len(taken))
                for batch in taken:
                    try:
                        _store_retrying([batch])
                    except Exception as exc:
                        batch.error = exc
        finally:
            with self._lock:
                following = self._waiting[0] if self._waiting else None
                self._writing = following is not None
            for batch in taken:
                batch.done.set()
            if following is not None:
                following.done.set()     # it leads the next round (its `stored` is still None)


def _store_retrying(batches):
    for attempt in range(DEADLOCK_ATTEMPTS):
        try:
            with dbpool.borrowed():
                return _store(batches)
        except OperationalError as exc:
            if not _deadlock(exc) or attempt == DEADLOCK_ATTEMPTS - 1:
                raise
            log.warning("storing %s jobs' output: deadlock, trying again", len(batches))


def _deadlock(exc):
    return getattr(exc.__cause__, "pgcode", None) == DEADLOCK_DETECTED


def _store(batches):
    if connection.vendor != "postgresql":
        for batch in batches:
            batch.stored = logstore.append_output(batch.job_id, batch.lines, batch.start, batch.end, batch.state,
                                                  follower=batch.follower, cursor=batch.cursor)
        return
    now = timezone.now()
    accepted, announced = [], []
    with transaction.atomic():
        held = {row["pk"]: row for row in Job.objects.select_for_update().filter(
            pk__anyof=list({batch.job_id for batch in batches})).order_by("pk").values(*logstore.HELD_FIELDS)}
        rows, points, updates = [], [], {}
        for batch in batches:
            job = held.get(batch.job_id)
            if not logstore.takes(job, batch.start, batch.follower):
                continue
            mine, my_points, changed = logstore.rows_of(batch.job_id, job, batch.lines, now)
            rows += mine
            points += my_points
            job.update(changed, output_offset=batch.end)     # a later batch of the job follows this one
            update = updates.setdefault(batch.job_id, {"cursor": None})
            update.update(job, state=batch.state)
            if batch.cursor is not None:
                update["cursor"] = batch.cursor
            if mine:
                announced.append((batch.job_id, mine, my_points))
            accepted.append(batch)
        logstore.copy_rows(rows, points, now)
        _update_jobs(updates)
        # The round's pushes go out together: one after another, 1,000 jobs' round trips to
        # Redis kept every follower waiting on the round for most of a second.
        transaction.on_commit(lambda: live.publish_many([logstore.announcement(*each) for each in announced]))
    for batch in batches:                   # committed
        batch.stored = batch in accepted


def _update_jobs(updates):
    """One UPDATE of the stored jobs' seq, offset, splitter state, cursor and first rank failure."""
    if not updates:
        return
    from psycopg2.extras import execute_values

    table = connection.ops.quote_name(Job._meta.db_table)
    column = {name: connection.ops.quote_name(Job._meta.get_field(name).column) for name in (
        "next_seq", "output_offset", "output_state", "follow_cursor", "failed_rank", "exit_code")}
    values = [(pk, u["next_seq"], u["output_offset"], json.dumps(u["state"]),
               None if u["cursor"] is None else json.dumps(u["cursor"]), u["failed_rank"], u["exit_code"])
              for pk, u in sorted(updates.items())]
    with connection.cursor() as cursor:
        execute_values(cursor.cursor, (
            f"UPDATE {table} AS j SET {column['next_seq']} = v.next_seq, {column['output_offset']} = v.output_offset, "
            f"{column['output_state']} = v.state::jsonb, "
            f"{column['follow_cursor']} = COALESCE(v.cursor::jsonb, j.{column['follow_cursor']}), "
            f"{column['failed_rank']} = v.failed_rank, {column['exit_code']} = v.exit_code "
            "FROM (VALUES %s) AS v(id, next_seq, output_offset, state, cursor, failed_rank, exit_code) "
            f"WHERE j.{connection.ops.quote_name(Job._meta.pk.column)} = v.id"),
            values, template="(%s, %s::bigint, %s::bigint, %s, %s, %s::integer, %s::integer)", page_size=len(values))


_writer = GroupWriter()


def append(job_id, lines, start, end, splitter_state, follower=None, cursor=None):
    return _writer.append(job_id, lines, start, end, splitter_state, follower=follower, cursor=cursor)
