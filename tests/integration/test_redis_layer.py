"""The Redis channel layer (pub/sub) as the web processes and the worker build it from settings."""
import asyncio

import pytest
import redis
from channels.layers import channel_layers
from django.conf import settings

pytestmark = [pytest.mark.integration]


def subscribers(client):
    return {c["id"]: c for c in client.client_list() if int(c["sub"]) or int(c["psub"])}


@pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis (REDIS_URL)")
def test_the_layers_subscription_speaks_resp2():
    """redis-py 8 speaks RESP3 unless told otherwise, and with RESP3 every pub/sub message comes
    as a push that its parser turns into a string for a debug log before dropping it
    (redis/redis-py#4230; no log setting avoids it): a web process spends a sixth of its CPU
    there while one viewer follows a 64-rank job. With RESP2 the same messages arrive, as plain
    replies."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    before = subscribers(client)

    async def probe():
        layer = channel_layers.make_backend("default")
        try:
            channel = await layer.new_channel()
            await layer.group_add("resp-probe", channel)
            await layer.group_send("resp-probe", {"type": "probe", "text": "x" * 300_000})
            message = await asyncio.wait_for(layer.receive(channel), 10)
            mine = {k: c for k, c in subscribers(client).items() if k not in before}
            return message, mine
        finally:
            await layer.flush()

    message, mine = asyncio.run(probe())
    assert message == {"type": "probe", "text": "x" * 300_000}
    assert mine, "the layer's subscription was not seen by Redis"
    assert {c["resp"] for c in mine.values()} == {"2"}, mine
