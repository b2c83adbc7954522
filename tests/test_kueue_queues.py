"""Kueue queues per team and Kueue found or not, without a cluster to talk to: which LocalQueue
a job is labelled for (a user's own, their group's, the cluster's), map_queue and the admin's
inline with one form, a queue refused where the last check found no Kueue, the cluster's admin
page, and GPU-seconds of a job that Kueue sent back to waiting."""
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.core.management import CommandError
from django.utils import timezone

from jobs.backends.kubernetes.clusters import queue_for, render
from jobs.domain import accounting, failure, states
from jobs.backends.kubernetes.models import Cluster, QueueMapping
from jobs.models import Job, JobEvent, State
from tests.test_clusters import alice_api, cluster, k8s_image, run, submit  # noqa: F401 (fixtures)
from tests.clusterjobs import on_cluster

pytestmark = pytest.mark.django_db
LABEL = "kueue.x-k8s.io/queue-name"


@pytest.fixture
def vision(alice):
    group = Group.objects.create(name="vision")
    alice.groups.add(group)
    return group


def test_a_users_own_queue_wins_over_their_groups_which_wins_over_the_clusters(cluster, alice, vision, make_user):
    cluster.kueue_queue = "team-queue"
    cluster.save()
    other = Cluster.objects.create(name="gpu-west", namespace="training", gpus_per_node=8, kueue_queue="west")
    bob = make_user("bob")
    assert queue_for(cluster, alice, vision) == "team-queue"
    run("map_queue", "--cluster", "gpu-east", "--group", "vision", "--queue", "vision-queue")
    assert (queue_for(cluster, alice, vision), queue_for(cluster, bob, vision), queue_for(cluster, bob)) == \
        ("vision-queue", "vision-queue", "team-queue")
    run("map_queue", "--cluster", "gpu-east", "--user", "alice", "--queue", "alice-queue")
    assert (queue_for(cluster, alice, vision), queue_for(cluster, alice), queue_for(cluster, bob, vision)) == \
        ("alice-queue", "alice-queue", "vision-queue")
    assert queue_for(other, alice, vision) == "west"           # mappings are per cluster
    run("map_queue", "--cluster", "gpu-east", "--user", "alice", "--queue", "vision-queue-2")
    assert QueueMapping.objects.get(user=alice).queue == "vision-queue-2"      # changed, not added
    out = run("map_queue", "--cluster", "gpu-east", "--user", "alice", "--queue", "")
    assert "the cluster's queue (team-queue)" in out and queue_for(cluster, alice, vision) == "vision-queue"


def test_both_kinds_of_job_document_carry_the_mapped_label(alice_api, cluster, k8s_image, vision):  # noqa: F811
    run("map_queue", "--cluster", "gpu-east", "--group", "vision", "--queue", "vision-queue")
    k8s_image.launchers = "horovod,torchrun"
    k8s_image.save()
    kinds = {}
    for launcher in ("horovod", "torchrun"):
        response = submit(alice_api, group="vision", launcher=launcher, gpus=8)
        assert response.status_code == 201, response.json()
        kind, document = render(Job.objects.get(pk=response.json()["id"]))
        kinds[kind] = document["metadata"]["labels"].get(LABEL)
    assert kinds == {"MPIJob": "vision-queue", "TrainJob": "vision-queue"}


@pytest.mark.parametrize(("args", "message"), [
    (["--cluster", "nowhere", "--group", "vision", "--queue", "q"],
     "--cluster: no cluster 'nowhere' (clusters: gpu-east)"),
    (["--cluster", "gpu-east", "--group", "nobody", "--queue", "q"], "--group: no group 'nobody'"),
    (["--cluster", "gpu-east", "--user", "nobody", "--queue", "q"], "--user: no user 'nobody'"),
    (["--cluster", "gpu-east", "--group", "vision", "--queue", "bad queue!"],
     "--queue: Must be a valid label value (a LocalQueue name)."),
])
def test_map_queue_refuses_bad_input_naming_the_option(cluster, vision, args, message):
    with pytest.raises(CommandError) as refused:
        run("map_queue", *args)
    assert str(refused.value) == message
    assert not QueueMapping.objects.exists()


def test_where_the_last_check_found_no_kueue_a_queue_is_refused_at_map_queue_in_the_admin_and_at_submit(
        client, make_user, alice_api, cluster, k8s_image, vision):  # noqa: F811
    QueueMapping.objects.create(cluster=cluster, group=vision, queue="vision-queue")
    Cluster.objects.filter(pk=cluster.pk).update(kueue_found=False,
                                                 kueue_detail="the API server has no kueue.x-k8s.io API group")
    with pytest.raises(CommandError, match="--queue: Kueue is not installed on cluster gpu-east"):
        run("map_queue", "--cluster", "gpu-east", "--user", "alice", "--queue", "alice-queue")
    response = submit(alice_api, group="vision")
    assert response.status_code == 400
    assert response.json()["cluster"] == [
        "Kueue is not installed on cluster gpu-east (the API server has no kueue.x-k8s.io API group): a job in "
        "queue vision-queue would never be admitted. Install Kueue (deploy/KUBERNETES.md), or leave the queue empty."]
    admin = make_user("root", is_staff=True, is_superuser=True)
    client.force_login(admin)
    page = client.get(f"/admin/kubernetes/cluster/{cluster.pk}/change/").content.decode()
    assert "Kueue found" in page and "the API server has no kueue.x-k8s.io API group" in page
    assert "Kueue queues of groups and users" in page and "vision-queue" in page
    QueueMapping.objects.all().delete()
    assert submit(alice_api, group="vision").status_code == 201    # no queue: as on any cluster without Kueue


def test_a_job_kueue_sent_back_to_waiting_counts_gpu_seconds_only_while_it_ran(alice, cluster, k8s_image):
    job = on_cluster(Job.objects.create(owner=alice, image=k8s_image, gpus=8, script_path="/t.py",
                                        backend="kubernetes", time_limit_minutes=60), cluster)
    states.transition(job.pk, State.LAUNCHING)
    states.transition(job.pk, State.RUNNING)
    back = states.transition(job.pk, State.LAUNCHING, expect={State.RUNNING}, reason="preempted by Kueue (x): y")
    assert back.reason == "preempted by Kueue (x): y"
    states.transition(job.pk, State.RUNNING)
    done = states.transition(job.pk, State.SUCCEEDED)
    start = timezone.now() - timedelta(hours=10)
    moments = [start, start + timedelta(hours=1), start + timedelta(hours=3), start + timedelta(hours=4)]
    events = list(JobEvent.objects.filter(job=job, gpus__isnull=False).order_by("id"))
    assert [e.gpus for e in events] == [8, 0, 8]
    for event, moment in zip(events, moments[:3]):
        JobEvent.objects.filter(pk=event.pk).update(ts=moment)
    Job.objects.filter(pk=job.pk).update(started_at=moments[0], finished_at=moments[3], gpu_seconds=0)
    job.refresh_from_db()
    assert accounting.job_gpu_seconds(job) == 8 * 2 * 3600       # 1 h, then 2 h back in Kueue, then 1 h
    usage = accounting.daily_usage(timezone.localdate(start) - timedelta(days=1), timezone.localdate())
    assert sum(usage.values()) == pytest.approx(8 * 2 * 3600)
    assert done.state == State.SUCCEEDED


def test_a_job_kueue_sent_back_to_waiting_counts_only_its_running_time_against_its_time_limit(
        alice, cluster, k8s_image):
    job = on_cluster(Job.objects.create(owner=alice, image=k8s_image, gpus=8, script_path="/t.py",
                                        backend="kubernetes", time_limit_minutes=120), cluster)
    states.transition(job.pk, State.LAUNCHING)
    states.transition(job.pk, State.RUNNING)
    states.transition(job.pk, State.LAUNCHING, expect={State.RUNNING}, reason="preempted by Kueue (x): y")
    states.transition(job.pk, State.RUNNING)
    now = timezone.now()
    moments = [now - timedelta(hours=3), now - timedelta(minutes=150), now - timedelta(hours=1)]
    for event, moment in zip(JobEvent.objects.filter(job=job, gpus__isnull=False).order_by("id"), moments):
        JobEvent.objects.filter(pk=event.pk).update(ts=moment)
    Job.objects.filter(pk=job.pk).update(started_at=moments[0])
    job.refresh_from_db()
    # 3 hours since it first started, but it ran 30 min, waited 90 min in Kueue, then ran 60 min.
    assert accounting.running_seconds(job, now) == pytest.approx(90 * 60, abs=1)
    assert not failure.over_time_limit(job, now)
    assert failure.over_time_limit(job, now + timedelta(minutes=31))
    fixed = on_cluster(Job.objects.create(owner=alice, image=k8s_image, gpus=8, script_path="/t.py",
                                          backend="kubernetes", time_limit_minutes=120, started_at=now - timedelta(minutes=121),
                                          state=State.RUNNING), cluster)
    assert failure.over_time_limit(fixed, now)                   # never requeued: its wall time counts


def test_a_new_wait_reason_is_an_event_and_a_new_place_in_the_queue_alone_is_not(alice, cluster, k8s_image):
    job = on_cluster(Job.objects.create(owner=alice, image=k8s_image, gpus=8, script_path="/t.py",
                                        backend="kubernetes", time_limit_minutes=60), cluster)
    states.transition(job.pk, State.LAUNCHING)
    held = "waiting in Kueue: ClusterQueue q has 0 nvidia.com/gpu free in flavor f, the job asks for 8"
    states.set_reason(job.pk, held, "; position 3 in ClusterQueue q")
    shown = states.set_reason(job.pk, held, "; position 2 in ClusterQueue q")
    assert shown.reason == held + "; position 2 in ClusterQueue q"          # the page shows the place now
    states.set_reason(job.pk, "quota reserved in ClusterQueue q: waiting for Kueue's admission checks")
    messages = list(JobEvent.objects.filter(job=job, state="").values_list("message", flat=True))
    assert messages == [held, "quota reserved in ClusterQueue q: waiting for Kueue's admission checks"]
