"""Admission raced from threads on PostgreSQL, beyond a user's GPUs (tests/test_quotas.py):
a group's pooled quota, jobs at once, used-up GPU-hours and a cluster's GPU limit. Each is
checked from the database after eight admission passes ran at once. The three limits on what
runs at once fail with the scheduler's row lock taken out (jobs.domain.scheduler._lock_scheduler);
used-up GPU-hours admit nothing, lock or not, and the test shows no racing pass reads it wrong."""
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.db.models import Sum
from django.utils import timezone

from jobs.models import Cluster, Image, Job, Quota, State
from tests.conftest import admit_from_threads, needs_row_locks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def postgresql(settings):
    needs_row_locks()
    settings.RINGMASTER_LOCAL_GPUS = 64                 # the quota or the cluster is the limit here


def queue(owner, image, sizes, **fields):
    return [Job.objects.create(owner=owner, image=image, gpus=gpus, script_path="t.py", time_limit_minutes=60,
                               reason="waiting for the scheduler", **fields) for gpus in sizes]


def race():
    admitted, errors = admit_from_threads(8)
    assert errors == []
    assert len(admitted) == len(set(admitted))                      # no job admitted twice
    launching = Job.objects.filter(state=State.LAUNCHING)
    return launching.count(), launching.aggregate(n=Sum("gpus"))["n"] or 0


def test_a_groups_pooled_quota_holds_under_racing_admissions(make_user, image):
    vision = Group.objects.create(name="vision")
    users = [make_user(name) for name in ("alice", "bob", "carol")]
    vision.user_set.add(*users)
    Quota.objects.create(group=vision, gpus=4)
    for i, user in enumerate(users * 4):
        queue(user, image, [1 + i % 2], charged_group=vision)       # 1, 2, 1, 2, ... GPUs in queue order
    jobs, gpus = race()
    assert gpus == 4 and jobs == 3                                  # 1 + 2 + 1, then a 2 waits


def test_jobs_at_once_hold_under_racing_admissions(make_user, image):
    alice = make_user("alice")
    Quota.objects.create(user=alice, jobs=2)
    queue(alice, image, [1] * 10)
    jobs, _ = race()
    assert jobs == 2


def test_used_up_gpu_hours_admit_nothing_under_racing_admissions(make_user, image):
    alice = make_user("alice")
    Quota.objects.create(user=alice, gpu_hours=1, window_days=30)
    now = timezone.now()
    Job.objects.create(owner=alice, image=image, gpus=1, script_path="t.py", time_limit_minutes=60,
                       state=State.SUCCEEDED, started_at=now - timedelta(hours=3),
                       finished_at=now - timedelta(hours=2))                   # 1 GPU-hour: used up
    waiting = queue(alice, image, [1] * 6)
    assert race() == (0, 0)
    reasons = [Job.objects.get(pk=job.pk).reason for job in waiting]
    assert reasons == ["waiting for quota: user alice: GPU-hours for 30 days used up: 1 of 1"] + \
        ["waiting behind an earlier job for the quota of user alice"] * 5


def test_a_clusters_gpu_limit_holds_under_racing_admissions(make_user, image):
    cluster = Cluster.objects.create(name="gpu-east", namespace="training", gpus_per_node=8, gpu_limit=4)
    k8s = Image.objects.create(name="horovod-k8s", container_image="registry.example/horovod:0.28.1")
    alice = make_user("alice")
    queue(alice, k8s, [1, 2, 1, 2, 1, 2, 1, 2], backend="kubernetes", cluster=cluster)
    jobs, gpus = race()
    assert gpus == 4 and jobs == 3
