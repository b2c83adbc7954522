"""The job websocket against a real uvicorn with the Redis channel layer: replay from the
database after `since`, then live lines, no gap and no repeat; strangers are refused."""
import asyncio
import json
import time
import zlib

import pytest
from asgiref.sync import sync_to_async
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus
from websockets.extensions.permessage_deflate import ClientPerMessageDeflateFactory, PerMessageDeflate

from jobs.domain import states, tokens
from jobs.domain.logstore import append_output
from jobs.models import Job, LogLine, Script, State
from runners.output import Line

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def job(alice, image):
    script = Script.objects.create(owner=alice, name="t.py", sha256="0" * 64, size=1, content="x")
    job = Job.objects.create(owner=alice, image=image, gpus=2, script=script, time_limit_minutes=5)
    states.transition(job.pk, State.LAUNCHING)
    states.transition(job.pk, State.RUNNING)
    return job


def store(job, start, count):
    """Store lines as the follower does: through the log store, which also notifies viewers."""
    job.refresh_from_db()
    lines = [Line(rank=i % 2, stream="stdout", text=f"line {i}", ts=None) for i in range(start, start + count)]
    metric = [Line(rank=0, stream="stdout", text=f'RINGMASTER_METRIC {{"step": {start}, "loss": 0.5}}', ts=None)]
    assert append_output(job.pk, lines + metric, job.output_offset, job.output_offset + 1, {})


def ws_url(live_portal, job, since=None):
    url = live_portal.replace("http://", "ws://") + f"/ws/jobs/{job.pk}/"
    return url + (f"?since={since}" if since is not None else "")


def token_header(user):
    return {"Authorization": f"Token {tokens.issue(user).key}"}


async def receive_until(ws, predicate, timeout=20):
    """Collect messages until predicate(messages) holds."""
    messages = []
    async with asyncio.timeout(timeout):
        while not predicate(messages):
            messages.append(json.loads(await ws.recv()))
    return messages


def texts(messages):
    return [l["text"] for m in messages if m["type"] == "lines" for l in m["lines"]]


def seqs(messages):
    return [l["seq"] for m in messages if m["type"] == "lines" for l in m["lines"]]


def test_replay_after_since_then_live_without_gap_or_repeat(live_portal, job, alice):
    store(job, 0, 10)                                     # seq 0..10 (10 = the metric line)
    headers = token_header(alice)

    async def scenario():
        async with connect(ws_url(live_portal, job, since=4), additional_headers=headers) as ws:
            first = await receive_until(ws, lambda m: 10 in seqs(m) and any(x["type"] == "metrics" for x in m))
            assert first[0] == {"type": "state", "state": "RUNNING", "reason": ""}
            assert seqs(first) == list(range(5, 11))
            assert any(m["type"] == "metrics" and m["points"][0]["name"] == "loss" for m in first)
            await sync_to_async(store)(job, 100, 50)      # seq 11..61, pushed live
            live = await receive_until(ws, lambda m: 61 in seqs(m) and m[-1]["type"] == "metrics")
            assert seqs(live) == list(range(11, 62))
            assert texts(live)[0] == "line 100"
            await sync_to_async(states.transition)(job.pk, State.SUCCEEDED)
            ended = await receive_until(ws, lambda m: any(x["type"] == "state" for x in m))
            assert [m for m in ended if m["type"] == "state"] == [{"type": "state", "state": "SUCCEEDED", "reason": ""}]
        async with connect(ws_url(live_portal, job, since=61), additional_headers=headers) as ws:
            again = await receive_until(ws, lambda m: len(m) >= 1)
            assert again == [{"type": "state", "state": "SUCCEEDED", "reason": ""}]
            # Nothing repeated: the next lines the viewer gets are the ones stored after it connected.
            await sync_to_async(store)(job, 200, 1)        # seq 62 (line), 63 (metric)
            after = await receive_until(ws, lambda m: 63 in seqs(m))
            assert seqs(after) == [62, 63]

    asyncio.run(scenario())


def test_strangers_and_anonymous_clients_are_refused_before_any_data(live_portal, job, make_user):
    bob = make_user("bob")

    async def refused(headers):
        with pytest.raises(InvalidStatus) as info:
            async with connect(ws_url(live_portal, job), additional_headers=headers):
                pass
        return info.value.response.status_code

    assert asyncio.run(refused(token_header(bob))) == 403
    assert asyncio.run(refused({"Authorization": "Token not-a-token"})) == 403
    assert asyncio.run(refused({})) == 403                                   # no Origin, no token
    assert asyncio.run(refused({"Origin": "http://evil.example", **token_header(job.owner)})) == 403
    # A bad token with no Origin is not a way around the Origin check for a session cookie.
    cookie = session_cookie(job.owner)
    assert asyncio.run(refused({"Authorization": "Token not-a-token", "Cookie": cookie})) == 403
    assert asyncio.run(refused({"Authorization": "Token", "Cookie": cookie})) == 403

    async def accepted(headers):
        async with connect(ws_url(live_portal, job), additional_headers=headers) as ws:
            return (await receive_until(ws, lambda m: any(x["type"] == "state" for x in m)))[0]["type"]
    assert asyncio.run(accepted({"Origin": live_portal, "Cookie": cookie})) == "state"   # the cookie is good


def test_only_the_portals_own_origin_rides_the_session_cookie(live_portal, job):
    """A page served from another port of the portal's host, or over another scheme, is another
    site: its websocket is refused although the browser sends the user's cookie with it."""
    cookie = session_cookie(job.owner)
    host, port = live_portal.removeprefix("http://").split(":")

    async def answer(headers):
        try:
            async with connect(ws_url(live_portal, job), additional_headers={"Cookie": cookie, **headers}) as ws:
                return (await receive_until(ws, lambda m: any(x["type"] == "state" for x in m)))[0]["type"]
        except InvalidStatus as refusal:
            return refusal.response.status_code

    assert asyncio.run(answer({"Origin": f"http://{host}:{int(port) + 1}"})) == 403
    assert asyncio.run(answer({"Origin": f"http://localhost:{port}"})) == 403   # an allowed host, not this one
    assert asyncio.run(answer({"Origin": f"https://{host}:{port}"})) == 403
    assert asyncio.run(answer({"Origin": "null"})) == 403
    assert asyncio.run(answer({"Origin": live_portal})) == "state"
    # Behind a TLS proxy (uvicorn trusts X-Forwarded-Proto from loopback) the page is https.
    behind_tls = {"Origin": f"https://{host}:{port}", "X-Forwarded-Proto": "https"}
    assert asyncio.run(answer(behind_tls)) == "state"
    assert asyncio.run(answer({**behind_tls, "Origin": live_portal})) == 403


def session_cookie(user):
    from django.conf import settings
    from django.test import Client

    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def test_staff_may_watch_any_job(live_portal, job, make_user):
    headers = token_header(make_user("root", is_staff=True))

    async def first_message():
        async with connect(ws_url(live_portal, job), additional_headers=headers) as ws:
            return json.loads(await asyncio.wait_for(ws.recv(), 10))

    assert asyncio.run(first_message())["type"] == "state"


def test_a_viewer_left_quiet_for_a_while_still_gets_the_next_line(live_portal, job, alice):
    """Jobs go quiet (a long epoch, a checkpoint); the connection must outlive the silence.
    The silence is the scenario here, so it is slept on purpose: longer than the channel
    layer's 5-second blocking read from Redis."""
    store(job, 0, 3)
    headers = token_header(alice)

    async def scenario():
        async with connect(ws_url(live_portal, job, since=3), additional_headers=headers) as ws:
            await receive_until(ws, lambda m: m and m[0]["type"] == "state")
            await asyncio.sleep(12)
            await sync_to_async(store)(job, 3, 2)
            later = await receive_until(ws, lambda m: 6 in seqs(m))
            assert seqs(later) == [4, 5, 6]

    asyncio.run(scenario())


def test_many_viewers_of_one_job_each_get_every_line_once(live_portal, job, alice, make_user):
    """Viewers at the same place share each live batch (one query, one encoding per process)."""
    headers = [token_header(alice), token_header(make_user("root", is_staff=True))]
    store(job, 0, 5)                                       # seq 0..5

    async def viewer(index, ready):
        async with connect(ws_url(live_portal, job, since=5), additional_headers=headers[index % 2]) as ws:
            await receive_until(ws, lambda m: m and m[0]["type"] == "state")
            ready.release()
            got = await receive_until(ws, lambda m: 40 in seqs(m) and m[-1]["type"] == "metrics", timeout=60)
            return seqs(got), sum(len(m["points"]) for m in got if m["type"] == "metrics")

    async def scenario():
        ready = asyncio.Semaphore(0)
        viewers = [asyncio.ensure_future(viewer(i, ready)) for i in range(20)]
        for _ in viewers:
            await ready.acquire()
        for batch in range(5):                             # 5 batches of 7 lines (one a metric)
            await sync_to_async(store)(job, 100 + batch * 6, 6)
        return await asyncio.gather(*viewers)

    for got, points in asyncio.run(scenario()):
        assert got == list(range(6, 41))
        assert points == 5


def test_a_connected_viewer_does_not_hold_the_web_server_when_it_stops(restartable_portal, job, alice):
    """A restart with viewers connected is quick (it does not wait out the 10 s graceful limit on
    a blocked Redis read): the viewer is told at once and the server is gone within a few seconds."""
    import time

    headers = token_header(alice)

    async def scenario():
        async with connect(ws_url(restartable_portal.url, job), additional_headers=headers) as ws:
            await receive_until(ws, lambda m: any(x["type"] == "state" for x in m))
            began = time.monotonic()
            restartable_portal.process.terminate()                     # SIGTERM, as a restart sends
            with pytest.raises(Exception):
                async with asyncio.timeout(5):
                    while True:
                        await ws.recv()
            told = time.monotonic() - began
            await asyncio.to_thread(restartable_portal.process.wait, 30)
            return told, time.monotonic() - began

    told, gone = asyncio.run(scenario())
    assert told < 3 and gone < 5, (told, gone)


def test_lines_pushed_live_read_exactly_as_the_same_lines_replayed_and_from_the_api(live_portal, job, alice):
    """A live viewer gets the lines the follower encoded with its push; a later viewer and the
    REST API read them from the database: all three must say the same, times and points included."""
    import requests
    from datetime import datetime

    headers = token_header(alice)
    stamped = Line(rank=1, stream="stderr", text="stamped ü \\ \"q\"", ts=datetime(2026, 11, 22, 1, 41, 9))

    async def scenario():
        async with connect(ws_url(live_portal, job, since=-1), additional_headers=headers) as ws:
            await receive_until(ws, lambda m: m and m[0]["type"] == "state")
            await sync_to_async(store)(job, 0, 3)                 # seq 0..3, 3 = the metric line
            await sync_to_async(lambda: append_output(job.pk, [stamped], 1, 2, {}))()  # seq 4
            # Pushes that arrive while the viewer is sending go as one frame: the metrics of
            # seq 3 may come after the line of seq 4, as they do from the database.
            live = await receive_until(ws, lambda m: 4 in seqs(m) and any(x["type"] == "metrics" for x in m))
        async with connect(ws_url(live_portal, job, since=-1), additional_headers=headers) as ws:
            replayed = await receive_until(ws, lambda m: 4 in seqs(m) and any(x["type"] == "metrics" for x in m))
        return live, replayed

    live, replayed = asyncio.run(scenario())

    def lines(messages):
        return [line for m in messages if m["type"] == "lines" for line in m["lines"]]

    def points(messages):
        return [point for m in messages if m["type"] == "metrics" for point in m["points"]]

    assert lines(live) == lines(replayed) and len(lines(live)) == 5
    assert points(live) == points(replayed) and [p["name"] for p in points(live)] == ["loss"]
    api = requests.get(f"{live_portal}/api/jobs/{job.pk}/logs/", headers=headers, timeout=10).json()
    assert api["lines"] == lines(live)


def test_a_viewer_forwards_the_lines_a_push_carries_only_when_it_is_right_before_them(live_portal, job, alice):
    """The push's own bytes go to a viewer whose last seq is the push's `after`; a viewer elsewhere
    reads the database instead (here pushed lines are not stored, which tells the two apart)."""
    from jobs.domain import live, logwire
    from tests.conftest import wait_for

    store(job, 0, 2)                                               # seq 0..2
    headers = token_header(alice)
    ts = job.created_at

    async def scenario():
        async with connect(ws_url(live_portal, job, since=2), additional_headers=headers) as ws:
            await receive_until(ws, lambda m: m and m[0]["type"] == "state")
            # The web process says it relays the job; until this process hears so, its pushes of
            # a job nobody watched (seq 0..2) are left out.
            await sync_to_async(wait_for)(lambda: live.heard(job.pk), timeout=10, message="the relay's notice")
            elsewhere = logwire.lines_message([(2, 0, "stdout", ts, "not for this viewer"), (3, 0, "stdout", ts, "x")])
            await sync_to_async(live.publish_lines)(job.pk, 3, 1, elsewhere, None)
            here = logwire.lines_message([(3, 0, "stdout", ts, "only in the push")])
            await sync_to_async(live.publish_lines)(job.pk, 3, 2, here, None)
            got = await receive_until(ws, lambda m: 3 in seqs(m))
            await sync_to_async(store)(job, 10, 1)                 # seq 3..4 stored for real; the viewer has 3
            later = await receive_until(ws, lambda m: 4 in seqs(m))
            return got, later

    got, later = asyncio.run(scenario())
    assert texts(got) == ["only in the push"]
    assert texts(later) == ['RINGMASTER_METRIC {"step": 10, "loss": 0.5}']


def test_a_push_for_another_portals_job_of_the_same_id_never_reaches_a_viewer(live_portal, job, alice, settings):
    """Two installations on one Redis server (each its own database number, say) share its
    pub/sub channels: the other's job of the same id is announced on a channel of its own."""
    from jobs.domain import live, logwire
    from jobs.installation import installation_id

    store(job, 0, 2)                                               # seq 0..2
    headers = token_header(alice)
    ts = job.created_at

    def announce_elsewhere():
        settings.RINGMASTER_INSTALLATION_ID = "another"
        installation_id()                       # read as a worker reads it when it takes a job up
        line = (3, 0, "stdout", ts, "another portal's line")
        live.publish_lines(job.pk, 3, 2, logwire.lines_message([line]), None)
        settings.RINGMASTER_INSTALLATION_ID = ""
        installation_id()                       # this portal's again
        # Then a change here: a viewer sends the lines it has before a new state, so once the
        # state has come, the other portal's line would have come before it.
        Job.objects.filter(pk=job.pk).update(reason="after the other portal's push")
        live.publish_state(Job.objects.get(pk=job.pk))

    async def scenario():
        async with connect(ws_url(live_portal, job, since=2), additional_headers=headers) as ws:
            got = await receive_until(ws, lambda m: m and m[0]["type"] == "state")
            await sync_to_async(announce_elsewhere)()
            got += await receive_until(ws, lambda m: m and m[-1].get("reason") == "after the other portal's push")
            await sync_to_async(store)(job, 10, 1)      # seq 3..4, this portal's
            return got + await receive_until(ws, lambda m: 4 in seqs(m))

    assert texts(asyncio.run(scenario())) == ["line 10", 'RINGMASTER_METRIC {"step": 10, "loss": 0.5}']


class Publishes:
    """Counts the messages published to this installation's groups (a job's, the watching
    notices) from now on. Other test processes publish on the same Redis server, to groups of
    their own installations."""

    def __init__(self):
        import redis
        from django.conf import settings

        from jobs.installation import installation_id

        self.client = redis.Redis.from_url(settings.REDIS_URL)
        self.marker = f"counted-{installation_id()}"
        self.pubsub = self.client.pubsub()
        self.pubsub.psubscribe(f"*-{installation_id()}*")
        confirmed = self.pubsub.get_message(timeout=10)
        assert confirmed and confirmed["type"] == "psubscribe", confirmed

    def count(self):
        """The messages published so far: a marker published last arrives after all of them."""
        self.client.publish(self.marker, b"")
        seen, deadline = 0, time.monotonic() + 10
        while time.monotonic() < deadline:
            message = self.pubsub.get_message(timeout=1)
            if message is None:
                continue
            if message["channel"] == self.marker.encode():
                self.pubsub.close()
                return seen
            seen += 1
        raise AssertionError("the marker published last did not arrive within 10 s")


def test_a_job_nobody_watches_is_not_announced_and_its_first_viewer_gets_every_line_live(
        live_portal, job, alice, monkeypatch):
    """Each stored batch of a job whose page nobody has open would be a PUBLISH that reaches no
    one: they are left out; a viewer that opens the page gets what is stored, then each new line
    as it comes (not only at the next probe)."""
    from channels.layers import get_channel_layer

    from jobs.domain import audience, redispublish
    from tests.conftest import wait_for

    monkeypatch.setattr(audience, "PROBE_SECONDS", 300.0)
    store(job, 0, 1)                                   # nobody hears it: the job is marked unheard
    publisher = redispublish.publisher(get_channel_layer())
    wait_for(lambda: publisher.audience.listening, timeout=10, message="the notices to be listened for")
    store(job, 2, 1)
    published = Publishes()
    for start in range(10, 30):
        store(job, start, 1)                           # seq 4..43, two lines a batch
    headers = token_header(alice)

    async def scenario():
        async with connect(ws_url(live_portal, job), additional_headers=headers) as ws:
            got = await receive_until(ws, lambda m: 43 in seqs(m))
            await sync_to_async(store)(job, 100, 1)   # seq 44..45: announced to the new viewer
            return got + await receive_until(ws, lambda m: 45 in seqs(m), timeout=10)

    got = asyncio.run(scenario())
    assert seqs(got) == list(range(46))
    # the relay's notice, the pushes of seq 44..45, and of whatever was left out when it came
    assert 1 <= published.count() <= 5


class _Recorded(PerMessageDeflate):
    """permessage-deflate that keeps each message as it came over the wire, still compressed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.wire = []

    def decode(self, frame, *, max_size=None):
        if frame.rsv1:
            self.wire.append(bytes(frame.data))
        return super().decode(frame, max_size=max_size)


class _RecordingFactory(ClientPerMessageDeflateFactory):
    def process_response_params(self, params, accepted_extensions):
        made = super().process_response_params(params, accepted_extensions)
        self.made = _Recorded(made.remote_no_context_takeover, made.local_no_context_takeover,
                              made.remote_max_window_bits, made.local_max_window_bits)
        return self.made


def test_frames_are_compressed_at_level_1_each_on_its_own(live_portal, job, alice):
    """A viewer's frames are compressed (permessage-deflate, as a browser asks) at zlib level 1,
    not uvicorn's default 6, and each without the context of the frames before it, so that the
    web process compresses a frame once for all the viewers it goes to (portal/websocket.py):
    the frames are exactly what a fresh level-1 compressor makes of each message, and a second
    viewer gets the very same bytes."""
    store(job, 0, 3000)
    headers = token_header(alice)

    async def view():
        factory = _RecordingFactory()
        async with connect(ws_url(live_portal, job, since=-1), additional_headers=headers,
                           extensions=[factory], compression=None, max_size=None) as ws:
            messages = await receive_until(ws, lambda m: 3000 in seqs(m) and m[-1]["type"] == "metrics")
            assert ws.protocol.extensions == [factory.made]
            return messages, factory.made

    messages, made = asyncio.run(view())
    assert made.remote_no_context_takeover            # the server said it keeps no context
    texts_sent = [json.dumps(m) for m in messages]
    assert len(made.wire) == len(messages)
    expected = []
    for text in texts_sent:                            # uvicorn's window (2^12) and memory level (5)
        level_1 = zlib.compressobj(1, zlib.DEFLATED, -12, 5)
        expected.append((level_1.compress(text.encode()) + level_1.flush(zlib.Z_SYNC_FLUSH))[:-4])
    assert made.wire == expected
    assert sum(map(len, made.wire)) * 4 < sum(len(text) for text in texts_sent)
    again, made_again = asyncio.run(view())
    assert again == messages and made_again.wire == made.wire


class FollowedFakeJob:
    """A fake backend's job (tests.fakebackend) of alice's, followed in this process (which plays
    the worker), RUNNING with its first three lines stored; the test prints its lines."""

    def __init__(self, owner, image, settings):
        from jobs.backends import job_spec
        from jobs.domain import follow
        from tests.conftest import wait_for
        from tests.fakebackend import HOLD_ENV, FakeRunner, fake_root

        settings.RINGMASTER_BACKENDS = [*settings.RINGMASTER_BACKENDS, "tests.fakebackend.FakeBackend"]
        self.job = Job.objects.create(owner=owner, image=image, gpus=1, script_path="/fake/train.py",
                                      backend="fake", env={HOLD_ENV: "1"}, time_limit_minutes=5,
                                      state=State.LAUNCHING)
        self.following = follow.start(self.job.pk)
        self.log_file = FakeRunner(fake_root()).job_dir(job_spec(self.job)) / "output.log"
        wait_for(lambda: Job.objects.filter(pk=self.job.pk, state=State.RUNNING, next_seq=3).exists(), timeout=30,
                 message="the job to run and store its first three lines")

    def print_lines(self, first, count):
        """Append `count` lines to the job's output, one every 50 ms; when each was written."""
        written = {}
        with open(self.log_file, "ab", buffering=0) as out:
            for number in range(first, first + count):
                out.write(f"[0]<stdout>:line {number}\n".encode())
                written[number] = time.monotonic()
                time.sleep(0.05)
        return written

    def stored(self, first, count):
        """Once stored, the texts of the lines from seq `first` on, and in how many writer rounds
        they were stored (a line gets the time of the round that stored it)."""
        from tests.conftest import wait_for

        wait_for(lambda: Job.objects.filter(pk=self.job.pk, next_seq=first + count).exists(), timeout=30,
                 message=f"lines up to seq {first + count - 1} to be stored")
        stored = list(LogLine.objects.filter(job=self.job, seq__gte=first).order_by("seq").values_list("text", "ts"))
        return [text for text, _ in stored], len({ts for _, ts in stored})

    def end(self):
        """Cancel the job and wait until nothing is left of it in this process that could use the
        database (the worker is drained after the test: tests.conftest.Worker)."""
        from jobs.domain import dbpool
        from tests.conftest import wait_for

        Job.objects.filter(pk=self.job.pk).update(cancel_requested=True)
        self.following.join(60)
        assert not self.following.is_alive()
        dbpool.pool().close_all()           # the test database is dropped at the end of the session
        # The web process ends the viewer's relay on a connection of its own.
        wait_for(_others_quiet, timeout=30, message="the database's other connections to be idle")


async def arrivals(ws, numbers):
    """When each of the lines "line <n>" for n in `numbers` reached the viewer."""
    arrived = {}
    async with asyncio.timeout(20):
        while len(arrived) < len(numbers):
            message = json.loads(await ws.recv())
            for line in message.get("lines", []) if message["type"] == "lines" else []:
                arrived.setdefault(int(line["text"].split()[-1]), time.monotonic())
    return arrived


def test_a_job_nobody_watches_has_its_output_stored_a_second_at_a_time_and_a_watched_one_line_by_line(
        live_portal, celery_worker, alice, image, settings):
    """What a job prints while nobody has its page open is gathered for a second before its
    follow reads on (one writer round a second, not one a line), and nothing of it is lost; once
    a viewer opens the page, every line is stored and reaches the viewer as it comes. A fake
    backend's job (tests.fakebackend), followed in this process, prints a line every 50 ms."""
    from channels.layers import get_channel_layer

    from jobs.domain import live, redispublish
    from tests.conftest import wait_for

    fake = FollowedFakeJob(alice, image, settings)
    job = fake.job
    try:
        publisher = redispublish.publisher(get_channel_layer())
        wait_for(lambda: publisher.audience.listening, timeout=30, message="the notices to be listened for")
        fake.print_lines(0, 1)                          # seq 3: its push reaches no one
        wait_for(lambda: not live.heard(job.pk), timeout=30, message="the job to be known as one nobody watches")
        fake.print_lines(1, 39)                         # seq 4..42, over 2 s
        texts_stored, rounds = fake.stored(4, 39)
        assert texts_stored == [f"line {n}" for n in range(1, 40)]
        assert rounds <= 6, f"39 lines of a job nobody watches were stored in {rounds} rounds"

        headers = token_header(alice)

        async def watch():
            async with connect(ws_url(live_portal, job), additional_headers=headers) as ws:
                await receive_until(ws, lambda m: 42 in seqs(m))          # what is stored
                await sync_to_async(wait_for)(lambda: live.heard(job.pk), timeout=10,
                                              message="the worker to hear of the viewer")
                writing = asyncio.get_running_loop().run_in_executor(None, fake.print_lines, 40, 20)  # seq 43..62
                arrived = await arrivals(ws, range(40, 60))
                return await writing, arrived

        written, arrived = asyncio.run(watch())
        assert sorted(arrived) == list(range(40, 60))
        late = max(arrived[n] - written[n] for n in arrived)
        assert late < 0.5, f"a watched job's line reached its viewer {late:.2f} s after it was printed"
    finally:
        fake.end()


@pytest.fixture
def embedded_portal(service_env, tmp_path, settings):
    """A web process without Redis, as make run's embedded default: Channels' in-memory layer, so
    its viewers poll the database. This process plays its worker: the same database and data
    folder, and a layer of its own whose pushes reach no viewer there."""
    from pathlib import Path

    from channels.layers import InMemoryChannelLayer, channel_layers

    from tests.conftest import WebServer

    env = {name: value for name, value in service_env.items() if name != "REDIS_URL"}
    server = WebServer(env, tmp_path / "web.log").start()
    settings.DATA_DIR = Path(env["RINGMASTER_DATA_DIR"])
    before = channel_layers.set("default", InMemoryChannelLayer())
    yield server.url
    if before is None:
        channel_layers.backends.pop("default", None)        # made again from the settings on next use
    else:
        channel_layers.set("default", before)
    server.stop()


def test_without_redis_a_job_nobody_watches_is_stored_a_second_at_a_time_and_a_watched_one_line_by_line(
        embedded_portal, celery_worker, alice, image, settings):
    """The same without Redis: the worker's pushes reach no viewer, so what a job prints while
    nobody polls it is gathered for a second; once a viewer polls it, each line is stored as it
    comes and reaches the viewer at its next look (within about a second)."""
    from jobs.domain import live
    from tests.conftest import wait_for

    fake = FollowedFakeJob(alice, image, settings)
    job = fake.job
    try:
        fake.print_lines(0, 40)                         # seq 3..42, over 2 s
        texts_stored, rounds = fake.stored(3, 40)
        assert texts_stored == [f"line {n}" for n in range(40)]
        assert rounds <= 6, f"40 lines of a job nobody watches were stored in {rounds} rounds"

        headers = token_header(alice)

        async def watch():
            async with connect(ws_url(embedded_portal, job), additional_headers=headers) as ws:
                await receive_until(ws, lambda m: 42 in seqs(m))          # what is stored
                await sync_to_async(wait_for)(lambda: not live.nobody_hears(job.pk, lambda: None), timeout=10,
                                              message="the worker to know of the viewer")
                # The follow may be in the middle of a gather that began before the viewer came:
                # the next line it reads is the first it stores as it comes.
                await sync_to_async(fake.print_lines)(40, 1)                                  # seq 43
                await receive_until(ws, lambda m: 43 in seqs(m))
                writing = asyncio.get_running_loop().run_in_executor(None, fake.print_lines, 41, 20)  # seq 44..63
                arrived = await arrivals(ws, range(41, 61))
                return await writing, arrived

        written, arrived = asyncio.run(watch())
        assert sorted(arrived) == list(range(41, 61))
        texts_stored, rounds = fake.stored(44, 20)
        assert texts_stored == [f"line {n}" for n in range(41, 61)]
        assert rounds >= 15, f"20 lines of a watched job printed 50 ms apart were stored in {rounds} rounds"
        late = max(arrived[n] - written[n] for n in arrived)
        assert late < 2.0, f"a watched job's line reached its viewer {late:.2f} s after it was printed"
    finally:
        fake.end()


def _others_quiet():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid() AND state IN ('active', 'idle in transaction')")
        return cursor.fetchone()[0] == 0
