"""The job websocket: /ws/jobs/<id>/?since=<seq> (contract in DESIGN.md).

Owner or staff only; anyone else is refused at the handshake, before any data. The consumer
replays stored lines after `since`, then sends what is stored later, in seq order, tracking the
last seq it sent. A push carries the lines just stored (encoded once, by the follower) and the
seq before them: a viewer exactly there forwards those bytes; any other reads from the database
what it lacks, so a lost or late push can delay a line but never lose or repeat one. Without
Redis (make run's embedded defaults) the worker cannot reach this process, so the consumer also
polls the database.
"""
import asyncio
import json
import time
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from rest_framework.utils.encoders import JSONEncoder

from jobs.domain.live import group_name
from jobs.domain import telemetry
from jobs.domain import logwire
from jobs.models import Job, LogLine, MetricPoint, SystemSample
from jobs.domain.services import visible_jobs

BATCH = 1000
# A push handled this late means the viewer is behind (more pushes wait in its queue): rather
# than forward each one, it reads everything stored from the database in large batches, which
# overtakes the pushes queued after this one.
BEHIND_SECONDS = 0.1
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


class JobConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        self.job_id = int(self.scope["url_route"]["kwargs"]["job_id"])
        if not user or not user.is_authenticated or not await self._may_see(user):
            await self.close(code=4404)
            return
        try:
            self.last_seq = int(_query(self.scope).get("since", -1))
        except ValueError:
            await self.close(code=4400)
            return
        self.group = group_name(self.job_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        self.last_state = None
        self.last_sample = await self._last_sample()
        await self._send_state()
        await self._send_new()
        self.poller = None
        if not settings.CHANNEL_LAYERS["default"]["BACKEND"].startswith("channels_redis"):
            self.poller = asyncio.ensure_future(self._poll())

    async def disconnect(self, code):
        if getattr(self, "group", None):
            await self.channel_layer.group_discard(self.group, self.channel_name)
        if getattr(self, "poller", None):
            self.poller.cancel()

    async def receive_json(self, content, **kwargs):
        """Clients only listen; anything they send is ignored."""

    @classmethod
    async def encode_json(cls, content):
        return json.dumps(content, cls=JSONEncoder)

    # --- group messages (jobs.domain.live) ---------------------------------------------------------
    async def job_lines(self, event):
        """New lines up to event["last_seq"] are stored. The push carries them, encoded once by
        the follower, where they were small enough: a viewer that has everything before them
        gets those very bytes. Any other viewer reads what it misses from the database; those of
        a job in this process that have seen the same lines share one query and one encoding."""
        target = event["last_seq"]
        if target <= self.last_seq:
            return                                  # overtaken by a catch-up from the database
        if event.get("lines") and self.last_seq == event["after"] and time.time() - event["sent"] < BEHIND_SECONDS:
            await self.send(text_data=event["lines"])
            if event.get("metrics"):
                await self.send(text_data=event["metrics"])
            self.last_seq = target
            return
        while self.last_seq < target:
            # Everything stored after what this viewer has, not only up to this push: a viewer
            # that falls behind catches up in larger batches and skips the pushes it overtook.
            lines_text, points_text, last = await shared_batch(self.job_id, self.last_seq)
            if last is None:
                return
            await self.send(text_data=lines_text)
            if points_text:
                await self.send(text_data=points_text)
            self.last_seq = last

    async def job_state(self, event):
        # Lines stored before the change are shown before it, even where a push of them was
        # lost (the pub/sub layer keeps nothing for a process that missed it).
        await self._send_new()
        await self._send_state(event["state"], event["reason"])

    async def job_system(self, event):
        """New system samples (GPU utilization, memory, power; or CPU and memory) of the job."""
        self.last_sample = max([self.last_sample, *(sample["id"] for sample in event["samples"])])
        await self.send_json({"type": "system", "samples": event["samples"], "hint": event["hint"]})

    # --- helpers ----------------------------------------------------------------------------
    async def _poll(self):
        while True:
            await asyncio.sleep(POLL_SECONDS)
            await self._send_new()
            await self._send_state()
            await self._send_samples()

    async def _send_new(self):
        while True:
            lines_text, points_text, last = await self._fetch(self.last_seq)
            if last is None:
                return
            await self.send(text_data=lines_text)
            if points_text:
                await self.send(text_data=points_text)
            before, self.last_seq = self.last_seq, last
            if last - before < BATCH:
                return

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

    @database_sync_to_async
    def _fetch(self, after):
        return fetch(self.job_id, after)

    @database_sync_to_async
    def _state(self):
        return tuple(Job.objects.filter(pk=self.job_id).values_list("state", "reason").get())


def _query(scope):
    return {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
