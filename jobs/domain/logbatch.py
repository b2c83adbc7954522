"""What the jobs a worker process follows print, stored together: one transaction a round.

Were each follower to store each batch of its job in a transaction of its own (BEGIN, the job's
row locked and checked, COPY, UPDATE, COMMIT), a worker following 200 jobs that print a line a
second would spend most of its interpreter's time in those round trips, and 1,000 jobs
(BENCHMARKS.md, followers) would be out of reach. So the followers hand their batches in
(submit) and go on; the process's writer thread stores every batch handed in while its last
round ran, in one transaction: the jobs' rows locked and checked in one SELECT, every line in
one COPY, every job's offset, seq and cursor in one UPDATE. A follower looks at its batch's
answer (Pending) before it hands in the next one, or waits for it (append) where it must know.

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
import contextlib
import functools
import json
import logging
import sys
import threading
import weakref

from django.db import OperationalError, connection, transaction
from django.utils import timezone

from jobs.database import on_postgresql
from jobs.domain import dbpool, live, logstore
from jobs.models import Job

log = logging.getLogger(__name__)
MAX_ROUND = 500                 # batches stored in one transaction at most
DEADLOCK_ATTEMPTS = 3
DEADLOCK_DETECTED = "40P01"     # PostgreSQL's SQLSTATE
# A round of this many lines or more runs with the interpreter's switch interval at
# BIG_ROUND_SWITCH_SECONDS (_writer_first).
BIG_ROUND_LINES = 1000
BIG_ROUND_SWITCH_SECONDS = 0.0005


class Pending:
    """A batch handed in: stored (or refused, or failed) once its round has committed."""
    __slots__ = ("job_id", "lines", "start", "end", "state", "follower", "cursor", "made", "stored", "error", "done")

    def __init__(self, job_id, lines, start, end, state, follower, cursor, made=None):
        self.job_id, self.lines, self.start, self.end = job_id, lines, start, end
        self.state, self.follower, self.cursor, self.made = state, follower, cursor, made
        self.stored, self.error = None, None
        self.done = threading.Event()

    def result(self):
        """append_output's answer for this batch (True: stored; False: refused), once its round
        committed; its error, raised here, if it could not be stored."""
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.stored


class GroupWriter:
    """The worker process's writer of its followers' batches: a thread of its own that stores, in
    one round, every batch handed in while the round before it ran. A follower hands a batch in
    and goes on reading (it looks at the answer later): it is woken only when its job prints, not
    once more when its lines are stored."""

    def __init__(self):
        self._ready = threading.Condition()
        self._waiting = []
        self._thread = None

    def submit(self, job_id, lines, start, end, splitter_state, follower=None, cursor=None, first_seq=None):
        # A follower that knows where its job's seq stands prepares its batch here, in its own
        # thread, while this writer stores the round before: the writer only checks, COPYs and
        # commits (on a 64-rank job's output, preparing in the writer would keep the database
        # waiting for a quarter of each round). Other batches are prepared by the writer.
        made = None
        if first_seq is not None and on_postgresql():
            made = logstore.prepare(job_id, lines, first_seq, timezone.now())
        batch = Pending(job_id, lines, start, end, splitter_state, follower, cursor, made)
        with self._ready:
            # First use in this process, again after a fork (the parent's thread does not run
            # here), and again if it ever ended.
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="follow-writer", daemon=True)
                self._thread.start()
            self._waiting.append(batch)
            self._ready.notify()
        return batch

    def _run(self):
        try:
            while True:
                with self._ready:
                    while not self._waiting:
                        self._ready.wait()
                    taken, self._waiting = self._waiting[:MAX_ROUND], self._waiting[MAX_ROUND:]
                self._round(taken)
        finally:
            # Ended (only a BaseException ends it; its round was answered): the batches still
            # waiting are answered too, so that no follower waits for ever. The next batch
            # handed in starts a new writer.
            with self._ready:
                left, self._waiting, self._thread = self._waiting, [], None
            for batch in left:
                batch.error = RuntimeError("the worker's output writer stopped")
                batch.done.set()

    def _round(self, taken):
        with _writer_first(taken):
            self._store_answering(taken)

    def _store_answering(self, taken):
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
        except BaseException as exc:        # never a batch left without an answer
            for batch in taken:
                if batch.stored is None and batch.error is None:
                    batch.error = exc
            raise
        finally:
            for batch in taken:
                batch.done.set()


@contextlib.contextmanager
def _writer_first(batches):
    """While a big round is stored, the interpreter switches threads every 0.5 ms instead of 5:
    a job printing a lot is the writer's alone (its follower splits the next read meanwhile,
    and the announcer encodes the last round); at 5 ms each database call of the round waits for
    the GIL up to 5 ms on return, so that a short statement (the row lock's SELECT) takes several
    times as long. Small rounds, a worker's many jobs printing a line now and then, keep the
    default: 0.5 ms all the time costs a worker that follows many jobs more CPU."""
    if sum(len(batch.lines) for batch in batches) < BIG_ROUND_LINES:
        yield
        return
    before = sys.getswitchinterval()
    sys.setswitchinterval(BIG_ROUND_SWITCH_SECONDS)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


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
    if not on_postgresql():
        for batch in batches:
            batch.stored = logstore.append_output(batch.job_id, batch.lines, batch.start, batch.end, batch.state,
                                                  follower=batch.follower, cursor=batch.cursor)
        return
    now = timezone.now()
    accepted, announced = [], []
    with transaction.atomic():
        held = _lock_jobs({batch.job_id for batch in batches})
        lines_texts, points_texts, updates = [], [], {}
        for batch in batches:
            job = held.get(batch.job_id)
            if not logstore.takes(job, batch.start, batch.follower):
                continue
            made = batch.made
            if made is None:                # handed in without a seq: prepared here, under the lock
                made = logstore.prepare(batch.job_id, batch.lines, job["next_seq"], now, copy_text=True)
            if made.first_seq != job["next_seq"]:
                # Not where the job's seq stands (its follower counts what it hands in, and only
                # the job's holder stores): left out as a batch from the wrong offset is.
                log.warning("job %s: a batch from seq %s, stored ones end at %s", batch.job_id, made.first_seq,
                            job["next_seq"])
                continue
            mine, my_points = made.rows, made.points
            lines_texts.append(made.copy_lines)
            points_texts.append(made.copy_points)
            job.update(made.changes(job), output_offset=batch.end)     # a later batch of the job follows
            update = updates.setdefault(batch.job_id, {"cursor": None})
            update.update(job, state=batch.state)
            if batch.cursor is not None:
                update["cursor"] = batch.cursor
            if mine:
                announced.append((batch.job_id, mine, my_points))
            accepted.append(batch)
        logstore.copy("".join(lines_texts), "".join(points_texts))
        _update_jobs(updates)
        # The round's pushes go out together (one after another, 1,000 jobs' round trips to
        # Redis would keep every follower waiting on the round for most of a second), encoded and sent
        # by the announcer thread while this one stores the next round. Robust: what is
        # committed is stored, whatever becomes of its announcement (viewers resync).
        transaction.on_commit(lambda: live.publish_many_later(
            lambda: [message for each in announced for message in logstore.announcements(*each)]), robust=True)
    for batch in batches:                   # committed
        batch.stored = batch in accepted


# The two statements of every round are made once, not in each round: compiling them would take
# a quarter of the interpreter time of a round of one job's one line (a training job's progress
# line). And they are prepared once on each connection (PREPARE, then EXECUTE each round): else
# PostgreSQL parses and plans both again in every round, a third of its CPU for a one-line round.
# Their parameters are arrays, so one prepared statement serves a round of any number of jobs.

_prepared_on = weakref.WeakKeyDictionary()      # DB-API connection -> names of the statements prepared on it


def _execute_prepared(cursor, name, types, statement, params):
    """Run `statement` (with a %s placeholder for each of `params`, of PostgreSQL `types`) as the
    prepared statement `name` of the cursor's connection, prepared on the connection's first use.
    A prepared statement lasts as long as its connection, whatever becomes of the transaction it
    was made in. `cursor`: Django's, so that errors are Django's (a deadlock is retried)."""
    known = _prepared_on.setdefault(cursor.db.connection, set())
    if name not in known:
        parts = statement.split("%s")
        assert len(parts) == len(types) + 1, statement
        numbered = "".join(part + (f"${number}" if number <= len(types) else "")
                           for number, part in enumerate(parts, start=1))
        cursor.execute(f"PREPARE {name} ({', '.join(types)}) AS {numbered}")
        known.add(name)
    cursor.execute(f"EXECUTE {name} ({', '.join(['%s'] * len(params))})", params)


@functools.cache
def _lock_statement():
    """SELECT ... FOR UPDATE of the jobs' logstore.HELD_FIELDS, in id order: the ORM's own SQL
    (its one parameter, the ids, an array: jobs.lookups.AnyOf). Made in a transaction (Django
    refuses to make a SELECT ... FOR UPDATE outside one)."""
    query = Job.objects.select_for_update().filter(pk__anyof=[]).order_by("pk").values(*logstore.HELD_FIELDS).query
    sql, _ = query.sql_with_params()
    return sql


def _lock_jobs(ids):
    """{id: HELD_FIELDS as a dict} of the jobs `ids`, their rows locked (in a transaction)."""
    with connection.cursor() as cursor:
        _execute_prepared(cursor, "ringmaster_round_lock", ["bigint[]"], _lock_statement(), [sorted(ids)])
        names = [column.name for column in cursor.description]        # the fields' names (AS ...)
        return {job["pk"]: job for job in (dict(zip(names, row)) for row in cursor.fetchall())}


_UPDATE_COLUMNS = ("next_seq", "output_offset", "output_state", "follow_cursor", "failed_rank", "exit_code")
_UPDATE_TYPES = ["bigint[]", "bigint[]", "bigint[]", "text[]", "text[]", "integer[]", "integer[]"]


@functools.cache
def _update_statement():
    table = connection.ops.quote_name(Job._meta.db_table)
    column = {name: connection.ops.quote_name(Job._meta.get_field(name).column) for name in _UPDATE_COLUMNS}
    return (
        f"UPDATE {table} AS j SET {column['next_seq']} = v.next_seq, {column['output_offset']} = v.output_offset, "
        f"{column['output_state']} = v.state::jsonb, "
        f"{column['follow_cursor']} = COALESCE(v.cursor::jsonb, j.{column['follow_cursor']}), "
        f"{column['failed_rank']} = v.failed_rank, {column['exit_code']} = v.exit_code "
        "FROM unnest(%s, %s, %s, %s, %s, %s, %s) AS v(id, next_seq, output_offset, state, cursor, failed_rank, exit_code) "
        f"WHERE j.{connection.ops.quote_name(Job._meta.pk.column)} = v.id")


def _update_jobs(updates):
    """One UPDATE of the stored jobs' seq, offset, splitter state, cursor and first rank failure."""
    if not updates:
        return
    values = [(pk, u["next_seq"], u["output_offset"], json.dumps(u["state"]),
               None if u["cursor"] is None else json.dumps(u["cursor"]), u["failed_rank"], u["exit_code"])
              for pk, u in sorted(updates.items())]
    with connection.cursor() as cursor:
        _execute_prepared(cursor, "ringmaster_round_update", _UPDATE_TYPES, _update_statement(),
                          [list(column) for column in zip(*values)])


_writer = GroupWriter()


def submit(job_id, lines, start, end, splitter_state, follower=None, cursor=None, first_seq=None):
    """Hand a batch in; its Pending tells whether it was stored (append_output's contract).
    `first_seq`: where the job's seq stands when the batches handed in before are stored (the
    follower counts), to prepare the batch now; it is refused if the job's seq is elsewhere."""
    return _writer.submit(job_id, lines, start, end, splitter_state, follower=follower, cursor=cursor,
                          first_seq=first_seq)


def append(job_id, lines, start, end, splitter_state, follower=None, cursor=None):
    """submit() and wait for the answer."""
    return submit(job_id, lines, start, end, splitter_state, follower=follower, cursor=cursor).result()
