"""One receiver of a job's announcements per web process, for all of that job's viewers.

The follower announces each stored batch once, with its lines encoded (jobs.domain.live).
A job's relay receives each announcement once, keeps the recent pushes, and wakes the job's
viewers (jobs.web.consumers); a viewer that is still sending when more arrive is woken once for
all of them and sends them as one frame. A channel-layer queue for each viewer would cost 200
subscriptions, 200 decodings and 200 dispatches per push for 200 viewers of a job, and leave a
viewer that falls behind a queue of pushes to skip.

A relay subscribes before its first viewer reads the database, then says that it relays the job
(a worker leaves out the pushes of jobs nobody watches), and lives while the job has a viewer in
this process.
"""
import asyncio
import contextlib
import logging
from collections import deque

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from jobs.domain.live import group_name
from jobs.domain.redispublish import watching_group
from jobs.installation import installation_id

log = logging.getLogger(__name__)

# Pushes kept per job for viewers a little behind (the rest read the database).
RECENT_BYTES = 1 << 20


class Push:
    __slots__ = ("after", "last_seq", "lines", "metrics", "size")

    def __init__(self, message):
        self.after, self.last_seq = message["after"], message["last_seq"]
        self.lines, self.metrics = message["lines"], message.get("metrics")
        self.size = len(self.lines) + len(self.metrics or "")


class Relay:
    """A job's announcements in this process: `last_seq` (the last line announced as stored),
    the recent pushes by the seq they follow, and the viewers to tell (each has `relayed`)."""

    def __init__(self, job_id):
        self.job_id = job_id
        self.viewers = set()
        self.last_seq = -1
        self.state_pushes = 0           # how many changes of state were announced so far
        self._by_after = {}
        self._recent = deque()
        self._recent_bytes = 0
        self._layer = get_channel_layer()
        self._started = asyncio.ensure_future(self._subscribe())
        self._receiving = None

    async def _subscribe(self):
        installation = await _installation_id()         # read anew: no stale name
        self._group = group_name(self.job_id, installation)
        channel = await self._layer.new_channel()
        await self._layer.group_add(self._group, channel)
        # Subscribed, and the viewer has not read the database yet: a worker that left the job's
        # pushes out while nobody watched sends them from now on (jobs.domain.audience).
        try:
            await self._layer.group_send(watching_group(installation), {"type": "job.watched", "group": self._group})
        except Exception:           # its pushes come again within audience.PROBE_SECONDS
            log.warning("could not say that job %s is watched", self.job_id, exc_info=True)
        self._receiving = asyncio.ensure_future(self._receive(channel))

    async def _receive(self, channel):
        try:
            while True:
                message = await self._layer.receive(channel)
                try:
                    self._deliver(message)
                except Exception:       # one odd message must not end the job's live view
                    log.warning("could not relay a message of job %s", self.job_id, exc_info=True)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._layer.group_discard(self._group, channel))

    def _deliver(self, message):
        if message.get("type") == "job.state":
            self.state_pushes += 1
        elif message.get("type") == "job.lines":
            self.last_seq = max(self.last_seq, message["last_seq"])
            if message.get("lines") is not None and message["last_seq"] > message["after"]:
                self._keep(Push(message))
        for viewer in list(self.viewers):
            viewer.relayed(message)

    def _keep(self, push):
        self._by_after[push.after] = push
        self._recent.append(push)
        self._recent_bytes += push.size
        while self._recent_bytes > RECENT_BYTES and len(self._recent) > 1:
            old = self._recent.popleft()
            self._recent_bytes -= old.size
            if self._by_after.get(old.after) is old:
                del self._by_after[old.after]

    def run_after(self, seq, max_bytes):
        """The kept pushes that follow on from `seq`, one after another, up to about max_bytes
        (at least one, if any): what a viewer whose last line is `seq` can send as they are."""
        run, size = [], 0
        push = self._by_after.get(seq)
        while push is not None and (not run or size + push.size <= max_bytes):
            run.append(push)
            size += push.size
            push = self._by_after.get(push.last_seq)
        return run

    def close(self):
        """Stop receiving, once subscribed (cancelling the subscription half-way could leave
        the layer a member of the group that nobody reads)."""
        def stop(_):
            if self._receiving is not None:
                self._receiving.cancel()
        self._started.add_done_callback(stop)


_relays = {}        # (event loop, job id) -> Relay
_installation_id = database_sync_to_async(installation_id)


async def join(job_id, viewer):
    """The job's relay in this process, with `viewer` among those it tells; returns once the
    relay is subscribed, so that nothing announced after the viewer reads the database is missed."""
    key = (asyncio.get_running_loop(), job_id)
    relay = _relays.get(key)
    if relay is None:
        relay = _relays[key] = Relay(job_id)
    relay.viewers.add(viewer)
    try:
        await asyncio.shield(relay._started)
    except BaseException:
        leave(relay, viewer)
        raise
    return relay


def leave(relay, viewer):
    relay.viewers.discard(viewer)
    key = (asyncio.get_running_loop(), relay.job_id)
    if not relay.viewers and _relays.get(key) is relay:
        del _relays[key]
        relay.close()
