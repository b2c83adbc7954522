"""TensorBoard scalars (issue 44, part 5): the event files a job's SummaryWriter writes under
RINGMASTER_OUTPUT_DIR become metric points under their tags, read incrementally with the
tensorboard package's reader, and served by GET /api/jobs/<id>/metrics/."""
import time

import pytest
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from jobs import backends
from jobs.domain import tbmetrics
from jobs.models import Job, MetricPoint, Script, State

pytestmark = pytest.mark.django_db


def scalar(writer, tag, step, value):
    writer.add_event(Event(wall_time=time.time(), step=step,
                           summary=Summary(value=[Summary.Value(tag=tag, simple_value=value)])))
    writer.flush()


@pytest.fixture
def running(alice, image):
    script = Script.objects.create(owner=alice, name="t.py", sha256="1" * 64, size=1, content="print(1)\n")
    job = Job.objects.create(owner=alice, image=image, gpus=1, time_limit_minutes=5, script=script, state=State.RUNNING)
    folder = backends.of(job).artifacts_root(job)
    (folder / "tb").mkdir(parents=True)
    yield job, EventFileWriter(str(folder / "tb"))
    tbmetrics._readers.pop(job.pk, None)


def test_scalars_written_while_the_job_runs_are_read_incrementally_and_served_under_their_tags(running, api_client):
    job, writer = running
    for step in range(3):
        scalar(writer, "train/loss", step, 1.0 / (step + 1))
    assert tbmetrics.scrape_running() == 3
    scalar(writer, "train/loss", 3, 0.2)
    scalar(writer, "lr", 3, 0.01)
    assert tbmetrics.scrape(job) == 2                   # only what was written since

    series = api_client(job.owner).get(f"/api/jobs/{job.pk}/metrics/").json()["series"]
    assert [(p["step"], round(p["value"], 3)) for p in series["train/loss"]] == [(0, 1.0), (1, 0.5), (2, 0.333), (3, 0.2)]
    assert [(p["step"], p["value"]) for p in series["lr"]] == [(3, pytest.approx(0.01))]


def test_a_fresh_reader_stores_no_point_twice(running):
    job, writer = running
    scalar(writer, "loss", 0, 1.0)
    tbmetrics.scrape(job)
    tbmetrics._readers.clear()                           # another worker, or this one restarted
    scalar(writer, "loss", 1, 0.5)
    assert tbmetrics.scrape(job, last=True) == 1
    assert list(MetricPoint.objects.filter(job=job).order_by("step").values_list("step", flat=True)) == [0, 1]
    assert job.pk not in tbmetrics._readers


def test_an_event_file_brought_back_anew_adds_only_its_new_steps(running, tmp_path):
    job, writer = running
    scalar(writer, "loss", 0, 1.0)
    assert tbmetrics.scrape(job) == 1
    remote = EventFileWriter(str(tmp_path))             # the file on the instance, grown since
    scalar(remote, "loss", 0, 1.0)
    scalar(remote, "loss", 1, 0.5)
    (path,) = (backends.of(job).artifacts_root(job) / "tb").iterdir()
    copy = path.with_name(".copy")
    copy.write_bytes(next(tmp_path.iterdir()).read_bytes())
    copy.replace(path)                                   # what a bring-back over SFTP does
    assert tbmetrics.scrape(job) == 1
    assert list(MetricPoint.objects.filter(job=job).order_by("step").values_list("step", flat=True)) == [0, 1]
