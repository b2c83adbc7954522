"""The proof of the backend seam: a backend defined only in the tests (tests/fakebackend) is
enabled through settings.RINGMASTER_BACKENDS and runs jobs through the REST API, the scheduler,
quotas, cancel and the job page, with no edit anywhere else.

The services here are this module's own: a Celery worker and uvicorn whose environment names
the fake backend, on a Celery queue of their own (a session worker of other tests, if one runs,
knows no fake backend and must not take these jobs).
"""
import os

import pytest
import requests
from django.conf import settings as django_settings

from jobs.domain import tokens
from jobs.models import ACTIVE_STATES, Job, Quota, State
from tests.conftest import WebServer, Worker, job_name, wait_for
from tests.fakebackend import HOLD_ENV, fake_root
from tests.integration.test_job_lifecycle import submit, wait_state

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
FAKE = "tests.fakebackend.FakeBackend"
ENDED = {State.SUCCEEDED, State.FAILED, State.CANCELLED}


@pytest.fixture(scope="module")
def fake_services(service_env, tmp_path_factory):
    """(uvicorn's URL, the worker), both with the fake backend enabled through the setting."""
    env = {**service_env, "RINGMASTER_BACKENDS": " ".join([*django_settings.RINGMASTER_BACKENDS, FAKE]),
           "RINGMASTER_QUEUE": f"ringmaster-fake-{os.getpid()}"}
    logs = tmp_path_factory.mktemp("fake-logs")
    worker = Worker("fake", env, logs / "worker.log", concurrency=4).start()
    web = WebServer(env, logs / "web.log")
    try:
        yield web.start().url, worker.ready()
    finally:
        web.stop()
        worker.stop()


@pytest.fixture
def api(fake_services, image, make_user, settings):
    """User alice's token session against this module's uvicorn; the fake backend is enabled in
    this process too (for the pages rendered here)."""
    settings.RINGMASTER_BACKENDS = [*settings.RINGMASTER_BACKENDS, FAKE]
    url, worker = fake_services
    worker.resume()
    session = requests.Session()
    session.user = make_user("alice")
    session.headers["Authorization"] = f"Token {tokens.issue(session.user).key}"
    session.base = url
    yield session
    for job_id in Job.objects.filter(state__in=ACTIVE_STATES).values_list("pk", flat=True):
        session.post(f"{url}/api/jobs/{job_id}/cancel/")   # a failed test leaves no job running
    worker.drain()          # before the test database is reset (tests.conftest.Worker)


def fake_job(api, gpus=2, hold=False):
    """Submit a fake job; with `hold` it runs until it is cancelled."""
    return submit(api, backend="fake", gpus=gpus, script_path="/fake/train.py", env={HOLD_ENV: "1"} if hold else {})


def refused(api, **fields):
    response = api.post(f"{api.base}/api/jobs/", json={"image": "horovod-cpu", "script_path": "/fake/train.py",
                                                       **fields})
    assert response.status_code == 400, response.text
    return response.json()


def reason_becomes(job_id, reason):
    return wait_for(lambda: (job := Job.objects.get(pk=job_id)).reason == reason and job,
                    message=f"job {job_id} to wait with the reason {reason!r}")


def cancel(api, job_id):
    assert api.post(f"{api.base}/api/jobs/{job_id}/cancel/").status_code == 202
    return wait_state(job_id, ENDED, timeout=60)


def test_a_fake_job_runs_to_success_with_its_lines_and_metric(api):
    job_id = fake_job(api)

    job = wait_state(job_id, ENDED)
    assert job.state == State.SUCCEEDED, job.reason
    assert (job.backend, job.exit_code) == ("fake", 0)
    events = [e["state"] for e in api.get(f"{api.base}/api/jobs/{job_id}/").json()["events"] if e["state"]]
    assert events == ["QUEUED", "LAUNCHING", "RUNNING", "SUCCEEDED"]

    lines = api.get(f"{api.base}/api/jobs/{job_id}/logs/").json()["lines"]
    assert [(line["rank"], line["stream"], line["text"]) for line in lines] == [
        (0, "stdout", "hello from rank 0"),
        (1, "stdout", "hello from rank 1"),
        (0, "stdout", 'RINGMASTER_METRIC {"step": 1, "loss": 0.5}'),
    ]
    series = api.get(f"{api.base}/api/jobs/{job_id}/metrics/").json()["series"]
    assert [(p["rank"], p["step"], p["value"]) for p in series["loss"]] == [(0, 1, 0.5)]


def test_the_api_refuses_a_job_too_large_for_it_and_an_unknown_backend(api):
    assert "at most 3 GPUs per job" in refused(api, backend="fake", gpus=4)["gpus"][0]
    assert "nope" in refused(api, backend="nope", gpus=1)["backend"][0]


def test_the_scheduler_keeps_a_job_waiting_for_its_capacity_and_cancel_ends_a_running_one(api):
    first = fake_job(api, hold=True)
    wait_state(first, {State.RUNNING})
    second = fake_job(api)
    queued = reason_becomes(second, "waiting for capacity: 2 of 3 GPUs in use, this job needs 2")
    assert queued.state == State.QUEUED

    assert cancel(api, first).state == State.CANCELLED
    assert (fake_root() / job_name(first) / "cancelled").exists()
    # The GPUs it held are free: the waiting job is admitted and runs.
    assert wait_state(second, ENDED).state == State.SUCCEEDED
    assert not (fake_root() / job_name(second) / "cancelled").exists()


def test_a_users_quota_on_the_fake_backend_applies(api):
    # bulk_create sends no post_save: this process's Celery queue is not the fake worker's.
    Quota.objects.bulk_create([Quota(user=api.user, backend="fake", jobs=1, gpus_per_job=2)])
    assert refused(api, backend="fake", gpus=3)["gpus"] == ["at most 2 GPUs per job for alice (user quota on fake)"]

    first = fake_job(api, gpus=1, hold=True)
    wait_state(first, {State.RUNNING})
    second = fake_job(api, gpus=1)
    reason_becomes(second, "waiting for quota: user alice on fake: 1 of 1 jobs running")

    assert cancel(api, second).state == State.CANCELLED
    assert cancel(api, first).state == State.CANCELLED


def test_the_form_offers_the_fake_backend_and_the_job_page_shows_it(api, client):
    job_id = fake_job(api)
    wait_state(job_id, ENDED)

    client.force_login(api.user)
    form = client.get("/jobs/new/").content.decode()
    assert '<option value="fake">Fake (tests)</option>' in form
    page = client.get(f"/jobs/{job_id}/").content.decode()
    assert "Fake (tests)" in page and f'<a id="fake-link" href="/jobs/{job_id}/">Fake details</a>' in page
