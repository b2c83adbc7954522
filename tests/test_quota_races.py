"""Admission raced from threads on PostgreSQL, beyond a user's GPUs (tests/test_quotas.py): a
group's pooled quota, jobs at once, a cluster's GPU limit and used-up GPU-hours. Eight admission
passes (jobs.domain.scheduler.admit) are released at once; what they admitted is read back from
the recorded admissions (a JobEvent in state LAUNCHING per admitted job) and compared with what
one pass at a time admits, written down here job by job.

The limits on what runs at once (GPUs, jobs, a cluster's GPUs) are what the scheduler's row lock
(scheduler._lock_scheduler) keeps: with it made a no-op, every racing pass counts only what was
active before it began, and these tests go red with jobs admitted past each limit.

GPU-hours are different by design (README, "Quotas"): they count running time, so admitting a
job adds none, and a window blocks only once it is used up. No admission can change what another
pass reads of a window, so there is no lost update for the lock to prevent; what a race could
get wrong is reading the window (a part of an old job, a pooled group) or holding back another
scope's jobs, and the GPU-hour test checks those under racing passes.

On SQLite these tests skip and say why (conftest.row_locks); `make test` gives pytest a
PostgreSQL DATABASE_URL, and where DATABASE_URL names PostgreSQL they fail rather than skip.
"""
import os
import re
import shutil
import subprocess
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from jobs.backends.kubernetes.models import Cluster
from jobs.models import Image, Job, JobEvent, Quota, State
from tests.conftest import ROOT, admit_from_threads
from tests.clusterjobs import on_cluster


@pytest.fixture
def postgresql(row_locks, settings):
    settings.RINGMASTER_LOCAL_GPUS = 64                 # the quota or the cluster is the limit here


def queue(owner, image, gpus, name, cluster=None, **fields):
    return on_cluster(Job.objects.create(owner=owner, image=image, gpus=gpus, script_path="t.py", time_limit_minutes=60,
                                         name=name, reason="waiting for the scheduler", **fields), cluster)


def running(owner, image, gpus, name, cluster=None, **fields):
    """A job admitted before the race: it holds its GPUs and counts as a job at once."""
    return on_cluster(Job.objects.create(owner=owner, image=image, gpus=gpus, script_path="t.py", time_limit_minutes=60,
                                         name=name, state=State.RUNNING, started_at=timezone.now(), **fields), cluster)


def race(passes=8):
    """Race `passes` admission passes; the names of the jobs admitted, from the recorded admissions."""
    admitted, errors = admit_from_threads(passes)
    recorded = list(JobEvent.objects.filter(state=State.LAUNCHING).values_list("job_id", flat=True))
    names = sorted(Job.objects.filter(pk__in=recorded).values_list("name", flat=True))
    assert errors == [], f"admitted {names}, and passes failed: {errors}"
    assert len(recorded) == len(set(recorded))                      # no job admitted twice
    assert sorted(recorded) == sorted(admitted)                     # what the passes said they admitted
    assert set(recorded) == set(Job.objects.filter(state=State.LAUNCHING).values_list("id", flat=True))
    return names


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("postgresql")
def test_a_groups_pooled_quota_holds_under_racing_admissions(make_user, image):
    """vision (alice, bob, carol) may hold 4 GPUs together; bob already runs 1. In queue order:
    alice-1 (1 GPU: 2 in use), bob-1 (2: 4 in use), carol-1 (1: would be 5) waits and reserves
    the group, everything of vision after it waits behind it. dave, in no group, is not held back."""
    vision = Group.objects.create(name="vision")
    alice, bob, carol, dave = (make_user(name) for name in ("alice", "bob", "carol", "dave"))
    vision.user_set.add(alice, bob, carol)
    Quota.objects.create(group=vision, gpus=4)
    running(bob, image, 1, "bob-0", charged_group=vision)
    for round_ in (1, 2, 3):
        for user, gpus in ((alice, 1), (bob, 2), (carol, 1)):
            queue(user, image, gpus, f"{user.username}-{round_}", charged_group=vision)
        queue(dave, image, 2, f"dave-{round_}")
    assert race() == ["alice-1", "bob-1", "dave-1", "dave-2", "dave-3"]
    assert Job.objects.get(name="carol-1").reason == "waiting for quota: group vision: 4 of 4 GPUs in use, needs 1"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("postgresql")
def test_jobs_at_once_hold_under_racing_admissions(make_user, image):
    """alice may run 2 jobs at once and already runs 1; her group vision may run 5 at once. In
    queue order: alice-1 (alice 2, vision 2), bob-1 (vision 3), carol-1 (vision 4), alice-2 waits
    on alice's own limit (not holding bob back), bob-2 (vision 5), carol-2 waits on vision's;
    everything after waits behind them."""
    vision = Group.objects.create(name="vision")
    alice, bob, carol = (make_user(name) for name in ("alice", "bob", "carol"))
    vision.user_set.add(alice, bob, carol)
    Quota.objects.create(user=alice, jobs=2)
    Quota.objects.create(group=vision, jobs=5)
    running(alice, image, 1, "alice-0", charged_group=vision)
    for round_ in (1, 2, 3, 4):
        for user in (alice, bob, carol):
            queue(user, image, 1, f"{user.username}-{round_}", charged_group=vision)
    assert race() == ["alice-1", "bob-1", "bob-2", "carol-1"]
    # The reasons the last pass gave, once vision is full too.
    assert Job.objects.get(name="alice-2").reason == \
        "waiting for quota: user alice: 2 of 2 jobs running; group vision: 5 of 5 jobs running"
    assert Job.objects.get(name="carol-2").reason == "waiting behind an earlier job for the quota of group vision"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("postgresql")
def test_a_clusters_gpu_limit_holds_under_racing_admissions(make_user, image):
    """east may run 4 GPUs and runs 1; west may run 2. east: e1 (1: 2 in use), e2 (2: 4 in use),
    e3 (1: would be 5) waits and reserves east. west: w1 (2: 2 in use), w2 (1: would be 3) waits."""
    east = Cluster.objects.create(name="gpu-east", namespace="training", gpus_per_node=8, gpu_limit=4)
    west = Cluster.objects.create(name="gpu-west", namespace="training", gpus_per_node=8, gpu_limit=2)
    k8s = Image.objects.create(name="horovod-k8s", container_image="registry.example/horovod:0.28.1")
    alice, bob = make_user("alice"), make_user("bob")
    running(bob, k8s, 1, "east-0", backend="kubernetes", cluster=east)
    for name, gpus, cluster in (("e1", 1, east), ("w1", 2, west), ("e2", 2, east), ("w2", 1, west),
                                ("e3", 1, east), ("w3", 1, west), ("e4", 2, east), ("e5", 1, east)):
        queue(alice if name < "w" else bob, k8s, gpus, name, backend="kubernetes", cluster=cluster)
    assert race() == ["e1", "e2", "w1"]
    assert Job.objects.get(name="e3").reason == \
        "waiting for capacity on cluster gpu-east: 4 of 4 GPUs in use, this job needs 1"
    assert Job.objects.get(name="w2").reason == \
        "waiting for capacity on cluster gpu-west: 2 of 2 GPUs in use, this job needs 1"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("postgresql")
def test_used_up_gpu_hours_of_a_group_hold_under_racing_admissions(make_user, image):
    """vision may use 10 GPU-hours in 30 days. bob ran 1 GPU for 10 h 10 min across the window's
    edge, 4 h 10 min of it inside; carol ran 2 GPUs for 3 h three days ago: 4.2 + 6 = 10.2 of 10,
    used up (counting all of bob's job would make it 16.2). alice's and carol's jobs wait, and
    dave (no group) is not held back."""
    vision = Group.objects.create(name="vision")
    alice, bob, carol, dave = (make_user(name) for name in ("alice", "bob", "carol", "dave"))
    vision.user_set.add(alice, bob, carol)
    Quota.objects.create(group=vision, gpu_hours=10, window_days=30)
    now = timezone.now()
    edge = now - timedelta(days=30)
    for owner, gpus, started, finished in ((bob, 1, edge - timedelta(hours=6), edge + timedelta(hours=4, minutes=10)),
                                           (carol, 2, now - timedelta(days=3, hours=3), now - timedelta(days=3))):
        Job.objects.create(owner=owner, image=image, gpus=gpus, script_path="t.py", time_limit_minutes=600,
                           charged_group=vision, state=State.SUCCEEDED, started_at=started, finished_at=finished,
                           name="past")
    for round_ in (1, 2, 3):
        queue(alice, image, 1, f"alice-{round_}", charged_group=vision)
        queue(carol, image, 1, f"carol-{round_}", charged_group=vision)
        queue(dave, image, 1, f"dave-{round_}")
    assert race() == ["dave-1", "dave-2", "dave-3"]
    reasons = dict(Job.objects.filter(state=State.QUEUED).values_list("name", "reason"))
    assert reasons == {
        "alice-1": "waiting for quota: group vision: GPU-hours for 30 days used up: 10.2 of 10",
        **{name: "waiting behind an earlier job for the quota of group vision"
           for name in ("carol-1", "alice-2", "carol-2", "alice-3", "carol-3")},
    }


def test_make_test_gives_pytest_a_postgresql_database():
    """`make test` runs the race tests, not skips them: the pytest command it runs names a
    PostgreSQL DATABASE_URL (and conftest.needs_row_locks fails where that is not what Django got)."""
    if shutil.which("make") is None:
        pytest.skip("no make here")
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "TEST_DATABASE_URL", "PYTEST_ARGS", "MAKEFLAGS", "MAKELEVEL")}
    printed = subprocess.run(["make", "-n", "-s", "test"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=60, check=True).stdout
    pytest_lines = [line for line in printed.splitlines() if "-m pytest" in line]
    assert len(pytest_lines) == 1, printed
    assert re.match(r"DATABASE_URL=postgres(ql)?://\S+ ", pytest_lines[0]), pytest_lines[0]
