"""A job's whole life with real parts: submitted over HTTP to uvicorn, admitted and run by a
real Celery worker with real horovodrun, output stored in PostgreSQL."""
import re
import signal

import pytest

from jobs.models import Job, LogLine, State
from tests.conftest import FIXTURES, job_processes, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

COUNT_LINES = (FIXTURES / "count_lines.py").read_bytes()


def upload(http, content=COUNT_LINES, name="count_lines.py"):
    response = http.post(f"{http.base}/api/scripts/", files={"file": (name, content)})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def submit(http, **fields):
    response = http.post(f"{http.base}/api/jobs/", json={"image": "horovod-cpu", **fields})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def wait_state(job_id, states, timeout=120):
    def reached():
        job = Job.objects.get(pk=job_id)
        return job if job.state in states else None
    return wait_for(reached, timeout=timeout, interval=0.2, message=f"job {job_id} to reach {states}")


def stored_lines(job_id):
    return list(LogLine.objects.filter(job_id=job_id).order_by("seq"))


def assert_succeeded_with_every_line(job_id, count, ranks=(0, 1)):
    """The job (of count_lines.py) ends SUCCEEDED with a gap-free log holding each rank's
    `count` numbered lines once, in order."""
    job = wait_state(job_id, {State.SUCCEEDED, State.FAILED, State.CANCELLED}, timeout=120)
    assert job.state == State.SUCCEEDED, job.reason
    lines = stored_lines(job_id)
    assert [line.seq for line in lines] == list(range(len(lines)))
    for rank in ranks:
        texts = [line.text for line in lines if line.rank == rank and "line=" in line.text]
        assert texts == [f"rank={rank} line={i}" for i in range(count)]


def test_two_rank_job_runs_to_success_with_every_line_in_order(http):
    job_id = submit(http, gpus=2, script=upload(http), args=["--lines", "30"], name="two ranks")

    job = wait_state(job_id, {State.SUCCEEDED, State.FAILED, State.CANCELLED})
    assert job.state == State.SUCCEEDED, job.reason
    assert job.exit_code == 0 and job.failed_rank is None
    assert job.started_at and job.finished_at and job.gpu_seconds > 0

    lines = stored_lines(job_id)
    assert [line.seq for line in lines] == list(range(len(lines)))            # gap-free
    for rank in (0, 1):
        out = [l.text for l in lines if l.rank == rank and l.stream == "stdout"]
        numbered = [int(re.match(rf"rank={rank} line=(\d+)$", t).group(1)) for t in out if "line=" in t]
        assert numbered == list(range(30))                                      # all, once, in order
        assert out[-1] == f"rank={rank} done"
        errs = [l.text for l in lines if l.rank == rank and l.stream == "stderr" and "err=" in l.text]
        assert errs == [f"rank={rank} err={i}" for i in range(0, 30, 5)]

    events = [e["state"] for e in http.get(f"{http.base}/api/jobs/{job_id}/").json()["events"] if e["state"]]
    assert events == ["QUEUED", "LAUNCHING", "RUNNING", "SUCCEEDED"]

    page = http.get(f"{http.base}/api/jobs/{job_id}/logs/", params={"rank": 1, "limit": 5}).json()
    assert [l["rank"] for l in page["lines"]] == [1] * 5
    rest = http.get(f"{http.base}/api/jobs/{job_id}/logs/", params={"since": page["next"], "rank": 1}).json()
    assert len(page["lines"]) + len(rest["lines"]) == len([l for l in lines if l.rank == 1])


def test_failing_rank_ends_failed_with_exit_code_and_rank(http):
    job_id = submit(http, gpus=2, script=upload(http), args=["--lines", "3", "--fail-rank", "1", "--exit-code", "3"])

    job = wait_state(job_id, {State.SUCCEEDED, State.FAILED, State.CANCELLED})
    assert job.state == State.FAILED
    assert (job.exit_code, job.failed_rank) == (3, 1)
    assert "rank 1 exited with code 3" in job.reason and "giving up" in job.reason
    body = http.get(f"{http.base}/api/jobs/{job_id}/").json()
    assert (body["state"], body["exit_code"], body["failed_rank"]) == ("FAILED", 3, 1)
    assert not job_processes(job_id)


def test_cancel_of_a_running_job_stops_every_process(http):
    job_id = submit(http, gpus=2, script=upload(http), args=["--lines", "10000", "--interval", "0.05"])
    try:
        wait_for(lambda: LogLine.objects.filter(job_id=job_id, text__startswith="rank=1 line=").exists(),
                 timeout=120, message="rank 1 to print")
    except AssertionError as error:
        job = Job.objects.get(pk=job_id)
        raise AssertionError(f"{error}; the job is {job.state} ({job.reason!r}), its events: "
                             f"{list(job.events.values_list('state', 'message'))}") from None
    assert len(job_processes(job_id)) >= 3                                    # launcher + 2 ranks

    response = http.post(f"{http.base}/api/jobs/{job_id}/cancel/")
    assert response.status_code == 202, response.text

    job = wait_state(job_id, {State.SUCCEEDED, State.FAILED, State.CANCELLED}, timeout=60)
    assert job.state == State.CANCELLED
    assert job_processes(job_id) == []
    assert http.post(f"{http.base}/api/jobs/{job_id}/cancel/").status_code == 409


def test_worker_killed_mid_job_is_replaced_and_the_job_finishes_without_gaps(http, celery_worker):
    job_id = submit(http, gpus=2, script=upload(http), args=["--lines", "80", "--interval", "0.05"])
    wait_for(lambda: LogLine.objects.filter(job_id=job_id, text__startswith="rank=0 line=10").exists(),
             timeout=120, message="the job to be running")

    celery_worker.kill(signal.SIGKILL)                                       # the follower dies with it
    try:
        assert Job.objects.get(pk=job_id).state == State.RUNNING
        assert job_processes(job_id), "training must survive the worker"
    finally:                                  # a failure here must not leave later tests without a worker
        celery_worker.start()

    assert_succeeded_with_every_line(job_id, 80)


def test_queued_job_waits_with_a_reason_and_cancels_at_once(http):
    # The test portal has 4 local slots (conftest): a 2-process job leaves no room for 4 more.
    first = submit(http, gpus=2, script=upload(http), args=["--lines", "10000", "--interval", "0.1"])
    second = submit(http, gpus=4, script=upload(http), args=["--lines", "1"])
    wait_state(first, {State.RUNNING})
    queued = wait_for(lambda: (j := Job.objects.get(pk=second)).reason.startswith("waiting for capacity") and j,
                      message="the scheduler to tell why the second job waits")
    assert queued.state == State.QUEUED
    assert queued.reason == "waiting for capacity: 2 of 4 GPUs in use, this job needs 4"
    assert http.get(f"{http.base}/api/jobs/{second}/").json()["queue_position"] == 1

    assert http.post(f"{http.base}/api/jobs/{second}/cancel/").status_code == 202
    assert Job.objects.get(pk=second).state == State.CANCELLED
    http.post(f"{http.base}/api/jobs/{first}/cancel/")
    assert wait_state(first, {State.CANCELLED, State.FAILED, State.SUCCEEDED}).state == State.CANCELLED
