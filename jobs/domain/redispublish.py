"""Pushes sent in one pipeline with a plain Redis client (channels_redis's pub/sub layer), and
only where someone hears them (jobs.domain.audience).

The layer publishes one message at a time, each a round trip to Redis under its connection's
lock: a round of 1,000 followed jobs' pushes would keep the announcement loop busy for a quarter
of the worker's interpreter time. With one Redis host, the same PUBLISH commands (the layer's own
channel names and serializer) go out in one pipeline instead, sent by the calling thread (the
announcer) with a plain Redis client: handed to the announcement loop, a training job's line a
round would cost the loop's wake-up and redis.asyncio's pipeline, about as much of the worker's
CPU as storing the line (BENCHMARKS.md, training).

A process that publishes line pushes also listens for the web processes' notices that they
relay a job from now on (every installation's "watching" group; a notice names the job's group),
so that it can leave out the pushes of jobs nobody watches.
"""
import logging
import os
import threading
import time
import weakref

import redis
from channels_redis.pubsub import RedisPubSubLoopLayer

from jobs.domain.audience import Audience

log = logging.getLogger(__name__)
WATCHING = "watching-"              # + the installation: the group web processes give notice on
RELISTEN_SECONDS = 1.0

_publishers = weakref.WeakKeyDictionary()   # layer -> (process id, its Publisher or None: sharded)
_publishers_lock = threading.Lock()         # asked from the announcer and from the follow steps


def watching_group(installation):
    return WATCHING + installation


def publisher(layer):
    """The layer's Publisher in this process, or None where the layer spreads its groups over
    several Redis hosts (or names one by sentinels)."""
    known = _publishers.get(layer)
    if known is None or known[0] != os.getpid():    # first use, or again after a fork
        with _publishers_lock:
            known = _publishers.get(layer)
            if known is None or known[0] != os.getpid():
                names = RedisPubSubLoopLayer(*layer._args, **layer._kwargs, channel_layer=layer)  # no loop needed
                host = dict(names._shards[0].host)
                if len(names._shards) != 1 or "address" not in host:
                    known = (os.getpid(), None)
                else:
                    known = (os.getpid(), Publisher(layer, names, host.pop("address"), host))
                _publishers[layer] = known
    return known[1]


class Publisher:
    def __init__(self, layer, names, address, options):
        self._layer, self._names = layer, names
        self._address, self._options = address, options
        self._client = redis.Redis(connection_pool=redis.ConnectionPool.from_url(address, **options))
        self.audience = Audience()
        self._listener = None
        self._listener_lock = threading.Lock()

    def publish(self, pairs):
        """[(group, message)] in one pipeline, but line pushes nobody would hear."""
        if self._listener is None and any(message.get("type") == "job.lines" for _, message in pairs):
            self._start_listening()
        pairs, token = self.audience.to_send(pairs)
        if not pairs:
            return
        with self._client.pipeline(transaction=False) as pipe:
            for group, message in pairs:
                pipe.publish(self._names._get_group_channel_name(group), self._layer.serialize(message))
            receivers = pipe.execute()
        self.audience.sent(pairs, receivers, token)

    def _start_listening(self):
        with self._listener_lock:
            if self._listener is None:
                self._listener = threading.Thread(target=self._listen_forever, name="ringmaster-audience",
                                                  daemon=True)
                self._listener.start()

    def _listen_forever(self):
        # Its own connection, without the layer's socket timeout: it waits for notices for as
        # long as none comes. Until it is subscribed, and while it is not, every push is sent.
        options = {**self._options, "socket_timeout": None, "socket_keepalive": True}
        client = redis.Redis(connection_pool=redis.ConnectionPool.from_url(self._address, **options))
        pattern = self._names._get_group_channel_name(WATCHING) + "*"     # every installation's
        while True:
            pubsub = client.pubsub()
            try:
                pubsub.psubscribe(pattern)
                for message in pubsub.listen():
                    if message["type"] == "psubscribe":
                        self._tell_where_lines_end(self.audience.listen(True))
                    elif message["type"] == "pmessage":
                        group = self._layer.deserialize(message["data"]).get("group")
                        if isinstance(group, str):
                            last_seq = self.audience.noticed(group)
                            if last_seq is not None:
                                self._tell_where_lines_end({group: last_seq})
            except Exception:           # Redis went away: every push is sent until it is back
                log.warning("stopped listening for the web processes' notices", exc_info=True)
            finally:
                self._tell_where_lines_end(self.audience.listen(False))
                pubsub.close()
            time.sleep(RELISTEN_SECONDS)

    def _tell_where_lines_end(self, left_out):
        """A push for each group whose line pushes were left unsent, saying where its stored lines
        end: a viewer that lacks some reads them from the database."""
        if not left_out:
            return
        try:
            with self._client.pipeline(transaction=False) as pipe:
                for group, last_seq in left_out.items():
                    pipe.publish(self._names._get_group_channel_name(group),
                                 self._layer.serialize({"type": "job.lines", "last_seq": last_seq}))
                pipe.execute()
        except Exception:
            log.warning("could not tell viewers of %d jobs where their lines end", len(left_out), exc_info=True)
