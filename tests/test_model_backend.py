"""A backend with a model of its own (tests/modelbackend), enabled by one line of the test
configuration: its package is installed as a Django app (model, migration, admin page), beat
runs its health check only while it is enabled, its table is on the capacity page, and a job
submitted to it through the API runs to the end."""
import pytest
from django.apps import apps

from jobs import backends
from jobs.models import Job, LogLine, State
from jobs.tasks import check_backend
from portal.settings import DEFAULT_BACKENDS, backend_apps, enabled_backends
from tests.modelbackend.enable import PATH
from tests.modelbackend.models import Machine

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client, make_user):
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    return client


def without_machines(settings):
    settings.RINGMASTER_BACKENDS = [path for path in settings.RINGMASTER_BACKENDS if path != PATH]


def test_a_backends_package_with_an_apps_module_is_installed_as_a_django_app(settings):
    assert PATH in settings.RINGMASTER_BACKENDS
    assert apps.is_installed("tests.modelbackend")
    assert backend_apps([PATH, "jobs.backends.local.LocalBackend", "tests.fakebackend.FakeBackend"]) == \
        ["tests.modelbackend"]
    assert backend_apps(["jobs.backends.local.LocalBackend"]) == []
    assert backend_apps(DEFAULT_BACKENDS) == ["jobs.backends.instances", "jobs.backends.kubernetes"]


def test_one_setting_line_enables_the_backend_beside_the_default_three(settings):
    """What the test configuration sets (tests/modelbackend/enable.py), as an admin would."""
    assert settings.RINGMASTER_BACKENDS[:3] == DEFAULT_BACKENDS
    assert enabled_backends(f"+{PATH}") == [*DEFAULT_BACKENDS, PATH]
    assert enabled_backends(f"+{PATH},{DEFAULT_BACKENDS[0]}") == [*DEFAULT_BACKENDS, PATH]
    assert enabled_backends("") == enabled_backends(None) == DEFAULT_BACKENDS
    assert enabled_backends(f"{DEFAULT_BACKENDS[0]}, {PATH}") == [DEFAULT_BACKENDS[0], PATH]


def test_its_admin_page_lists_and_creates_machines(staff):
    Machine.objects.create(name="m1", slots=2)
    page = staff.get("/admin/modelbackend/machine/")
    assert page.status_code == 200 and "m1" in page.content.decode()

    response = staff.post("/admin/modelbackend/machine/add/", {"name": "m2", "slots": "4", "enabled": "on"})
    assert response.status_code == 302, response.content.decode()
    assert Machine.objects.get(name="m2").slots == 4
    assert "Machines (test backend)" in staff.get("/admin/").content.decode()


def test_without_a_machine_it_takes_no_job_and_no_page_shows_it(staff, image):
    backend = backends.get("machines")
    assert "No machine is registered" in backend.unavailable() and not backend.offered()
    assert 'value="machines"' not in staff.get("/jobs/new/").content.decode()
    response = staff.post("/api/jobs/", {"image": image.name, "gpus": 1, "script_path": "/x.py",
                                         "backend": "machines"}, content_type="application/json")
    assert response.status_code == 400 and "No machine is registered" in response.json()["backend"][0]
    page = staff.get("/capacity/").content.decode()
    assert "Machines" not in page and 'id="machines"' not in page


def test_beat_schedules_the_check_of_each_enabled_backend_at_its_own_interval(settings):
    schedule = backends.check_schedule()
    assert schedule["check-machines"] == {"task": "jobs.tasks.check_backend", "schedule": 120.0,
                                          "args": ("machines",)}
    assert (schedule["check-instances"]["schedule"], schedule["check-kubernetes"]["schedule"]) == (60.0, 300.0)
    assert "check-local" not in schedule                                   # it has no periodic check

    without_machines(settings)
    assert "check-machines" not in backends.check_schedule()


def test_the_periodic_check_runs_while_the_backend_is_enabled_and_never_when_it_is_not(settings):
    Machine.objects.create(name="m1", slots=2)
    Machine.objects.create(name="off", slots=2, enabled=False)

    assert check_backend("machines") == {"m1": True}
    m1 = Machine.objects.get(name="m1")
    assert m1.checks == 1 and m1.checked_at is not None
    assert Machine.objects.get(name="off").checks == 0

    without_machines(settings)
    assert check_backend("machines") is None
    assert Machine.objects.get(name="m1").checks == 1


def test_its_rows_are_on_the_capacity_page(staff):
    Machine.objects.create(name="m1", slots=2)
    Machine.objects.create(name="m2", slots=3, enabled=False)
    page = staff.get("/capacity/").content.decode()
    assert '<tr data-backend="machines"><td>Machines (tests)</td><td class="num">0</td>' in page
    assert '<td class="num">2</td>' in page.split('data-backend="machines"')[1].split("</tr>")[0]
    assert 'id="machines"' in page and 'data-machine="m1"' in page and 'data-machine="m2"' in page
    row = page.split('data-machine="m1">')[1].split("</tr>")[0]
    assert "<td>m1</td>" in row and '<td class="num">2</td>' in row and "<td>yes</td>" in row and "never" in row


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_job_submitted_through_the_api_runs_to_success_on_a_machine(http):
    from tests.integration.test_job_lifecycle import submit, wait_state

    Machine.objects.create(name="m1", slots=2)
    job_id = submit(http, backend="machines", gpus=2, script_path="/fake/train.py")

    job = wait_state(job_id, {State.SUCCEEDED, State.FAILED, State.CANCELLED})
    assert job.state == State.SUCCEEDED, job.reason
    assert (job.backend, job.exit_code) == ("machines", 0)
    assert [line.text for line in LogLine.objects.filter(job_id=job_id).order_by("seq")][:2] == \
        ["hello from rank 0", "hello from rank 1"]
    assert "more than" not in Job.objects.get(pk=job_id).reason


def test_a_backends_own_submission_fields_come_from_it_and_another_backend_refuses_them(staff, image, settings):
    Machine.objects.create(name="m1", slots=2)
    job = {"image": image.name, "gpus": 1, "script_path": "/x.py", "backend": "machines"}
    response = staff.post("/api/jobs/", {**job, "cluster": "east"}, content_type="application/json")
    assert response.status_code == 400 and response.json()["cluster"] == ["The machines backend takes no cluster."]
    schema = staff.get("/api/schema/?format=json").json()["components"]["schemas"]["JobCreateRequest"]
    assert "Kubernetes backend" in schema["properties"]["cluster"]["description"]

    # Without the kubernetes backend no submission has a cluster field: it is ignored like any unknown key.
    settings.RINGMASTER_BACKENDS = [path for path in settings.RINGMASTER_BACKENDS if "kubernetes" not in path]
    schema = staff.get("/api/schema/?format=json").json()["components"]["schemas"]["JobCreateRequest"]
    assert "cluster" not in schema["properties"]
    response = staff.post("/api/jobs/", {**job, "cluster": "east"}, content_type="application/json")
    assert response.status_code == 201, response.content.decode()
    assert Job.objects.get().backend == "machines"
