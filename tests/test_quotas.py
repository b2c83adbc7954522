"""Quotas, fair queueing and accounting: what admins set is what the scheduler does, and users
can read why their job waits. Real PostgreSQL for the race; the rest runs on either database."""
import threading
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.domain import scheduler, services, states
from jobs import taskqueue, tasks
from jobs.models import Job, JobEvent, Quota, Script, State, UserSettings
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db


# --- helpers ----------------------------------------------------------------------------------
@pytest.fixture
def script(db):
    return Script.objects.create(owner=None, name="train.py", sha256="0" * 64, size=1, content="print(1)\n")


@pytest.fixture
def bob(make_user):
    return make_user("bob")


@pytest.fixture
def vision(alice, bob):
    group = Group.objects.create(name="vision")
    group.user_set.add(alice, bob)
    return group


def client_of(user):
    client = APIClient()
    client.force_authenticate(user)
    return client


def submit(user, script, gpus, **extra):
    """POST /api/jobs/ as `user` (the one validation path); returns the response."""
    return client_of(user).post("/api/jobs/", {"image": "horovod-cpu", "gpus": gpus, "script": script.pk, **extra},
                                format="json")


def submitted(user, script, gpus, **extra):
    response = submit(user, script, gpus, **extra)
    assert response.status_code == 201, response.json()
    return Job.objects.get(pk=response.json()["id"])


def past_job(owner, image, script, gpus, started, finished=None, state=State.SUCCEEDED, group=None):
    """A job that ran from `started` to `finished` (None: still running)."""
    return Job.objects.create(
        owner=owner, image=image, script=script, gpus=gpus, time_limit_minutes=600, charged_group=group,
        state=state if finished else State.RUNNING, started_at=started, finished_at=finished,
        gpu_seconds=(finished - started).total_seconds() * gpus if finished else 0,
    )


def reload(job):
    job.refresh_from_db()
    return job


# --- the race ---------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("row_locks")
def test_fifty_concurrent_submissions_never_admit_past_a_quota_of_8_gpus(make_user, image, settings):
    """50 submissions from parallel threads, each followed by the scheduler's dispatch task, while
    a runner thread ends admitted jobs (and dispatches again). From the recorded admissions and
    ends, in the order the database recorded them, no more than 8 GPUs are ever admitted at once,
    and every job runs once capacity frees."""
    settings.RINGMASTER_LOCAL_GPUS = 64                # the quota is the limit here, not the machine
    alice = make_user("alice")
    Quota.objects.create(user=alice, gpus=8)
    script = Script.objects.create(owner=None, name="t.py", sha256="0" * 64, size=1, content="x")
    sizes = [1 + i % 4 for i in range(50)]
    barrier, errors, done = threading.Barrier(len(sizes) + 1), [], threading.Event()

    def submitter(gpus):
        try:
            barrier.wait()
            response = submit(alice, script, gpus)
            assert response.status_code == 201, response.content
            tasks.dispatch.apply().get()      # what the worker does next
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    def runner():
        """Plays the runners: an admitted job starts, runs a moment, ends; the scheduler looks again."""
        try:
            barrier.wait()
            while not done.is_set():
                for pk in Job.objects.filter(state=State.LAUNCHING).values_list("pk", flat=True):
                    states.transition(pk, State.RUNNING, expect={State.LAUNCHING})
                oldest = Job.objects.filter(state=State.RUNNING).order_by("started_at", "id").first()
                if oldest is None:
                    done.wait(0.01)
                    continue
                states.transition(oldest.pk, State.SUCCEEDED, expect={State.RUNNING})
                tasks.dispatch.apply().get()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=submitter, args=(gpus,)) for gpus in sizes]
    threads.append(threading.Thread(target=runner))
    for thread in threads:
        thread.start()
    try:
        for thread in threads[:-1]:
            thread.join(timeout=120)
        wait_for(lambda: errors or Job.objects.filter(state=State.SUCCEEDED).count() == len(sizes),
                 timeout=120, message="every job to run once capacity frees")
    finally:
        done.set()
        threads[-1].join(timeout=30)
    assert not errors, errors
    assert Job.objects.count() == len(sizes)

    gpus = dict(Job.objects.values_list("pk", "gpus"))
    in_use, peak, admissions = 0, 0, {}
    for job_id, state in JobEvent.objects.filter(state__in=[State.LAUNCHING, State.SUCCEEDED]) \
            .order_by("id").values_list("job_id", "state"):
        if state == State.LAUNCHING:
            in_use += gpus[job_id]
            admissions[job_id] = admissions.get(job_id, 0) + 1
        else:
            in_use -= gpus[job_id]
        assert in_use <= 8, f"{in_use} GPUs admitted at once after job {job_id} was {state}"
        peak = max(peak, in_use)
    assert admissions == {pk: 1 for pk in gpus}                    # every job admitted, exactly once
    assert peak >= 5                                               # jobs really ran side by side


# --- GPU-hour windows -------------------------------------------------------------------------
def test_gpu_hours_count_in_a_rolling_window_with_running_cancelled_and_failed_jobs(alice, bob, image, script):
    Quota.objects.create(user=alice, gpu_hours=10, window_days=30)
    now = timezone.now()
    m, h, d = timedelta(minutes=1), timedelta(hours=1), timedelta(days=1)
    past_job(alice, image, script, 2, now - 40 * d - 3 * h, now - 40 * d)                 # outside: 0
    past_job(alice, image, script, 2, now - 30 * d - 3 * h, now - 30 * d + 2 * h + m)     # 2 h 1 m inside: 4.03
    past_job(alice, image, script, 1, now - d - 3 * h, now - d, state=State.CANCELLED)    # 3
    past_job(alice, image, script, 1, now - 2 * h)                                        # running: 2 so far
    first = submitted(alice, script, 1)
    assert scheduler.admit() == [first.pk]                                                 # 9.03 of 10: fits

    past_job(alice, image, script, 1, now - 2 * d - h, now - 2 * d, state=State.FAILED)   # 10.03 of 10
    waiting = submitted(alice, script, 1)
    others = submitted(bob, script, 1)
    assert scheduler.admit() == [others.pk]                                # bob is not held back
    assert reload(waiting).state == State.QUEUED
    assert reload(waiting).reason == \
        "waiting for quota: user alice: GPU-hours for 30 days used up: 10 of 10"
    body = client_of(alice).get(f"/api/jobs/{waiting.pk}/").json()
    assert body["reason"] == waiting.reason and body["queue_position"] == 1
    quota = client_of(alice).get("/api/quota/").json()
    assert quota["limits"]["gpu_hours"] == 10 and quota["limits"]["window_days"] == 30
    assert quota["use"]["gpu_hours"] == pytest.approx(10.03, abs=0.01)


def test_gpu_hours_of_a_group_are_pooled_across_its_members(alice, bob, vision, image, script):
    Quota.objects.create(group=vision, gpu_hours=5, window_days=7)
    now = timezone.now()
    past_job(alice, image, script, 1, now - timedelta(days=3, hours=3), now - timedelta(days=3), group=vision)  # 3
    past_job(bob, image, script, 2, now - timedelta(hours=3), now - timedelta(hours=2), group=vision)          # 2
    past_job(bob, image, script, 4, now - timedelta(hours=3), now - timedelta(hours=2))   # not charged to vision
    waiting = submitted(bob, script, 1)
    assert waiting.charged_group == vision                     # bob's only group: his default
    assert scheduler.admit() == []
    assert reload(waiting).reason == "waiting for quota: group vision: GPU-hours for 7 days used up: 5 of 5"


# --- pooled group quota, fairness -------------------------------------------------------------
def test_a_group_quota_is_pooled_across_members_and_blocks_no_one_else(alice, bob, vision, make_user, image, script):
    Quota.objects.create(group=vision, gpus=4)
    carol = make_user("carol")                                           # in no group
    first = submitted(alice, script, 3)
    assert scheduler.admit() == [first.pk]
    second = submitted(bob, script, 2)
    third = submitted(bob, script, 1)                                    # would fit, but waits its turn
    outsider = submitted(carol, script, 2)
    assert scheduler.admit() == [outsider.pk]
    assert reload(second).reason == "waiting for quota: group vision: 3 of 4 GPUs in use, needs 2"
    assert reload(third).reason == "waiting behind an earlier job for the quota of group vision"
    assert [j["queue_position"] for j in (client_of(bob).get(f"/api/jobs/{p}/").json()
                                         for p in (second.pk, third.pk))] == [1, 2]

    states.transition(first.pk, State.RUNNING)
    states.transition(first.pk, State.SUCCEEDED)
    assert scheduler.admit() == [second.pk, third.pk]                     # 2 + 1 of 4


def test_both_the_users_and_the_groups_limits_must_hold(alice, bob, vision, image, script):
    Quota.objects.create(group=vision, gpus=8)
    Quota.objects.create(user=alice, gpus=2)
    big = submitted(alice, script, 2)
    assert scheduler.admit() == [big.pk]
    more = submitted(alice, script, 1)                                    # group has room, alice has not
    bobs = submitted(bob, script, 4)
    assert scheduler.admit() == [bobs.pk]
    assert reload(more).reason == "waiting for quota: user alice: 2 of 2 GPUs in use, needs 1"


def test_raising_a_quota_looks_at_the_queue_at_once_not_at_the_next_beat(alice, image, script,
                                                                          django_capture_on_commit_callbacks):
    quota = Quota.objects.create(user=alice, gpus=2)
    running = submitted(alice, script, 2)
    waiting = submitted(alice, script, 2)
    assert scheduler.admit() == [running.pk]
    assert reload(waiting).reason == "waiting for quota: user alice: 2 of 2 GPUs in use, needs 2"

    with django_capture_on_commit_callbacks() as callbacks:
        quota.gpus = 4
        quota.save()                                                      # as the admin or set_quota does
    assert "dispatch" in taskqueue.sent(callbacks)                        # the scheduler runs on commit
    assert scheduler.admit() == [waiting.pk]                               # ... and now admits the job
    with django_capture_on_commit_callbacks() as callbacks:
        quota.delete()
    assert "dispatch" in taskqueue.sent(callbacks)


def test_a_waiting_jobs_events_say_what_it_waits_for_not_every_change_of_the_numbers(alice, bob, vision, image,
                                                                                       script):
    Quota.objects.create(group=vision, gpus=4)
    first, second = submitted(alice, script, 2), submitted(alice, script, 1)
    assert scheduler.admit() == [first.pk, second.pk]
    waiting = submitted(bob, script, 3)
    scheduler.admit()
    assert reload(waiting).reason == "waiting for quota: group vision: 3 of 4 GPUs in use, needs 3"
    states.transition(second.pk, State.SUCCEEDED)
    scheduler.admit()
    assert reload(waiting).reason == "waiting for quota: group vision: 2 of 4 GPUs in use, needs 3"
    assert list(JobEvent.objects.filter(job=waiting, state="").values_list("message", flat=True)) == [
        "waiting for quota: group vision: 3 of 4 GPUs in use, needs 3"]


def test_a_waiting_jobs_events_follow_the_kind_of_its_wait_from_capacity_to_quota_to_held_and_back(
        alice, bob, make_user, image, script, settings):
    settings.RINGMASTER_LOCAL_GPUS = 4
    root = make_user("root", is_staff=True)
    first, second, third = submitted(alice, script, 1), submitted(bob, script, 2), submitted(bob, script, 1)
    assert scheduler.admit() == [first.pk, second.pk, third.pk]
    waiting = submitted(alice, script, 2)
    assert reload(waiting).waits_for == "scheduler"
    scheduler.admit()
    assert (reload(waiting).reason, waiting.waits_for) == (
        "waiting for capacity: 4 of 4 GPUs in use, this job needs 2", "capacity")
    states.transition(third.pk, State.SUCCEEDED)
    scheduler.admit()                                                  # other numbers, the same wait: no event
    assert reload(waiting).reason == "waiting for capacity: 3 of 4 GPUs in use, this job needs 2"
    Quota.objects.create(user=alice, gpus=2)
    scheduler.admit()                                                  # now it waits for its quota: an event
    assert (reload(waiting).reason, waiting.waits_for) == (
        "waiting for quota: user alice: 1 of 2 GPUs in use, needs 2", "quota")
    services.hold(waiting, by=root)
    scheduler.admit()
    assert (reload(waiting).reason, waiting.waits_for) == ("held by root", "held")
    services.release(waiting, by=root)
    scheduler.admit()
    assert reload(waiting).waits_for == "quota"
    assert list(JobEvent.objects.filter(job=waiting, state="").values_list("message", flat=True)) == [
        "waiting for capacity: 4 of 4 GPUs in use, this job needs 2",
        "waiting for quota: user alice: 1 of 2 GPUs in use, needs 2",
        "held by root",
        "released by root",
        "waiting for quota: user alice: 1 of 2 GPUs in use, needs 2"]
    states.transition(waiting.pk, State.CANCELLED)
    assert reload(waiting).waits_for == ""


def test_a_user_in_several_groups_charges_the_default_group_or_the_one_named(alice, vision, image, script):
    nlp = Group.objects.create(name="nlp")
    nlp.user_set.add(alice)
    Quota.objects.create(group=vision, gpus=1)
    running = past_job(alice, image, script, 1, timezone.now(), group=vision)
    assert running.charged_group == vision
    UserSettings.objects.create(user=alice, default_group=nlp)
    to_nlp = submitted(alice, script, 1)
    to_vision = submitted(alice, script, 1, group="vision")
    assert (to_nlp.charged_group, to_vision.charged_group) == (nlp, vision)
    assert scheduler.admit() == [to_nlp.pk]
    assert reload(to_vision).reason == "waiting for quota: group vision: 1 of 1 GPUs in use, needs 1"

    refused = submit(alice, script, 1, group="robotics")
    assert refused.status_code == 400
    assert refused.json()["group"] == ["You are not a member of group 'robotics'. Your groups: nlp, vision."]


def test_the_site_default_applies_without_a_quota_row_and_fills_empty_limits(alice, bob, make_user, image, script,
                                                                              settings):
    settings.RINGMASTER_DEFAULT_QUOTA_GPUS = 2
    settings.RINGMASTER_LOCAL_GPUS = 8
    carol = make_user("carol")
    Quota.objects.create(user=bob, jobs=5)                   # GPUs left empty: the site default's 2
    Quota.objects.create(user=carol, gpus=6)
    jobs = {user.username: [submitted(user, script, 2), submitted(user, script, 2)] for user in (alice, bob, carol)}
    admitted = scheduler.admit()
    assert admitted == [jobs["alice"][0].pk, jobs["bob"][0].pk, jobs["carol"][0].pk, jobs["carol"][1].pk]
    assert reload(jobs["bob"][1]).reason == "waiting for quota: user bob: 2 of 2 GPUs in use, needs 2"


# --- priority ---------------------------------------------------------------------------------
def test_higher_priority_runs_first_then_earlier_submission(alice, bob, make_user, image, script, settings):
    settings.RINGMASTER_LOCAL_GPUS = 4
    root = make_user("root", is_staff=True)
    blocker = submitted(alice, script, 4)
    assert scheduler.admit() == [blocker.pk]
    early = submitted(alice, script, 4)
    later = submitted(bob, script, 2)
    urgent = submitted(root, script, 4, priority=5)
    assert scheduler.admit() == []
    assert [scheduler.queue_position(reload(j)) for j in (urgent, early, later)] == [1, 2, 3]
    assert reload(urgent).reason == "waiting for capacity: 4 of 4 GPUs in use, this job needs 4"
    assert reload(later).reason == "waiting behind an earlier job for capacity (local)"

    services.set_priority(later, 10, by=root)                 # an admin moves bob's job to the front
    states.transition(blocker.pk, State.RUNNING)
    states.transition(blocker.pk, State.SUCCEEDED)
    assert scheduler.admit() == [later.pk]                     # 2 GPUs, then urgent (4) waits for room
    assert reload(urgent).reason == "waiting for capacity: 2 of 4 GPUs in use, this job needs 4"
    assert scheduler.queue_position(reload(urgent)) == 1 and scheduler.queue_position(reload(early)) == 2


def test_only_staff_may_set_a_priority(alice, make_user, script, image):
    response = submit(alice, script, 1, priority=3)
    assert response.status_code == 400 and response.json()["priority"] == ["Only staff may set a priority."]
    staff = submitted(make_user("root", is_staff=True), script, 1, priority=3)
    assert staff.priority == 3
    assert submit(alice, script, 1, priority="high").status_code == 400


# --- refuse at submit -------------------------------------------------------------------------
@pytest.mark.parametrize("quota, group, message", [
    ({"user": True, "gpus_per_job": 4}, None, "at most 4 GPUs per job for alice (user quota)"),
    ({"user": True, "gpus": 3}, None, "at most 3 GPUs per job for alice (user quota)"),
    ({"user": True, "gpus_per_job": 2, "backend": "local"}, None, "at most 2 GPUs per job for alice (user quota on local)"),
    ({"group": True, "gpus_per_job": 4}, "vision", "at most 4 GPUs per job for vision (group quota)"),
    ({"user": True, "jobs": 0}, None, "alice may run no jobs (user quota: 0 jobs at once)"),
    ({"site": 4}, None, "at most 4 GPUs per job for alice (user quota)"),
])
def test_a_job_that_can_never_fit_is_refused_at_submit_naming_the_limit(alice, vision, image, script, settings,
                                                                        quota, group, message):
    if "site" in quota:
        settings.RINGMASTER_DEFAULT_QUOTA_GPUS_PER_JOB = quota.pop("site")
    elif quota.pop("user", False):
        Quota.objects.create(user=alice, **quota)
    elif quota.pop("group", False):
        Quota.objects.create(group=vision, **quota)
    response = submit(alice, script, 6, **({"group": group} if group else {}))
    assert response.status_code == 400
    assert response.json() == {"gpus": [message]}
    assert Job.objects.count() == 0


def test_a_job_within_every_limit_is_accepted(alice, vision, image, script):
    Quota.objects.create(user=alice, gpus_per_job=4)
    Quota.objects.create(group=vision, gpus_per_job=4)
    assert submit(alice, script, 4).status_code == 201


def test_a_quota_lowered_after_submit_says_so_and_blocks_no_one(alice, bob, image, script, settings):
    settings.RINGMASTER_LOCAL_GPUS = 8
    stuck = submitted(alice, script, 6)
    Quota.objects.create(user=alice, gpus_per_job=4)
    small = submitted(bob, script, 4)
    assert scheduler.admit() == [small.pk]
    assert reload(stuck).reason == "can never start: at most 4 GPUs per job for alice (user quota)"


# --- fairness: no starvation, no blocking across constraints -----------------------------------
def test_a_big_job_reserves_capacity_and_a_quota_blocked_job_reserves_nothing(alice, bob, make_user, image, script,
                                                                           settings):
    settings.RINGMASTER_LOCAL_GPUS = 4
    carol = make_user("carol")
    Quota.objects.create(user=carol, jobs=1)
    running, carols_first = submitted(alice, script, 2), submitted(carol, script, 1)
    assert scheduler.admit() == [running.pk, carols_first.pk]          # 3 of 4 GPUs in use
    carols = submitted(carol, script, 1)     # carol's quota is full: waits, and holds no capacity
    big = submitted(bob, script, 4)          # more than is free: waits, and reserves the capacity
    small = submitted(alice, script, 1)      # would fit now, but must not overtake the big job
    assert scheduler.admit() == []
    assert reload(carols).reason == "waiting for quota: user carol: 1 of 1 jobs running"
    assert reload(big).reason == "waiting for capacity: 3 of 4 GPUs in use, this job needs 4"
    assert reload(small).reason == "waiting behind an earlier job for capacity (local)"


def test_cancelling_the_job_others_wait_behind_lets_the_queue_move(alice, bob, image, script, settings,
                                                                   django_capture_on_commit_callbacks):
    settings.RINGMASTER_LOCAL_GPUS = 4
    running = submitted(alice, script, 2)
    assert scheduler.admit() == [running.pk]
    big, small = submitted(bob, script, 4), submitted(alice, script, 1)
    assert scheduler.admit() == []
    with django_capture_on_commit_callbacks() as on_commit:
        services.cancel(big, by=bob)
    assert "dispatch" in taskqueue.sent(on_commit)                   # the scheduler is asked again
    assert scheduler.admit() == [small.pk]


def test_a_job_over_its_own_quota_does_not_hold_back_others_on_the_same_backend(alice, bob, image, script, settings):
    settings.RINGMASTER_LOCAL_GPUS = 8
    Quota.objects.create(user=alice, gpus=2)
    first = submitted(alice, script, 2)
    assert scheduler.admit() == [first.pk]
    alices = submitted(alice, script, 2)
    bobs = submitted(bob, script, 4)
    assert scheduler.admit() == [bobs.pk]
    assert reload(alices).state == State.QUEUED


# --- hold, release, cancel by an admin --------------------------------------------------------
def test_a_held_job_waits_with_a_reason_and_runs_when_released(alice, bob, make_user, image, script):
    root = make_user("root", is_staff=True)
    held = submitted(alice, script, 1)
    services.hold(held, by=root)
    other = submitted(bob, script, 1)
    assert scheduler.admit() == [other.pk]
    body = client_of(alice).get(f"/api/jobs/{held.pk}/").json()
    assert (body["state"], body["reason"], body["held"], body["queue_position"]) == ("QUEUED", "held by root", True, None)
    services.release(reload(held), by=root)
    assert scheduler.admit() == [held.pk]
    messages = list(JobEvent.objects.filter(job=held).values_list("message", flat=True))
    assert "held by root" in messages and "released by root" in messages


def test_admin_actions_hold_release_reprioritise_and_cancel_with_history(client, alice, make_user, image, script):
    from django.contrib.admin.models import LogEntry

    root = make_user("root", is_staff=True, is_superuser=True)
    client.force_login(root)
    one, two = submitted(alice, script, 1), submitted(alice, script, 1)
    url = "/admin/jobs/job/"

    def act(action, ids, **extra):
        return client.post(url, {"action": action, "_selected_action": [str(i) for i in ids], **extra}, follow=True)

    assert act("hold_jobs", [one.pk]).status_code == 200
    assert reload(one).held and reload(one).reason == "held by root"
    page = act("set_priority", [two.pk])
    assert b"Set priority" in page.content and reload(two).priority == 0           # asks first
    act("set_priority", [two.pk], apply="1", priority="7")
    assert reload(two).priority == 7
    act("set_priority", [two.pk], apply="1", priority="abc")
    assert reload(two).priority == 7
    act("release_jobs", [one.pk])
    assert not reload(one).held
    act("cancel_jobs", [two.pk])
    assert reload(two).state == State.CANCELLED
    history = list(LogEntry.objects.filter(user=root).order_by("id").values_list("object_id", "change_message"))
    assert history == [(str(one.pk), "held by root"), (str(two.pk), "priority set to 7 by root"),
                       (str(one.pk), "released by root"), (str(two.pk), "cancelled by root")]
    client.force_login(alice)
    act("hold_jobs", [two.pk])                                                     # not staff: nothing
    assert not Job.objects.filter(held=True).exists()


def test_quota_changes_in_the_admin_are_kept_in_its_history(client, alice, make_user):
    root = make_user("root", is_staff=True, is_superuser=True)
    client.force_login(root)
    fields = {"user": alice.pk, "group": "", "backend": "", "gpus": "8", "jobs": "", "gpus_per_job": "",
              "gpu_hours": "", "window_days": ""}
    response = client.post("/admin/jobs/quota/add/", fields)
    assert response.status_code == 302, response.content.decode()[:2000]
    quota = Quota.objects.get(user=alice)
    client.post(f"/admin/jobs/quota/{quota.pk}/change/", {**fields, "gpus": "16"})
    assert Quota.objects.get(pk=quota.pk).gpus == 16
    history = client.get(f"/admin/jobs/quota/{quota.pk}/history/").content.decode()
    assert "root" in history and "Added." in history and "Changed GPUs at once." in history
    both = client.post("/admin/jobs/quota/add/", {**fields, "group": Group.objects.create(name="g").pk})
    assert both.status_code == 200 and Quota.objects.count() == 1                 # a form error, no 500


# --- accounting -------------------------------------------------------------------------------
def test_gpu_seconds_are_recorded_for_cancelled_and_failed_jobs_and_not_for_never_run_ones(alice, image, script):
    from jobs.domain.follow import finish
    from runners.base import Exited

    before = timezone.now()
    ran_then_cancelled = past_job(alice, image, script, 2, before - timedelta(minutes=10))
    Job.objects.filter(pk=ran_then_cancelled.pk).update(cancel_requested=True)
    finish(ran_then_cancelled.pk, Exited(code=143, detail="stopped"))
    failed = past_job(alice, image, script, 3, before - timedelta(minutes=20))
    finish(failed.pk, Exited(code=1, detail=""))
    queued = submitted(alice, script, 4)
    services.cancel(queued, by=alice)
    late = (timezone.now() - before).total_seconds()          # how long this test took, by its own clock
    for job, low, state in ((ran_then_cancelled, 1200, State.CANCELLED), (failed, 3600, State.FAILED)):
        job = reload(job)                                     # 2 GPUs x 10 min, 3 GPUs x 20 min
        assert job.state == state
        assert low <= job.gpu_seconds <= low + job.gpus * late
    assert reload(queued).gpu_seconds == 0


def test_daily_usage_cuts_jobs_at_midnight_per_user_group_and_backend(alice, bob, vision, image, script):
    from jobs.domain import accounting

    today = timezone.localdate()
    midnight = accounting.day_start(today)
    past_job(alice, image, script, 2, midnight - timedelta(hours=3), midnight + timedelta(hours=1), group=vision)
    past_job(bob, image, script, 1, midnight - timedelta(days=1, hours=1), midnight - timedelta(days=1) +
             timedelta(hours=2), state=State.FAILED)
    usage = accounting.daily_usage(today - timedelta(days=2), today, now=midnight + timedelta(hours=2))
    hours = {key: round(value / 3600, 6) for key, value in usage.items()}
    yesterday, before = today - timedelta(days=1), today - timedelta(days=2)
    assert hours == {
        (yesterday, "alice", "vision", "local"): 6.0,
        (today, "alice", "vision", "local"): 2.0,
        (before, "bob", "(no group)", "local"): 1.0,
        (yesterday, "bob", "(no group)", "local"): 2.0,
    }
    assert accounting.totals(usage, ("group",))[("vision",)] / 3600 == pytest.approx(8.0)


def test_usage_csv_gives_users_their_own_rows_and_staff_everyones(client, alice, bob, make_user, image, script):
    now = timezone.now()
    past_job(alice, image, script, 2, now - timedelta(minutes=90), now - timedelta(minutes=30))
    past_job(bob, image, script, 1, now - timedelta(minutes=90), now - timedelta(minutes=30))
    client.force_login(alice)
    response = client.get("/usage.csv?days=7")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = [line.split(",") for line in response.content.decode().strip().splitlines()]
    assert rows[0] == ["day", "user", "group", "backend", "gpu_hours", "gpu_seconds"]
    assert {row[1] for row in rows[1:]} == {"alice"}
    assert sum(float(row[4]) for row in rows[1:]) == pytest.approx(2.0, abs=0.01)
    assert client.get("/usage.csv?user=bob").status_code == 400
    assert client.get("/usage.csv?days=1000").status_code == 400
    assert client.get("/usage.csv?days=x").status_code == 400
    client.force_login(make_user("root", is_staff=True))
    everyone = client.get("/usage.csv").content.decode()
    assert ",alice," in everyone and ",bob," in everyone
    assert ",alice," not in client.get("/usage.csv?user=bob").content.decode()
    assert client.get("/usage.csv?group=nope").status_code == 400


# --- what users and admins see ----------------------------------------------------------------
def test_api_quota_gives_the_callers_limits_and_current_use(alice, bob, vision, image, script):
    Quota.objects.create(user=alice, gpus=8, gpus_per_job=4)
    Quota.objects.create(group=vision, gpus=16, gpu_hours=1000, window_days=30)
    Quota.objects.create(user=bob, gpus=1)                                   # not alice's business
    past_job(alice, image, script, 2, timezone.now() - timedelta(hours=1), group=vision)
    past_job(bob, image, script, 3, timezone.now() - timedelta(hours=1), group=vision)
    body = client_of(alice).get("/api/quota/").json()
    assert body["user"] == "alice" and body["groups"] == ["vision"] and body["default_group"] == "vision"
    assert body["limits"] == {"gpus": 8, "jobs": None, "gpus_per_job": 4, "gpu_hours": None, "window_days": 30}
    assert body["use"]["gpus"] == 2 and body["use"]["jobs"] == 1
    group = [s for s in body["scopes"] if s["scope"] == "group"]
    assert len(group) == 1 and group[0]["name"] == "vision"
    assert group[0]["use"]["gpus"] == 5 and group[0]["use"]["gpu_hours"] == pytest.approx(5, abs=0.01)
    assert "GPUs at once: 5 of 16" in group[0]["lines"]
    assert APIClient().get("/api/quota/").status_code == 401
    assert "/api/quota/" in client_of(alice).get("/api/schema/?format=json").json()["paths"]


def test_job_list_api_has_positions_in_a_constant_number_of_queries(alice, image, script):
    def queries():
        with CaptureQueriesContext(connection) as captured:
            body = client_of(alice).get("/api/jobs/?limit=50").json()
        return len(captured), body
    for _ in range(3):
        submitted(alice, script, 1)
    few, _ = queries()
    for _ in range(20):
        submitted(alice, script, 1)
    many, body = queries()
    assert many == few
    assert sorted(j["queue_position"] for j in body["results"]) == list(range(1, 24))
    assert body["results"][0]["group"] is None and body["results"][0]["priority"] == 0


def test_job_list_page_uses_a_constant_number_of_queries(client, alice, image, script):
    client.force_login(alice)
    for _ in range(3):
        submitted(alice, script, 1)
    with CaptureQueriesContext(connection) as few:
        assert client.get("/").status_code == 200
    for _ in range(40):
        submitted(alice, script, 1)
    with CaptureQueriesContext(connection) as many:
        assert client.get("/?page=2").status_code == 200
    assert len(many) == len(few)


def test_the_job_form_shows_current_use_against_each_limit(client, alice, vision, image, script):
    Quota.objects.create(user=alice, gpus=8, jobs=3)
    Quota.objects.create(group=vision, gpus=16)
    past_job(alice, image, script, 2, timezone.now() - timedelta(minutes=5), group=vision)
    client.force_login(alice)
    page = client.get("/jobs/new/").content.decode()
    assert 'id="quota-panel"' in page
    assert "2 of 8" in page and "1 of 3" in page and "2 of 16" in page
    assert 'name="group"' in page and 'name="priority"' not in page          # priority: staff only


def test_my_usage_page_and_the_staff_cluster_page(client, alice, bob, vision, make_user, image, script, settings):
    settings.RINGMASTER_LOCAL_GPUS = 4
    Quota.objects.create(group=vision, gpus=4)
    running = submitted(alice, script, 4)
    scheduler.admit()
    states.transition(running.pk, State.RUNNING)
    waiting = submitted(bob, script, 2)
    scheduler.admit()
    client.force_login(bob)
    mine = client.get("/usage/")
    assert mine.status_code == 200 and 'id="quota-panel"' in mine.content.decode()
    assert client.get("/usage/?days=0").status_code == 400
    assert client.get("/capacity/").status_code == 403

    client.force_login(make_user("root", is_staff=True))
    page = client.get("/capacity/").content.decode()
    assert reload(waiting).reason in page and f'data-job="{waiting.pk}"' in page
    assert "group vision: 4 of 4 GPUs in use" in page
    assert 'id="usage-data"' in page and "vendor/uplot/uPlot.iife.min.js" in page
    assert '<td class="num">4</td>' in page                                     # 4 GPUs in use of 4


# --- set_quota --------------------------------------------------------------------------------
def test_set_quota_creates_changes_and_clears_limits(alice, vision):
    import io

    from django.core.management import CommandError, call_command

    def run(*args):
        out = io.StringIO()
        call_command("set_quota", *args, stdout=out, stderr=io.StringIO())
        return out.getvalue().strip()

    assert run("--user", "alice", "--gpus", "8", "--gpus-per-job", "4") == \
        "created quota of user alice: 8 GPUs at once, at most 4 GPUs per job"
    assert run("--user", "alice", "--gpu-hours", "1000", "--window-days", "30", "--jobs", "2") == \
        "updated quota of user alice: 8 GPUs at once, 2 jobs at once, at most 4 GPUs per job, " \
        "1,000 GPU-hours per 30 days"
    assert run("--user", "alice", "--gpus", "default").startswith("updated quota of user alice: 2 jobs")
    assert run("--group", "vision", "--gpus", "16") == "created quota of group vision: 16 GPUs at once"
    assert run("--group", "vision", "--backend", "local", "--gpus", "4").startswith("created quota of group vision on local")
    assert Quota.objects.count() == 3
    for args, message in [
        (("--user", "ghost", "--gpus", "1"), "no user 'ghost'"),
        (("--group", "ghosts", "--gpus", "1"), "no group 'ghosts'"),
        (("--user", "alice", "--gpus", "many"), "--gpus must be a number"),
        (("--user", "alice", "--gpus", "-1"), "--gpus must be 0 or more"),
        (("--user", "alice", "--window-days", "0"), "--window-days must be at least 1"),
    ]:
        with pytest.raises(CommandError, match=message):
            run(*args)
    with pytest.raises(CommandError):
        run("--user", "alice", "--group", "vision")
