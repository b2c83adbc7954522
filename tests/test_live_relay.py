"""A job's viewers in one web process share one receiver of its announcements (jobs.web.relay):
pushes reach every viewer, a viewer busy sending gets what came meanwhile as one frame, and the
receiver goes when the job's last viewer leaves. asgiref's test communicator (channels.testing
imports daphne, which the portal does not use) and Channels' in-memory layer, so that when each
push arrives is up to the test."""
import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from channels.layers import InMemoryChannelLayer, channel_layers
from channels.routing import URLRouter
from django.db import connections

from jobs.domain import live, logwire
from jobs.web import relay
from jobs.web.websocket_routing import websocket_urlpatterns
from tests.integration.test_websocket import job  # noqa: F401 (a fixture: a RUNNING job of alice's)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def layer():
    memory = InMemoryChannelLayer()
    before = channel_layers.set("default", memory)
    yield memory
    if before is None:
        channel_layers.backends.pop("default", None)        # made again from the settings on next use
    else:
        channel_layers.set("default", before)


def push(job, after, texts):
    """What the follower announces after storing `texts` as the lines after seq `after`."""
    rows = [(after + 1 + k, 0, "stdout", job.created_at, text) for k, text in enumerate(texts)]
    return live.lines_message(after + len(texts), after, logwire.lines_message(rows), None)


class Viewer(ApplicationCommunicator):
    """A websocket client; `slow`: it holds one frame unread before the consumer's next send
    waits, as a viewer on a slow link whose socket buffer is full."""

    def __init__(self, application, scope, slow=False):
        super().__init__(application, scope)
        self.slow = slow

    @property
    def output_queue(self):
        if self._output_queue is None:
            self._output_queue = asyncio.Queue(maxsize=1 if self.slow else 0)
        return self._output_queue

    async def receive_from(self, timeout=5):
        output = await self.receive_output(timeout)
        assert output["type"] == "websocket.send", output
        return output["text"]

    async def sent_within(self, seconds):
        """What the consumer sends within `seconds`, or None (receive_output would cancel it)."""
        try:
            output = await asyncio.wait_for(self.output_queue.get(), seconds)
        except TimeoutError:
            return None
        assert output["type"] == "websocket.send", output
        return output["text"]

    async def disconnect(self):
        await self.send_input({"type": "websocket.disconnect", "code": 1000})
        await self.wait(5)


async def viewer(job, user, slow=False):
    communicator = Viewer(URLRouter(websocket_urlpatterns), {
        "type": "websocket", "path": f"/ws/jobs/{job.pk}/", "query_string": b"since=-1", "headers": [],
        "subprotocols": [], "user": user}, slow)
    await communicator.send_input({"type": "websocket.connect"})
    assert (await communicator.receive_output(5))["type"] == "websocket.accept"
    assert json.loads(await communicator.receive_from())["type"] == "state"
    return communicator


async def frames(communicator, until_seq):
    got = []
    while not got or got[-1]["lines"][-1]["seq"] < until_seq:
        message = json.loads(await communicator.receive_from())
        if message["type"] == "lines":
            got.append(message)
    return got


def run(scenario):
    """run(scenario), then close the database connection the consumer's reads opened
    on asgiref's sync thread (the test database is dropped after the session)."""
    async def whole():
        try:
            return await scenario()
        finally:
            await sync_to_async(connections.close_all)()
    return asyncio.run(whole())


async def until(condition, timeout=5):
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def test_pushes_that_come_while_a_viewer_is_busy_reach_it_as_one_frame(layer, job, alice):
    group = live.group_name(job.pk)

    async def scenario():
        watching = await viewer(job, alice, slow=True)
        job_relay = relay._relays[(asyncio.get_running_loop(), job.pk)]
        await layer.group_send(group, push(job, -1, ["a0", "b0"]))
        await until(watching.output_queue.full)             # frame 1 sent, not yet read
        for k in (1, 2, 3):                                 # the viewer's next send waits meanwhile
            await layer.group_send(group, push(job, k * 2 - 1, [f"a{k}", f"b{k}"]))
        await until(lambda: job_relay.last_seq == 7)
        got = await frames(watching, 7)
        await watching.disconnect()
        return got

    got = [[line["text"] for line in frame["lines"]] for frame in run(scenario)]
    assert got[0] == ["a0", "b0"] and len(got) <= 3, got
    assert got[-1][-4:] == ["a2", "b2", "a3", "b3"], got                # two pushes, one frame
    assert [text for frame in got for text in frame] == [f"{c}{k}" for k in range(4) for c in "ab"]


def test_every_viewer_of_a_job_gets_each_push_and_the_receiver_goes_with_the_last(layer, job, alice, make_user):
    staff = make_user("root", is_staff=True)

    async def scenario():
        watching = [await viewer(job, alice if k % 2 else staff) for k in range(10)]
        await asyncio.sleep(0.1)
        assert len(layer.groups[live.group_name(job.pk)]) == 1       # one receiver, not one per viewer
        for k in range(4):
            await layer.group_send(live.group_name(job.pk), push(job, k - 1, [f"line {k}"]))
            await asyncio.sleep(0.01)
        got = [await frames(communicator, 3) for communicator in watching]
        for communicator in watching:
            await communicator.disconnect()
        await asyncio.sleep(0.1)
        return got, dict(layer.groups), dict(relay._relays)

    got, groups, relays = run(scenario)
    for frames_ in got:
        assert [line["text"] for frame in frames_ for line in frame["lines"]] == [f"line {k}" for k in range(4)]
    assert not groups.get(live.group_name(job.pk)) and not relays


def test_a_viewer_shows_the_state_as_stored_whatever_order_the_pushes_came_in(layer, job, alice):
    """State pushes come from different processes (the worker, the web process of a cancel) and
    may overtake each other: a late "RUNNING" must not undo the "SUCCEEDED" the job has."""
    from jobs.models import Job, State

    Job.objects.filter(pk=job.pk).update(state=State.SUCCEEDED, reason="exited with 0")
    group = live.group_name(job.pk)

    async def scenario():
        watching = await viewer(job, alice)             # told SUCCEEDED on connecting
        await layer.group_send(group, {"type": "job.state", "state": State.RUNNING, "reason": ""})
        await layer.group_send(group, push(job, -1, ["a line"]))
        shown = [json.loads(await watching.receive_from())]
        while shown[-1]["type"] != "lines":
            shown.append(json.loads(await watching.receive_from()))
        while (text := await watching.sent_within(0.5)) is not None:    # what that round sent after it
            shown.append(json.loads(text))
        await watching.disconnect()
        return shown

    assert [m for m in run(scenario) if m["type"] == "state"] in (
        [], [{"type": "state", "state": "SUCCEEDED", "reason": "exited with 0"}])
