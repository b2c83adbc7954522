"""Telling live viewers (websocket groups) about new lines, metric points and states.

Everything is stored before it is announced; a viewer that misses an announcement catches up
from the database with ?since=<seq>.

Announcements come from sync code (the follower's on-commit hooks, state transitions). With
Redis's pub/sub layer (the default with Redis) the calling thread PUBLISHes them itself through
one plain Redis client per process, in the layer's channel names and serializer. Other Redis
layers run them on one event loop per process, kept in a background thread, so the channel
layer's Redis connections are reused: async_to_sync would start a new loop, and with it a new
Redis connection, for every announcement.
The in-memory layer (no Redis) serves consumers of this very process, whose queues belong to
the server's loop: there announcements go through async_to_sync, which hands the call to that
loop, and only for a job this process has a viewer of (a worker's pushes reach nobody; the web
process's viewers poll the database and leave a mark that they looked: audience.Pollers).
"""
import asyncio
import logging
import os
import queue
import threading

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from channels_redis.pubsub import RedisPubSubChannelLayer
from django.conf import settings

from jobs.domain import logwire, redispublish
from jobs.domain.audience import Pollers
from jobs.installation import installation_id, last_read

log = logging.getLogger(__name__)
SEND_TIMEOUT_SECONDS = 10

_loop = None
_loop_pid = None
_loop_lock = threading.Lock()


def group_name(job_id, installation=None):
    """The websocket group of a job's viewers: a Redis channel, which every Redis database of the
    server shares, so it is named with the installation (another portal's job of the same id is
    another group). `installation`: as last read in this process unless given."""
    return f"job-{installation or last_read()}-{job_id}"


def _announcer_loop():
    """This process's announcement loop, started on first use (again after a fork)."""
    global _loop, _loop_pid
    with _loop_lock:
        if _loop is None or _loop_pid != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="ringmaster-live", daemon=True).start()
            _loop, _loop_pid = loop, os.getpid()
        return _loop


# The kinds of channel layer, as each is announced to (see the module's docstring).
PUBSUB, IN_MEMORY, OTHER = "pubsub", "in-memory", "other"


def _layer():
    """(this process's channel layer, its kind), or (None, None) where there is none."""
    layer = get_channel_layer()
    if layer is None:
        return None, None
    if isinstance(layer, RedisPubSubChannelLayer):
        return layer, PUBSUB
    if isinstance(layer, InMemoryChannelLayer):
        return layer, IN_MEMORY
    return layer, OTHER


def reaches_this_process_only():
    """Whether announcements reach only this process's viewers (the in-memory layer, without
    Redis): a web process's viewers then poll the database for what workers store."""
    return _layer()[1] in (IN_MEMORY, None)


def publish(job_id, message):
    """Send one message to the job's viewers (a viewer's trouble never fails the sender)."""
    layer, kind = _layer()
    if layer is None:
        return
    if kind == PUBSUB:
        publish_many([(job_id, message)])   # the calling thread sends it (no hop to the loop)
        return
    future = None
    try:
        if kind == IN_MEMORY:
            group = group_name(job_id)
            if _has_members(layer, group):  # else it reaches nobody: no event loop started for it
                async_to_sync(layer.group_send)(group, message)
            return
        future = asyncio.run_coroutine_threadsafe(layer.group_send(group_name(job_id), message), _announcer_loop())
        future.result(timeout=SEND_TIMEOUT_SECONDS)
    except Exception:  # a viewer's trouble must never fail the job; viewers resync from the DB
        if future is not None:
            future.cancel()
        log.warning("could not notify viewers of job %s", job_id, exc_info=True)


def publish_state(job):
    installation_id()           # a change of state is rare: the installation is read anew for it
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
        message.update(after=after, lines=lines, metrics=metrics)
    return message


def _audience():
    """Who hears this process's pushes: its publisher's jobs.domain.audience.Audience with Redis's
    pub/sub layer, Pollers with the in-memory layer, or None where every push is sent."""
    layer, kind = _layer()
    if kind == IN_MEMORY:
        return Pollers(lambda group: _has_members(layer, group), settings.DATA_DIR / "viewers")
    publisher = redispublish.publisher(layer) if kind == PUBSUB else None
    return None if publisher is None else publisher.audience


def _has_members(layer, group):
    """Whether the in-memory layer has a member of `group` (a viewer's relay in this process):
    its group_send reaches nobody else."""
    return bool(layer.groups.get(group))


def viewer_looked(job_id):
    """A viewer that polls (no Redis) looked at what the job has stored: the job is watched
    (audience.Pollers), and its follower stores each line as it comes."""
    audience = _audience()
    if isinstance(audience, Pollers):
        try:
            audience.looked(group_name(job_id))
        except OSError:     # the viewer's polls go on: its job is only gathered as if unwatched
            log.warning("could not mark job %s as watched", job_id, exc_info=True)


def heard(job_id):
    """False where the job's next line push would be left out, nobody watching it (so its lines
    need not be encoded for it)."""
    audience = _audience()
    return audience is None or audience.would_send(group_name(job_id))


def nobody_hears(job_id, then):
    """True where nobody watches the job: its next line push would be left out (Redis), or no
    viewer polls it (no Redis). With Redis `then` is called once when somebody does
    (Audience.when_heard). False, and `then` is never called, where it is watched or every push
    is sent."""
    audience = _audience()
    return audience is not None and audience.when_heard(group_name(job_id), then)


# A push of points stored apart from any line carries up to this many of them.
POINTS_PER_PUSH = 5000


def points_messages(rows):
    """job.metrics messages for metric points stored apart from any log line (TensorBoard's:
    jobs.domain.tbmetrics), given as (id, seq, name, rank, step, value, ts) rows in id order:
    POINTS_PER_PUSH points a message, as the websocket's metrics text, with the id of the
    message's last point (None where the database gave none), by which a viewer that read the
    stored points already leaves it out."""
    messages = []
    for start in range(0, len(rows), POINTS_PER_PUSH):
        chunk = rows[start:start + POINTS_PER_PUSH]
        last_id = None if any(row[0] is None for row in chunk) else chunk[-1][0]
        messages.append({"type": "job.metrics", "last_id": last_id,
                         "metrics": logwire.metrics_message([row[1:] for row in chunk])})
    return messages


def publish_points(job_id, rows):
    """Tell the job's viewers of metric points just stored apart from any line (points_messages);
    nothing where nobody would hear it: a viewer that joins reads them from the database."""
    if rows and heard(job_id):
        publish_many([(job_id, message) for message in points_messages(rows)])


def publish_lines(job_id, last_seq, after=None, lines=None, metrics=None):
    publish(job_id, lines_message(last_seq, after, lines, metrics))


BATCH_CONCURRENCY = 32

_later = None            # (thread, queue) of this process's announcer
_later_lock = threading.Lock()


def publish_many_later(make_messages):
    """publish_many(make_messages()) on this process's announcer thread, in the order handed in.

    The worker's writer hands a stored round's lines here and goes on to store the next round
    while these are encoded and sent: encoding them in the writer would take a fifth of a large
    batch's time. Whatever waits here is announced together. A push that overtakes them (a state
    change) is safe: the consumer sends what is stored first."""
    global _later
    with _later_lock:
        # First use in this process, again after a fork, and again if it ever ended (what it
        # had not sent is lost; viewers resync from the database).
        if _later is None or not _later[0].is_alive():
            waiting = queue.SimpleQueue()
            thread = threading.Thread(target=_announce_forever, args=(waiting,), name="ringmaster-announcer",
                                      daemon=True)
            thread.start()
            _later = (thread, waiting)
        _later[1].put(make_messages)


def _announce_forever(waiting):
    while True:
        makers = [waiting.get()]
        while not waiting.empty():
            makers.append(waiting.get())
        messages = []
        for make in makers:
            try:
                messages += make()
            except Exception:       # viewers resync from the database
                log.warning("could not make an announcement", exc_info=True)
        publish_many(messages)


def publish_states(jobs):
    """publish_state for many jobs at once (the scheduler's new reasons for a long queue)."""
    installation_id()
    publish_many([(job.pk, {"type": "job.state", "state": job.state, "reason": job.reason}) for job in jobs])


def publish_many(messages):
    """[(job id, message)] sent together on the announcement loop, not one round trip to Redis
    after another: in one pipeline with the pub/sub layer (the default with Redis), and then
    only the line pushes someone hears (jobs.domain.redispublish), else by BATCH_CONCURRENCY
    senders at once."""
    layer, kind = _layer()
    if layer is None or not messages:
        return
    if kind == IN_MEMORY:
        for job_id, message in messages:
            publish(job_id, message)
        return
    if kind == PUBSUB:
        publisher = redispublish.publisher(layer)
        if publisher is None:           # sharded over several hosts: one by one, as the layer does
            _run_on_loop(_publish_one_by_one(layer, messages), len(messages))
            return
        try:
            publisher.publish([(group_name(job_id), message) for job_id, message in messages])
        except Exception:               # viewers resync from the database
            log.warning("could not notify viewers of %d jobs", len(messages), exc_info=True)
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
        # BATCH_CONCURRENCY senders, not a task per message: with a task each, a round of
        # 1,000 jobs' pushes spends a third of the loop's time making tasks and taking a semaphore.
        # A job's messages stay in one share, in their order (a large batch is several pushes).
        shares = [[] for _ in range(min(BATCH_CONCURRENCY, len(messages)))]
        for job_id, message in messages:
            shares[job_id % len(shares)].append((job_id, message))
        failed = sum(await asyncio.gather(*(send(share) for share in shares)))
        if failed:
            log.warning("could not notify viewers of %d of %d jobs", failed, len(messages))

    _run_on_loop(send_all(), len(messages))


def _run_on_loop(coroutine, count):
    future = asyncio.run_coroutine_threadsafe(coroutine, _announcer_loop())
    try:
        future.result(timeout=SEND_TIMEOUT_SECONDS + count / 100)
    except Exception:  # viewers resync from the database
        future.cancel()
        log.warning("could not notify viewers of %d jobs", count, exc_info=True)


async def _publish_one_by_one(layer, messages):
    for job_id, message in messages:
        await layer.group_send(group_name(job_id), message)
