"""Studies (jobs.domain.studies): the API's refusals by field, a stranger's 404, and a small study
driven to its end on PostgreSQL through the Celery task that beat and a job's end run. Trials'
jobs are ended here as the follower ends them (states.transition, metric points stored); Optuna's
RDB storage is real, on the test database."""
import threading

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from jobs import taskqueue, tasks
from jobs.domain import states, studies
from jobs.models import JobEvent, MetricPoint, Quota, State, Study, Trial


@pytest.fixture(autouse=True)
def _optuna_connections_closed():
    """Optuna's pooled connections to the test database are closed after each test, so the database
    can be dropped at the end of the run."""
    yield
    studies.close_storages()


def study_data(image, **changes):
    data = {
        "name": "lr sweep",
        "base": {"image": image.name, "gpus": 1, "script_path": "train.py",
                 "args": ["--lr", "{lr}", "--opt", "{opt}"], "env": {"WIDTH": "{width}"}},
        "space": {"lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
                  "width": {"type": "int", "low": 8, "high": 64},
                  "opt": {"type": "categorical", "choices": ["sgd", "adam"]}},
        "objective": {"metric": "loss", "direction": "minimize"},
        "trials": 4, "parallel": 2, "sampler": "random", "pruner": "none",
    }
    data.update(changes)
    return data


def test_a_study_is_its_owners_and_a_strangers_404(api_client, make_user, image):
    alice, mallory = make_user("alice"), make_user("mallory")
    response = api_client(alice).post("/api/studies/", study_data(image), format="json")
    assert response.status_code == 201, response.json()
    study = response.json()
    assert study["state"] == "RUNNING" and study["trials"] == [] and study["best"] is None
    assert api_client(alice).get(f"/api/studies/{study['id']}/").json()["id"] == study["id"]
    assert [s["id"] for s in api_client(alice).get("/api/studies/").json()] == [study["id"]]

    stranger = api_client(mallory)
    assert stranger.get(f"/api/studies/{study['id']}/").status_code == 404
    assert stranger.post(f"/api/studies/{study['id']}/stop/").status_code == 404
    assert stranger.get("/api/studies/").json() == []
    assert Study.objects.get().state == Study.State.RUNNING

    page = Client()
    page.force_login(alice)
    html = page.get(f"/studies/{study['id']}/").content.decode()
    assert "Stop the study" in html and "No trial yet" in html
    assert f'href="/studies/{study["id"]}/"' in page.get("/studies/").content.decode()

    stopped = api_client(alice).post(f"/api/studies/{study['id']}/stop/").json()
    assert stopped["state"] == "STOPPED" and stopped["reason"] == "stopped by alice"


def _space(**entries):
    return {"space": {**study_data_space(), **entries}}


def study_data_space():
    return {"lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
            "width": {"type": "int", "low": 8, "high": 64},
            "opt": {"type": "categorical", "choices": ["sgd", "adam"]}}


REFUSALS = [
    # (what changes, the field named, words of its message)
    ({"space": {"lr": study_data_space()["lr"], "opt": study_data_space()["opt"]}}, "space",
     "The base uses {width} but the space has no entry width"),
    (_space(depth={"type": "int", "low": 1, "high": 4}), "space", "depth: no placeholder {depth}"),
    (_space(width={"type": "int", "low": 64, "high": 8}), "space", "width: the range is empty"),
    (_space(lr={"type": "float", "low": 0, "high": 0.1, "log": True}), "space", "lr: a log range needs low > 0"),
    (_space(opt={"type": "categorical", "choices": []}), "space", "opt: a categorical entry"),
    ({"objective": {"metric": "loss", "direction": "up"}}, "objective", "direction"),
    ({"trials": 0}, "trials", "A whole number"),
    ({"sampler": "grid"}, "sampler", "lr is a float range"),
    ({"pruner": "asha"}, "pruner", "One of none, median, hyperband"),
]


@pytest.mark.parametrize("changes, field, words", REFUSALS)
def test_a_bad_study_is_a_400_naming_its_field(api_client, alice, image, changes, field, words):
    response = api_client(alice).post("/api/studies/", study_data(image, **changes), format="json")
    assert response.status_code == 400
    assert any(words in message for message in response.json()[field]), response.json()
    assert not Study.objects.exists()


def test_a_base_the_job_form_refuses_is_a_400_under_base(api_client, alice, image):
    data = study_data(image)
    data["base"] = {**data["base"], "gpus": 0, "env": {"WIDTH": "{width}", "LD_PRELOAD": "x"}}
    errors = api_client(alice).post("/api/studies/", data, format="json").json()
    assert any(message.startswith("gpus: ") for message in errors["base"]), errors
    assert any(message.startswith("env: LD_PRELOAD is refused") for message in errors["base"]), errors


def test_more_trials_at_once_than_the_quota_allows_is_a_400(api_client, alice, image):
    Quota.objects.create(user=alice, jobs=3)
    errors = api_client(alice).post("/api/studies/", study_data(image, parallel=4), format="json").json()
    assert errors == {"parallel": ["At most 3 jobs at once under the user quota of alice."]}


# --- driving a study ---------------------------------------------------------------------------
def end(job, state, points=()):
    """End a trial's job as its follower would: launched, running, its metric points stored, ended."""
    states.transition(job.pk, State.LAUNCHING)
    states.transition(job.pk, State.RUNNING)
    MetricPoint.objects.bulk_create([MetricPoint(job=job, rank=0, step=step, name="loss", value=value,
                                                 ts=timezone.now()) for step, value in points])
    states.transition(job.pk, state, exit_code=0 if state == State.SUCCEEDED else 1)


def drive_from_two_threads(study_id):
    """Run the study's Celery task from two threads released at once."""
    barrier, errors = threading.Barrier(2), []

    def drive():
        try:
            barrier.wait()
            tasks.drive_study(study_id)
        except Exception as exc:  # pragma: no cover - reported by the assertion
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=drive) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []


def running_trials(study):
    return list(study.trials.filter(state=Trial.State.RUNNING).select_related("job"))


@pytest.mark.django_db(transaction=True)
def test_a_four_trial_study_two_at_a_time_ends_done_with_its_best_trial(row_locks, api_client, make_user, alice,
                                                                        image):
    study_id = api_client(alice).post("/api/studies/", study_data(image), format="json").json()["id"]
    study = Study.objects.get(pk=study_id)
    failed_once = False
    for _ in range(10):
        drive_from_two_threads(study_id)
        study.refresh_from_db()
        running = running_trials(study)
        assert len(running) <= 2
        assert study.trials.filter(job__state__in=[State.QUEUED, State.LAUNCHING, State.RUNNING]).count() <= 2
        if study.state != Study.State.RUNNING:
            break
        assert running
        trial = running[0]
        assert trial.job.tags == [f"study-{study_id}"]
        assert trial.job.args == ["--lr", str(trial.params["lr"]), "--opt", trial.params["opt"]]
        assert trial.job.env == {"WIDTH": str(trial.params["width"])}
        if not failed_once:
            end(trial.job, State.FAILED)              # retried once, with the same parameters
            failed_once = True
        else:
            end(trial.job, State.SUCCEEDED, [(0, 9.0), (1, trial.params["lr"])])

    assert study.state == Study.State.DONE, study.reason
    trials = list(study.trials.order_by("number"))
    jobs = [trial.job_id for trial in trials]
    assert len(jobs) == len(set(jobs)) == 5                  # 4 asked, 1 retry; no trial submitted twice
    failed, retry = trials[0], next(t for t in trials if t.retry_of is not None)
    assert failed.state == Trial.State.FAIL and retry.retry_of == failed.number and retry.params == failed.params
    assert [t.state for t in trials if t is not failed] == [Trial.State.COMPLETE] * 4
    winner = min((t for t in trials if t.state == Trial.State.COMPLETE), key=lambda t: t.value)
    assert winner.value == winner.params["lr"]                # the metric's last value

    shown = api_client(alice).get(f"/api/studies/{study_id}/").json()
    assert shown["state"] == "DONE"
    assert shown["best"] == {"number": winner.number, "params": winner.params, "value": winner.value,
                             "job": winner.job_id}
    assert [t["number"] for t in shown["trials"]] == [t.number for t in trials]

    page = Client()
    page.force_login(alice)
    html = page.get(f"/studies/{study_id}/").content.decode()
    assert html.count("<tr data-trial=") == 5 and f'href="/jobs/{winner.job_id}/"' in html
    assert f"Best: trial {winner.number}," in html
    page.force_login(make_user("mallory"))
    assert page.get(f"/studies/{study_id}/").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_an_objective_the_first_finished_trial_never_reported_fails_the_study(row_locks, api_client, alice, image):
    study_id = api_client(alice).post("/api/studies/", study_data(image), format="json").json()["id"]
    tasks.drive_study(study_id)
    first, second = running_trials(Study.objects.get(pk=study_id))
    end(first.job, State.SUCCEEDED, [])                 # it reported no "loss"
    tasks.drive_study(study_id)

    study = Study.objects.get(pk=study_id)
    assert study.state == Study.State.FAILED
    assert "the objective metric 'loss' was never reported by trial" in study.reason
    second.job.refresh_from_db()
    assert second.job.state == State.CANCELLED                 # it was queued: cancelled at once
    assert study.trials.count() == 2                           # the budget was not spent


@pytest.mark.django_db(transaction=True)
def test_a_trial_worse_than_the_median_is_pruned_and_its_job_stopped_saying_why(row_locks, api_client, alice,
                                                                                 image):
    study_id = api_client(alice).post("/api/studies/", study_data(image, parallel=3, pruner="median"),
                                      format="json").json()["id"]
    tasks.drive_study(study_id)
    first, second, third = running_trials(Study.objects.get(pk=study_id))
    end(first.job, State.SUCCEEDED, [(0, 1.0), (1, 0.5)])
    end(second.job, State.SUCCEEDED, [(0, 3.0), (1, 0.4)])
    tasks.drive_study(study_id)
    states.transition(third.job.pk, State.LAUNCHING)
    states.transition(third.job.pk, State.RUNNING)
    MetricPoint.objects.create(job=third.job, rank=0, step=0, name="loss", value=5.0, ts=timezone.now())
    tasks.drive_studies()                                       # beat's pass reads the new point

    third.refresh_from_db()
    reason = "pruned at step 0: value 5, the median of the others 2"
    assert third.state == Trial.State.PRUNED and third.reason == reason
    assert third.job.__class__.objects.get(pk=third.job_id).cancel_requested
    assert JobEvent.objects.filter(job_id=third.job_id, message=reason).exists()


def test_a_grid_study_runs_each_point_once_and_ends_with_the_grid(api_client, alice, image,
                                                                   django_capture_on_commit_callbacks):
    data = study_data(image, sampler="grid", trials=10, parallel=1,
                      space={"lr": {"type": "categorical", "choices": [0.1, 0.01]},
                             "width": {"type": "int", "low": 8, "high": 8},
                             "opt": {"type": "categorical", "choices": ["sgd"]}})
    study_id = api_client(alice).post("/api/studies/", data, format="json").json()["id"]
    for _ in range(3):
        tasks.drive_study(study_id)
        for trial in running_trials(Study.objects.get(pk=study_id)):
            with django_capture_on_commit_callbacks() as callbacks:
                end(trial.job, State.SUCCEEDED, [(0, trial.params["lr"])])
            assert "drive_study" in taskqueue.sent(callbacks)      # its end starts the study's next pass
    study = Study.objects.get(pk=study_id)
    assert study.state == Study.State.DONE
    assert sorted(t.params["lr"] for t in study.trials.all()) == [0.01, 0.1]


@pytest.mark.django_db(transaction=True)
def test_a_trial_optuna_asked_in_a_pass_that_never_committed_is_failed_not_lost_or_run(row_locks, api_client,
                                                                                        alice, image):
    """A worker killed between Optuna's ask and the commit of the trial's job: the next pass finds
    the asked trial without a job, tells Optuna it failed, and asks a new one in its place."""
    from optuna.trial import TrialState

    study_id = api_client(alice).post("/api/studies/", study_data(image), format="json").json()["id"]
    tasks.drive_study(study_id)
    study = Study.objects.get(pk=study_id)
    lost = studies.optuna_study(study).ask()                    # the killed pass's
    tasks.drive_study(study_id)
    assert studies.storage().get_trial(lost._trial_id).state == TrialState.FAIL
    end(running_trials(study)[0].job, State.SUCCEEDED, [(0, 1.0)])
    tasks.drive_study(study_id)
    numbers = sorted(study.trials.values_list("number", flat=True))
    assert numbers == [0, 1, lost.number + 1] and len(running_trials(study)) == 2
