"""Telling live viewers (websocket groups) about new lines, metric points and states.

Everything is stored before it is announced; a viewer that misses an announcement catches up
from the database with ?since=<seq>.

Announcements come from sync code (the follower's on-commit hooks, state transitions). With
Redis they run on one event loop per process, kept in a background thread, so the channel
layer's Redis connections are reused: async_to_sync would start a new loop, and with it a new
Redis connection, for every announcement (about 12 ms each, half of it CPU; see BENCHMARKS.md).
The in-memory layer (no Redis) serves consumers of this very process, whose queues belong to
the server's loop: there async_to_sync, which hands the call to that loop, stays.
"""
import asyncio
import logging
import os
import threading
import time

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer

log = logging.getLogger(__name__)
SEND_TIMEOUT_SECONDS = 10

_loop = None
_loop_pid = None
_loop_lock = threading.Lock()


def group_name(job_id):
    return f"job-{job_id}"


def _announcer_loop():
    """This process's announcement loop, started on first use (again after a fork)."""
    global _loop, _loop_pid
    with _loop_lock:
        if _loop is None or _loop_pid != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="ringmaster-live", daemon=True).start()
            _loop, _loop_pid = loop, os.getpid()
        return _loop


def publish(job_id, message):
    """Send one message to the job's viewers (a viewer's trouble never fails the sender)."""
    layer = get_channel_layer()
    if layer is None:
        return
    future = None
    try:
        if isinstance(layer, InMemoryChannelLayer):
            async_to_sync(layer.group_send)(group_name(job_id), message)
            return
        future = asyncio.run_coroutine_threadsafe(layer.group_send(group_name(job_id), message), _announcer_loop())
        future.result(timeout=SEND_TIMEOUT_SECONDS)
    except Exception:  # a viewer's trouble must never fail the job; viewers resync from the DB
        if future is not None:
            future.cancel()
        log.warning("could not notify viewers of job %s", job_id, exc_info=True)


def publish_state(job):
    publish(job.pk, {"type": "job.state", "state": job.state, "reason": job.reason})


def publish_system(job_id, samples, hint):
    """New system samples of a job (jobs.domain.telemetry), as JSON-ready dicts."""
    samples = [{**sample, "ts": sample["ts"].isoformat()} for sample in samples]
    publish(job_id, {"type": "job.system", "samples": samples, "hint": hint})


# A push carries its lines up to this size (one message per web process with the pub/sub
# layer); past it, it only says where the stored lines end and viewers read them from the database.
MAX_PUSH_BYTES = 1 << 20


def lines_message(last_seq, after=None, lines=None, metrics=None):
    """Lines up to `last_seq` are stored; `lines` and `metrics` (jobs.domain.logwire messages)
    are the ones after seq `after`, where they are small enough to travel."""
    message = {"type": "job.lines", "last_seq": last_seq}
    if lines is not None and len(lines) + len(metrics or "") <= MAX_PUSH_BYTES:
        message.update(after=after, lines=lines, metrics=metrics, sent=time.time())
    return message


def publish_lines(job_id, last_seq, after=None, lines=None, metrics=None):
    publish(job_id, lines_message(last_seq, after, lines, metrics))


BATCH_CONCURRENCY = 32


def publish_states(jobs):
    """publish_state for many jobs at once (the scheduler's new reasons for a long queue)."""
    publish_many([(job.pk, {"type": "job.state", "state": job.state, "reason": job.reason}) for job in jobs])


def publish_many(messages):
    """[(job id, message)] sent concurrently on the announcement loop, at most BATCH_CONCURRENCY
    at a time, instead of one round trip to Redis after another."""
    layer = get_channel_layer()
    if layer is None or not messages:
        return
    if isinstance(layer, InMemoryChannelLayer):
        for job_id, message in messages:
            publish(job_id, message)
        return

    async def send(share):              # one sender's share, one message after another
        failed = 0
        for job_id, message in share:
            try:
                await layer.group_send(group_name(job_id), message)
            except Exception:
                failed += 1
        return failed

    async def send_all():
        # BATCH_CONCURRENCY senders, not a task per message: a round of 1,000 jobs' pushes
        # spent a third of the loop's time making tasks and taking a semaphore.
        shares = [messages[i::BATCH_CONCURRENCY] for i in range(min(BATCH_CONCURRENCY, len(messages)))]
        failed = sum(await asyncio.gather(*(send(share) for share in shares)))
        if failed:
            log.warning("could not notify viewers of %d of %d jobs", failed, len(messages))

    future = asyncio.run_coroutine_threadsafe(send_all(), _announcer_loop())
    try:
        future.result(timeout=SEND_TIMEOUT_SECONDS + len(messages) / 100)
    except Exception:  # viewers resync from the database
        future.cancel()
        log.warning("could not notify viewers of %d jobs", len(messages), exc_info=True)
