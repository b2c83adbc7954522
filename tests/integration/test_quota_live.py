"""Viewers of a waiting job see why it waits, live: the scheduler's new reasons reach the job's
websocket (real uvicorn, Redis channel layer) without a reload."""
import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from websockets.asyncio.client import connect

from jobs.domain import scheduler, states, tokens
from jobs.models import Job, Script, State

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


async def next_state(ws, timeout=20):
    async with asyncio.timeout(timeout):
        while True:
            message = json.loads(await ws.recv())
            if message["type"] == "state":
                return message


def test_viewers_of_waiting_jobs_get_their_new_reasons_pushed(live_portal, make_user, image, settings):
    settings.RINGMASTER_LOCAL_GPUS = 2                   # admit() runs in this process
    alice = make_user("alice")
    script = Script.objects.create(owner=alice, name="t.py", sha256="0" * 64, size=1, content="x")
    running = Job.objects.create(owner=alice, image=image, gpus=2, script=script, time_limit_minutes=5)
    states.transition(running.pk, State.LAUNCHING)
    waiting = [Job.objects.create(owner=alice, image=image, gpus=2, script=script, time_limit_minutes=5)
               for _ in range(2)]
    headers = {"Authorization": f"Token {tokens.issue(alice).key}"}
    base = live_portal.replace("http://", "ws://")

    async def scenario():
        async with connect(f"{base}/ws/jobs/{waiting[0].pk}/", additional_headers=headers) as first, \
                connect(f"{base}/ws/jobs/{waiting[1].pk}/", additional_headers=headers) as second:
            assert (await next_state(first))["state"] == "QUEUED"
            assert (await next_state(second))["state"] == "QUEUED"
            assert await sync_to_async(scheduler.admit)() == []
            assert await next_state(first) == {"type": "state", "state": "QUEUED",
                                               "reason": "waiting for capacity: 2 of 2 GPUs in use, this job needs 2"}
            assert await next_state(second) == {"type": "state", "state": "QUEUED",
                                                "reason": "waiting behind an earlier job for capacity (local)"}

    asyncio.run(scenario())
