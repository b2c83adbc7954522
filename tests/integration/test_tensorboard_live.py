"""TensorBoard scalars on the job websocket (issue 44, part 5), against a real uvicorn: the points
beat's scrape stores (seq -1, from no log line) reach the job's open websockets as a metrics
message, once, beside the gap-free line sequence; a viewer that connects with ?tb_since=<mark>
(the job page's mark) is sent those stored past the mark, and no point twice."""
import asyncio
import time

import pytest
from asgiref.sync import sync_to_async
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from websockets.asyncio.client import connect

from jobs import backends
from jobs.domain import tbmetrics
from jobs.tasks import scrape_tensorboard
from tests.integration.test_websocket import (embedded_portal, job, receive_until, seqs, store,  # noqa: F401 (fixtures)
                                              token_header, ws_url)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def scalars(job):
    """scalars(tag, {step: value}): what the job's SummaryWriter writes under its output folder."""
    writers = {}

    def write(tag, values):
        if not writers:
            folder = backends.of(job).artifacts_root(job) / "runs"
            folder.mkdir(parents=True, exist_ok=True)
            writers["runs"] = EventFileWriter(str(folder))
        for step, value in values.items():
            writers["runs"].add_event(Event(wall_time=time.time(), step=step,
                                            summary=Summary(value=[Summary.Value(tag=tag, simple_value=value)])))
        writers["runs"].flush()

    yield write
    for writer in writers.values():
        writer.close()
    tbmetrics._readers.pop(job.pk, None)


def scrape():
    """Beat's task, as beat runs it: every running job's event files, once."""
    return scrape_tensorboard()


def tb_points(messages):
    """[(name, step, value)] of the points of no line (seq -1) in `messages`, in the order sent."""
    return [(p["name"], p["step"], p["value"]) for m in messages if m["type"] == "metrics"
            for p in m["points"] if p["seq"] == -1]


def test_scraped_scalars_reach_an_open_websocket_once_beside_the_line_sequence(live_portal, job, alice, scalars):
    store(job, 0, 4)                                      # seq 0..4 (4: the metric line)
    url = ws_url(live_portal, job, since=4) + f"&tb_since={tbmetrics.last_id(job.pk)}"
    headers = token_header(alice)

    async def scenario():
        async with connect(url, additional_headers=headers) as ws:
            await receive_until(ws, lambda m: any(x["type"] == "state" for x in m))
            await sync_to_async(scalars)("train/loss", {0: 1.0, 1: 0.5, 2: 0.25})
            assert await sync_to_async(scrape)() == 3
            pushed = await receive_until(ws, lambda m: len(tb_points(m)) >= 3)
            assert tb_points(pushed) == [("train/loss", 0, 1.0), ("train/loss", 1, 0.5), ("train/loss", 2, 0.25)]
            point = next(m for m in pushed if m["type"] == "metrics")["points"][0]
            assert set(point) == {"seq", "name", "rank", "step", "value", "ts"}     # as a metric line's points
            assert point["rank"] == "launcher" and point["ts"].endswith("Z")

            # Lines go on from where they were, gap-free, and nothing of the scrape comes again.
            await sync_to_async(store)(job, 100, 3)        # seq 5..8
            after = await receive_until(ws, lambda m: 8 in seqs(m))
            assert seqs(after) == [5, 6, 7, 8]
            assert tb_points(after) == []

            await sync_to_async(scalars)("train/loss", {3: 0.125})
            await sync_to_async(scalars)("lr", {3: 0.5})
            assert await sync_to_async(scrape)() == 2
            later = await receive_until(ws, lambda m: len(tb_points(m)) >= 2)
            assert sorted(tb_points(later)) == [("lr", 3, 0.5), ("train/loss", 3, 0.125)]

    asyncio.run(scenario())


def test_a_viewer_that_connects_later_gets_the_points_stored_past_its_mark_once(live_portal, job, alice, scalars):
    store(job, 0, 2)                                      # seq 0..2
    scalars("loss", {0: 4.0, 1: 2.0})
    assert scrape() == 2
    mark = tbmetrics.last_id(job.pk)                      # what the page holds: steps 0 and 1
    scalars("loss", {2: 1.0, 3: 0.5})
    assert scrape() == 2                                  # stored while nobody watched
    url = ws_url(live_portal, job, since=2) + f"&tb_since={mark}"
    headers = token_header(alice)

    async def scenario():
        async with connect(url, additional_headers=headers) as ws:
            first = await receive_until(ws, lambda m: len(tb_points(m)) >= 2)
            assert tb_points(first) == [("loss", 2, 1.0), ("loss", 3, 0.5)]
            await sync_to_async(scalars)("loss", {4: 0.25})
            assert await sync_to_async(scrape)() == 1
            await sync_to_async(store)(job, 10, 1)        # seq 3..4, pushed after the scalar
            live = await receive_until(ws, lambda m: 4 in seqs(m) and tb_points(m))
            assert tb_points(live) == [("loss", 4, 0.25)]
            assert seqs(live) == [3, 4]

    asyncio.run(scenario())
    # A reconnect from the same mark gets every point stored past it, and each once.

    async def reconnect():
        async with connect(url, additional_headers=headers) as ws:
            return await receive_until(ws, lambda m: len(tb_points(m)) >= 3)

    assert tb_points(asyncio.run(reconnect())) == [("loss", 2, 1.0), ("loss", 3, 0.5), ("loss", 4, 0.25)]


def test_without_redis_a_viewer_gets_the_scraped_points_by_polling_once_each(embedded_portal, job, alice, scalars):
    """make run's embedded defaults: the worker's pushes reach no web process; its viewers read
    the points from the database at each look."""
    url = ws_url(embedded_portal, job, since=-1) + "&tb_since=0"
    headers = token_header(alice)

    async def scenario():
        async with connect(url, additional_headers=headers) as ws:
            await receive_until(ws, lambda m: any(x["type"] == "state" for x in m))
            await sync_to_async(scalars)("loss", {0: 1.0, 1: 0.5})
            assert await sync_to_async(scrape)() == 2
            seen = await receive_until(ws, lambda m: len(tb_points(m)) >= 2)
            await sync_to_async(scalars)("loss", {2: 0.25})
            assert await sync_to_async(scrape)() == 1
            seen += await receive_until(ws, lambda m: tb_points(m))
            # Two more looks (each sends lines, then points): whatever they would repeat came by then.
            await sync_to_async(store)(job, 0, 1)          # seq 0..1
            seen += await receive_until(ws, lambda m: 1 in seqs(m))
            await sync_to_async(store)(job, 1, 1)          # seq 2..3
            seen += await receive_until(ws, lambda m: 3 in seqs(m))
            return seen

    assert tb_points(asyncio.run(scenario())) == [("loss", 0, 1.0), ("loss", 1, 0.5), ("loss", 2, 0.25)]
