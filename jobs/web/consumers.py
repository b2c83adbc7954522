"""The job websocket: /ws/jobs/<id>/?since=<seq> (contract in DESIGN.md).

Owner or staff only; anyone else is refused at the handshake, before any data. The consumer
replays stored lines after `since`, then sends what is stored later, in seq order, tracking the
last seq it sent; one task per viewer sends, everything else only wakes it. A push carries the
lines just stored (encoded once, by the follower) and the seq before them; the job's relay in
this process (jobs.web.relay) receives it once for all viewers and keeps the recent ones. A
viewer whose last seq is where pushes follow on sends their bytes, several pushes as one frame
when it was busy while they came; any other reads from the database what it lacks, so a lost or
late push can delay a line but never lose or repeat one. Without Redis (make run's embedded
defaults) the worker cannot reach this process, so the consumer also polls the database.

Metric points that come from no line (TensorBoard's scalars, jobs.domain.tbmetrics) stand
outside the line sequence: a viewer that connects with ?tb_since=<id> is sent those stored after
that id, read once the relay is subscribed, then each push of them that brings points past the
last it sent (a push carries the id of its last point); without tb_since, only the pushes.
"""
import asyncio
import contextlib
import json
import logging
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from rest_framework.utils.encoders import JSONEncoder

from jobs.domain import live, logwire, tbmetrics, telemetry
from jobs.domain.live import MAX_PUSH_BYTES
from jobs.models import Job, LogLine, MetricPoint, SystemSample
from jobs.domain.services import visible_jobs
from jobs.web import relay

log = logging.getLogger(__name__)

BATCH = 1000
MAX_FRAME_BYTES = MAX_PUSH_BYTES        # several pushes sent as one frame: up to about this size
POLL_SECONDS = 1.0
SHARED_BATCH_SECONDS = 2.0


def fetch(job_id, after):
    """(lines message, metrics message or None, last seq) for up to BATCH stored lines after seq
    `after`; (None, None, None) when there are none yet."""
    rows = list(LogLine.objects.filter(job_id=job_id, seq__gt=after).order_by("seq")
                .values_list("seq", "rank", "stream", "ts", "text")[:BATCH])
    if not rows:
        return None, None, None
    points = list(MetricPoint.objects.filter(job_id=job_id, seq__gt=after, seq__lte=rows[-1][0])
                  .order_by("seq", "id").values_list("seq", "name", "rank", "step", "value", "ts"))
    return logwire.lines_message(rows), logwire.metrics_message(points), rows[-1][0]


_encode_batch = database_sync_to_async(fetch)
_batches = {}  # (job id, after) -> the task encoding the batch after that seq, kept briefly


async def shared_batch(job_id, after):
    """(lines message, metrics message or None, last seq) for up to BATCH lines after `after`.

    A push reaches every viewer of a job; those at the same place (all of the live ones, as a
    rule) await one task, so 200 viewers cost one query and one encoding per batch, not 200.
    """
    key = (job_id, after)
    task = _batches.get(key)
    if task is None:
        task = _batches[key] = asyncio.ensure_future(_encode_batch(job_id, after))
        loop = asyncio.get_running_loop()

        def forget(done):
            if done.cancelled() or done.exception() or done.result()[2] is None:
                _batches.pop(key, None)                # nothing to share: failed, or no lines yet
            else:
                loop.call_later(SHARED_BATCH_SECONDS, _batches.pop, key, None)
        task.add_done_callback(forget)
    return await asyncio.shield(task)       # a viewer that leaves does not cancel the others' batch


def stored_points(job_id, after):
    """(metrics message or None, id of its last point) for up to BATCH of the job's points stored
    apart from any line (jobs.domain.tbmetrics) with an id past `after`."""
    rows = tbmetrics.stored_after(job_id, after, BATCH)
    if not rows:
        return None, after
    return logwire.metrics_message([row[1:] for row in rows]), rows[-1][0]


_stored_points = database_sync_to_async(stored_points)


def read_state(job_id):
    return tuple(Job.objects.filter(pk=job_id).values_list("state", "reason").get())


_read_state = database_sync_to_async(read_state)
_states = {}  # (job's relay, state pushes it heard) -> the task reading the job's state after them


async def shared_state(job_relay):
    """(state, reason) of the relay's job as stored after the last change of it the relay heard
    of: the job's viewers told of the same change share one read, begun after it was heard."""
    key = (job_relay, job_relay.state_pushes)
    task = _states.get(key)
    if task is None:
        task = _states[key] = asyncio.ensure_future(_read_state(job_relay.job_id))
        task.add_done_callback(lambda _: _states.pop(key, None))
    return await asyncio.shield(task)


class JobConsumer(AsyncJsonWebsocketConsumer):
    # No channel of its own: the job's relay in this process receives for all its viewers.
    channel_layer_alias = None

    async def connect(self):
        user = self.scope.get("user")
        self.job_id = int(self.scope["url_route"]["kwargs"]["job_id"])
        self.relay = self.sender = self.poller = None
        if not user or not user.is_authenticated or not await self._may_see(user):
            await self.close(code=4404)
            return
        query = _query(self.scope)
        try:
            self.last_seq = int(query.get("since", -1))
            # The last point stored apart from lines that this viewer holds; None: it wants only pushes.
            self.points_after = int(query["tb_since"]) if "tb_since" in query else None
        except ValueError:
            await self.close(code=4400)
            return
        self.wake = asyncio.Event()
        self.state_due, self.others, self.point_pushes, self.poll_due = False, [], [], False
        self.relay = await relay.join(self.job_id, self)     # before the database is read
        await self.accept()
        self.last_state = None
        self.last_sample = await self._last_sample()
        await self._send_state()
        self.poll_due = True                # the first round reads what is stored after `since`
        self.wake.set()
        self.sender = asyncio.ensure_future(self._send_forever())
        if live.reaches_this_process_only():
            self.poller = asyncio.ensure_future(self._poll())

    async def disconnect(self, code):
        for task in (self.sender, self.poller):
            if task is not None:
                task.cancel()
        if self.relay is not None:
            relay.leave(self.relay, self)

    async def receive_json(self, content, **kwargs):
        """Clients only listen; anything they send is ignored."""

    @classmethod
    async def encode_json(cls, content):
        return json.dumps(content, cls=JSONEncoder)

    # --- what the job's relay tells (jobs.domain.live's messages); never waits --------------
    def relayed(self, message):
        kind = message.get("type")
        if kind == "job.state":
            self.state_due = True
        elif kind == "job.system":
            self.others.append(message)
        elif kind == "job.metrics":
            self.point_pushes.append(message)
        elif kind != "job.lines":
            return
        self.wake.set()

    # --- the one task that sends: lines in seq order, then what else has come -----------------
    async def _send_forever(self):
        try:
            while True:
                await self.wake.wait()
                self.wake.clear()
                await self._send_round()
        except asyncio.CancelledError:
            raise
        except Exception:                   # the page reconnects from the last seq it has
            log.warning("job %s: a viewer's websocket failed", self.job_id, exc_info=True)
            with contextlib.suppress(Exception):
                await self.close(code=1011)

    async def _send_round(self):
        state_due, self.state_due = self.state_due, False
        others, self.others = self.others, []
        point_pushes, self.point_pushes = self.point_pushes, []
        poll, self.poll_due = self.poll_due, False
        # Lines stored before a change of state are shown before it, even where their push was
        # lost (the pub/sub layer keeps nothing for a process that missed it): read the database.
        await self._send_lines(read_stored=state_due or poll)
        # So are the points stored apart from lines: the stored ones first, where they hold a push
        # that came meanwhile.
        if (state_due or poll) and self.points_after is not None:
            await self._send_stored_points()
        for message in point_pushes:
            await self._send_pushed_points(message)
        if state_due:
            # The state as stored now, not as the push said: pushes sent by different processes
            # (the worker, the web process of a cancel) may arrive out of order.
            await self._send_state(*await shared_state(self.relay))
        elif poll:
            await self._send_state()
        for message in others:
            self.last_sample = max([self.last_sample, *(sample["id"] for sample in message["samples"])])
            await self.send_json({"type": "system", "samples": message["samples"], "hint": message["hint"]})
        if poll:
            await self._send_samples()

    async def _send_lines(self, read_stored):
        """What is stored after this viewer's last seq, in order, once: the relay's recent pushes
        where they follow on from it (several as one frame), else the database. Without
        `read_stored`, only as far as the relay has heard."""
        while True:
            run = self.relay.run_after(self.last_seq, MAX_FRAME_BYTES)
            if run:
                await self.send(text_data=logwire.join_lines([push.lines for push in run]))
                points = logwire.join_metrics([push.metrics for push in run])
                if points:
                    await self.send(text_data=points)
                self.last_seq = run[-1].last_seq
                continue
            if not read_stored and self.relay.last_seq <= self.last_seq:
                return
            lines_text, points_text, last = await shared_batch(self.job_id, self.last_seq)
            if last is None:
                return
            await self.send(text_data=lines_text)
            if points_text:
                await self.send(text_data=points_text)
            self.last_seq = last

    async def _send_stored_points(self):
        """The points stored apart from lines after the viewer's last one (at connect, before a
        change of state, and each poll without Redis), BATCH a message."""
        while True:
            text, last = await _stored_points(self.job_id, self.points_after)
            if text is None:
                return
            await self.send(text_data=text)
            self.points_after = last

    async def _send_pushed_points(self, message):
        last = message.get("last_id")
        if self.points_after is not None and last is not None:
            if last <= self.points_after:
                return                      # read from the database already
            self.points_after = last
        await self.send(text_data=message["metrics"])

    # --- helpers ----------------------------------------------------------------------------
    async def _poll(self):
        """Without Redis no announcement reaches this process: read the database now and then,
        and say so each time (the job's follower stores each line as it comes while it is watched)."""
        while True:
            live.viewer_looked(self.job_id)
            await asyncio.sleep(POLL_SECONDS)
            self.poll_due = True
            self.wake.set()

    async def _send_state(self, state=None, reason=None):
        if state is None:
            state, reason = await self._state()
        if (state, reason) != self.last_state:
            self.last_state = (state, reason)
            await self.send_json({"type": "state", "state": state, "reason": reason})

    async def _send_samples(self):
        """Without Redis no push reaches this process: new samples are read from the database."""
        samples, hint = await self._samples_after(self.last_sample)
        if samples:
            self.last_sample = samples[-1]["id"]
            await self.send_json({"type": "system", "samples": samples, "hint": hint})

    @database_sync_to_async
    def _last_sample(self):
        return SystemSample.objects.filter(job_id=self.job_id).order_by("-id").values_list("id", flat=True).first() or 0

    @database_sync_to_async
    def _samples_after(self, after):
        rows = list(SystemSample.objects.filter(job_id=self.job_id, id__gt=after).order_by("id")[:BATCH])
        return [telemetry.as_dict(row) for row in rows], (telemetry.idle_hint(self.job_id) if rows else "")

    @database_sync_to_async
    def _may_see(self, user):
        return visible_jobs(user).filter(pk=self.job_id).exists()

    async def _state(self):
        return await _read_state(self.job_id)


def _query(scope):
    return {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
