"""A job's recovery policy (jobs.domain.recovery): what the form and the API take and refuse,
naming the field, and what the end of an attempt does with it: a cause the policy names restarts
the job (its attempt recorded, its GPUs freed, queued behind a backoff), any other fails it at
once, as does a cause that comes once the restarts are used up."""
import pytest

from jobs.domain import follow, scheduler, states
from jobs.models import Job, JobAttempt, SlotAllocation, State
from runners.base import Exited

pytestmark = pytest.mark.django_db

FAKE = "tests.fakebackend.FakeBackend"


def post(api_client, alice, image, **fields):
    body = {"image": image.name, "gpus": 1, "script_path": "train.py", "backend": "local", **fields}
    return api_client(alice).post("/api/jobs/", body, format="json")


@pytest.mark.parametrize("fields, field, words", [
    ({"max_restarts": 11, "restart_on_exit_codes": [137]}, "max_restarts", "At most 10 restarts"),
    ({"max_restarts": -1, "restart_on_exit_codes": [137]}, "max_restarts", "greater than or equal to 0"),
    ({"max_restarts": 1, "restart_on": ["oom", "reboot"]}, "restart_on", "No restart cause 'reboot'"),
    ({"max_restarts": 1, "restart_on": "oom"}, "restart_on", "Must be a list of causes"),
    ({"max_restarts": 1, "restart_on_exit_codes": [0]}, "restart_on_exit_codes", "0 is not an exit code"),
    ({"max_restarts": 1, "restart_on_exit_codes": ["137"]}, "restart_on_exit_codes", "'137' is not an exit code"),
    ({"max_restarts": 1}, "max_restarts", "Name what earns a restart"),
    ({"max_restarts": 1, "restart_on_exit_codes": [137], "backend": "fake"}, "max_restarts",
     "cannot restart jobs yet; This machine can"),
])
def test_a_bad_policy_is_a_400_naming_its_field(api_client, alice, image, settings, fields, field, words):
    settings.RINGMASTER_MAX_RESTARTS_CAP = 10
    settings.RINGMASTER_BACKENDS = [*settings.RINGMASTER_BACKENDS, FAKE]
    response = post(api_client, alice, image, **fields)
    assert response.status_code == 400, response.content
    assert field in response.json() and words in " ".join(response.json()[field]), response.json()
    assert not Job.objects.exists()


def test_the_api_and_the_page_take_a_policy(api_client, client, alice, image):
    response = post(api_client, alice, image, max_restarts=2, restart_on_exit_codes=[139, 137, 137],
                    restart_on=["oom", "signal"])
    assert response.status_code == 201, response.content
    body = api_client(alice).get(f"/api/jobs/{response.json()['id']}/").json()
    assert (body["max_restarts"], body["restart_on_exit_codes"], body["restart_on"]) == (2, [137, 139],
                                                                                         ["signal", "oom"])
    assert (body["attempts"], body["attempt"], body["restarts_left"]) == ([], 1, 2)

    client.force_login(alice)
    page = client.post("/jobs/new/", {"image": image.pk, "gpus": 1, "backend": "local", "script_path": "t.py",
                                      "max_restarts": 3, "restart_on_exit_codes": "137, 139", "restart_on": ["oom"]})
    assert page.status_code == 302, page.content.decode()[-2000:]
    job = Job.objects.latest("id")
    assert (job.max_restarts, job.restart_on_exit_codes, job.restart_on) == (3, [137, 139], ["oom"])


@pytest.fixture
def running(make_user, image, script, settings, local_gpus):
    """A job of alice's running on this machine (admitted: it holds a GPU) with a policy of one
    restart on exit code 137."""
    settings.RINGMASTER_RESTART_BACKOFF_SECONDS = 30
    local_gpus(["NVIDIA A100-SXM4-80GB"])
    job = Job.objects.create(owner=script.owner, image=image, gpus=1, script=script, time_limit_minutes=5,
                             max_restarts=1, restart_on_exit_codes=[137])
    assert scheduler.admit() == [job.pk]
    assert SlotAllocation.objects.filter(job=job).exists()
    states.transition(job.pk, State.RUNNING)
    return job


def test_an_exit_code_outside_the_policy_fails_the_job_at_once(running):
    follow.finish(running.pk, Exited(1, "horovodrun exited with code 1"))
    job = Job.objects.get(pk=running.pk)
    assert (job.state, job.exit_code, job.attempt) == (State.FAILED, 1, 1)
    assert list(job.attempts.values_list("number", "exit_code")) == [(1, 1)]


def test_an_exit_code_of_the_policy_queues_the_next_attempt_behind_a_backoff(running):
    follow.finish(running.pk, Exited(137, "horovodrun exited with code 137"))
    job = Job.objects.get(pk=running.pk)
    assert (job.state, job.attempt, job.exit_code, job.follower, job.output_offset) == (State.QUEUED, 2, None, "", 0)
    first = JobAttempt.objects.get(job=job, number=1)
    assert first.exit_code == 137 and first.ended and first.started and "exited with code 137" in first.reason
    message = job.events.filter(state=State.QUEUED).last().message
    assert message.startswith("attempt 1 ended (exit code 137: ") and message.endswith("(0 of 1 restart left)")
    assert not SlotAllocation.objects.filter(job=job).exists()            # its GPUs are free meanwhile

    assert scheduler.admit() == []                                        # the backoff holds it
    job.refresh_from_db()
    assert job.state == State.QUEUED and job.reason.startswith("restarting: attempt 2 waits until ")
    Job.objects.filter(pk=job.pk).update(restart_after=None)              # the backoff is over
    assert scheduler.admit() == [job.pk]
    assert JobAttempt.objects.filter(job=job).count() == 2

    states.transition(job.pk, State.RUNNING)                              # the second attempt fails too:
    follow.finish(job.pk, Exited(137, "horovodrun exited with code 137"))  # no restart left
    job.refresh_from_db()
    assert job.state == State.FAILED and job.reason.endswith("(no restarts left: 1 used)")
    assert list(job.attempts.values_list("number", "exit_code")) == [(1, 137), (2, 137)]


def test_a_job_that_gives_no_policy_gets_its_images_where_its_backend_restarts(api_client, alice, image, settings):
    from django.core.exceptions import ValidationError

    settings.RINGMASTER_BACKENDS = [*settings.RINGMASTER_BACKENDS, FAKE]
    image.default_max_restarts, image.default_restart_on_exit_codes, image.default_restart_on = 2, [137], ["oom"]
    image.full_clean()
    image.save()
    submitted = {name: post(api_client, alice, image, **fields).json()["id"] for name, fields in [
        ("none given", {}), ("none wanted", {"max_restarts": 0}), ("its own", {"restart_on_exit_codes": [3],
                                                                              "max_restarts": 1}),
        ("elsewhere", {"backend": "fake"})]}
    policies = {name: Job.objects.values_list("max_restarts", "restart_on_exit_codes", "restart_on").get(pk=pk)
                for name, pk in submitted.items()}
    assert policies == {"none given": (2, [137], ["oom"]), "none wanted": (0, [], []), "its own": (1, [3], []),
                        "elsewhere": (0, [], [])}

    image.default_restart_on = ["reboot"]
    with pytest.raises(ValidationError) as refused:
        image.full_clean()
    assert "default_restart_on" in refused.value.message_dict
