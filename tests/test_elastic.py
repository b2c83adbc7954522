"""Elastic jobs in the scheduler: an elastic job (max_gpus) is admitted at its minimum, grows
into GPUs nothing queued can use yet, shrinks (never below its minimum) so a queued job of no lower
priority starts, keeps its quotas at every size, and is charged the GPUs it held over time."""
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.domain import accounting, quotas, scheduler, states
from jobs.models import Job, JobEvent, Quota, SlotAllocation, State
from runners.base import JobSpec
from runners.local import LocalRunner
from tests.test_quotas import bob, reload, submit, submitted  # noqa: F401 (bob: a fixture)

pytestmark = pytest.mark.django_db
A100 = "NVIDIA A100-SXM4-80GB"


@pytest.fixture
def script(db):
    from jobs.models import Script

    return Script.objects.create(owner=None, name="elastic_train.py", sha256="0" * 64, size=1, content="pass\n")


@pytest.fixture(autouse=True)
def settled_at_once(settings):
    settings.RINGMASTER_ELASTIC_SETTLE_SECONDS = 0


@pytest.fixture
def four(settings):
    settings.RINGMASTER_LOCAL_GPUS = 4           # four CPU slots (no nvidia-smi)


def running(job):
    states.transition(job.pk, State.RUNNING)
    return reload(job)


def size_events(job):
    return list(JobEvent.objects.filter(job=job, gpus__isnull=False).order_by("id").values_list("gpus", "message"))


def occupy(user, script, gpus):
    """A fixed job that is admitted and running: `gpus` of the four are taken."""
    job = submitted(user, script, gpus)
    assert scheduler.admit() == [job.pk]
    return running(job)


def end(job):
    states.transition(job.pk, State.SUCCEEDED)


def elastic_beside(alice, bob, script):
    """bob's fixed 2-GPU job and alice's 2..4 job beside it, both running: (elastic job, bob's)."""
    blocker = occupy(bob, script, 2)
    job = submitted(alice, script, 2, max_gpus=4)
    scheduler.admit()
    return running(job), blocker


def test_an_elastic_job_starts_at_its_minimum_and_grows_into_what_is_free(alice, bob, image, script, four):
    blocker = occupy(bob, script, 2)
    job = submitted(alice, script, 2, max_gpus=4)
    assert scheduler.admit() == [job.pk]
    assert reload(job).size == 2                         # the minimum fits: admitted
    running(job)
    end(blocker)
    scheduler.admit()
    job = reload(job)
    assert job.size == 4
    assert size_events(job)[-1] == (4, "grew to 4 GPUs: 2 GPUs free on this machine")
    assert quotas.QuotaBook().backend_gpus("local") == 4            # capacity counts the size now


def test_an_elastic_job_that_finds_gpus_free_is_launched_at_its_largest_size(alice, image, script, four):
    job = submitted(alice, script, 2, max_gpus=4)
    assert scheduler.admit() == [job.pk]
    job = reload(job)
    assert (job.state, job.size) == (State.LAUNCHING, 4)        # before its launch: no resize to miss
    assert size_events(job) == [(4, "grew to 4 GPUs: 2 GPUs free on this machine")]


def test_a_job_whose_ranks_may_not_be_up_yet_is_neither_grown_nor_shrunk(alice, bob, image, script, four,
                                                                         settings):
    settings.RINGMASTER_ELASTIC_SETTLE_SECONDS = 30
    job, blocker = elastic_beside(alice, bob, script)
    end(blocker)
    scheduler.admit()
    assert reload(job).size == 2                         # Horovod would drop the change: it waits
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(seconds=31))
    scheduler.admit()
    assert reload(job).size == 4
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now())
    submitted(bob, script, 2)
    assert scheduler.admit() == [] and reload(job).size == 4      # not shrunk before it settled either


def test_a_job_resized_lately_is_resized_again_only_once_it_settles_at_its_new_size(alice, bob, image, script,
                                                                                      four, settings):
    # Grown, grown again and shrunk within four seconds, a job's ranks can end up waiting for each
    # other for good (one in the state sync's broadcast, one in the training loop's allreduce;
    # Horovod issue #3494, which the rank launcher also works around).
    settings.RINGMASTER_ELASTIC_SETTLE_SECONDS = 30
    job, blocker = elastic_beside(alice, bob, script)
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(minutes=5))
    end(blocker)
    scheduler.admit()
    assert reload(job).size == 4                         # settled since its start: it grows
    other = submitted(bob, script, 2)
    assert scheduler.admit() == [] and reload(job).size == 4      # just grown: not shrunk yet
    assert "waiting for capacity" in reload(other).reason
    Job.objects.filter(pk=job.pk).update(resized_at=timezone.now() - timedelta(seconds=31))
    assert scheduler.admit() == [other.pk] and reload(job).size == 2
    end(other)
    scheduler.admit()
    assert reload(job).size == 2                         # just shrunk: not grown yet either
    Job.objects.filter(pk=job.pk).update(resized_at=timezone.now() - timedelta(seconds=31))
    scheduler.admit()
    assert reload(job).size == 4


@pytest.mark.parametrize("quota", [{"gpus": 3}, {"gpus_per_job": 3}, {"gpus": 3, "jobs": 1}])
def test_growing_stops_at_the_owners_quota(alice, image, script, four, quota):
    Quota.objects.create(user=alice, **quota)
    job = submitted(alice, script, 2, max_gpus=4)        # the maximum is a wish: quotas cap the growth
    scheduler.admit()
    running(job)
    scheduler.admit()
    assert reload(job).size == 3


def lender_and_borrower(alice, bob, script, **elastic):
    """Four slots: bob's fixed jobs of 2 and 1, alice's 1..4 job running at 1, and bob's queued
    3-GPU job. The 2-GPU job ends: 2 GPUs free, too few for the queued job. (elastic, fixed 1, queued)"""
    two, one = occupy(bob, script, 2), occupy(bob, script, 1)
    job = submitted(alice, script, 1, max_gpus=4, **elastic)
    scheduler.admit()
    job = running(job)
    assert job.size in (None, 1)
    queued = submitted(bob, script, 3)
    assert scheduler.admit() == []
    end(two)
    assert scheduler.admit() == []
    assert reload(queued).reason.startswith("waiting for capacity")
    return job, one, queued


def test_gpus_a_queued_job_cannot_use_yet_are_lent_and_it_takes_them_back_to_start(alice, bob, image, script, four):
    job, one, queued = lender_and_borrower(alice, bob, script)
    assert reload(job).size == 3                         # not left idle while the queued job waits
    assert size_events(job)[-1] == (3, f"grew to 3 GPUs: 2 GPUs free on this machine, until job {queued.pk} can start")
    end(one)                                             # 1 free and 2 lent: enough for it
    assert scheduler.admit() == [queued.pk]
    assert reload(job).size == 1
    assert size_events(job)[-1] == (1, f"shrank to 1 GPU for job {queued.pk}")
    assert quotas.QuotaBook().backend_gpus("local") == 4


def test_a_job_of_higher_priority_borrows_nothing_from_a_queued_job(alice, bob, make_user, image, script, four):
    root = make_user("root", is_staff=True)
    job, one, queued = lender_and_borrower(root, bob, script, priority=5)
    assert reload(job).size == 1                         # bob's job could not take the GPUs back
    end(one)
    assert scheduler.admit() == [queued.pk]


def test_a_queued_job_shrinks_a_running_elastic_job_and_starts(alice, bob, image, script, four):
    elastic = submitted(alice, script, 2, max_gpus=4)
    scheduler.admit()
    running(elastic)
    scheduler.admit()
    assert reload(elastic).size == 4
    other = submitted(bob, script, 2)
    assert scheduler.admit() == [other.pk]
    assert reload(elastic).size == 2
    assert size_events(elastic)[-1] == (2, f"shrank to 2 GPUs for job {other.pk}")
    assert quotas.QuotaBook().backend_gpus("local") == 4


def test_no_job_shrinks_below_its_minimum_or_for_a_job_of_lower_priority(alice, bob, make_user, image, script, four):
    root = make_user("root", is_staff=True)
    elastic = submitted(root, script, 2, max_gpus=4, priority=5)
    scheduler.admit()
    running(elastic)
    scheduler.admit()
    low = submitted(bob, script, 2)
    assert scheduler.admit() == []
    assert reload(elastic).size == 4 and reload(low).reason.startswith("waiting for capacity")
    bigger = submitted(root, script, 3, priority=5)      # needs 3: shrinking to 2 frees only 2
    assert scheduler.admit() == []
    assert reload(elastic).size == 4 and reload(bigger).state == State.QUEUED


def test_on_gpus_the_job_gets_more_indices_and_gives_back_its_last(alice, bob, image, script, local_gpus):
    local_gpus([A100] * 4)
    elastic = submitted(alice, script, 2, max_gpus=4)
    scheduler.admit()
    running(elastic)
    scheduler.admit()
    assert SlotAllocation.objects.get(job=elastic).gpu_indices == [0, 1, 2, 3]
    other = submitted(bob, script, 2)
    assert scheduler.admit() == [other.pk]
    assert SlotAllocation.objects.get(job=elastic).gpu_indices == [0, 1]
    assert SlotAllocation.objects.get(job=other).gpu_indices == [2, 3]


def test_gpu_seconds_follow_the_size_over_time_not_the_maximum(alice, image, script):
    start = timezone.now() - timedelta(seconds=300)
    job = Job.objects.create(owner=alice, image=image, script=script, gpus=2, max_gpus=4, size=4,
                             time_limit_minutes=60, state=State.RUNNING, started_at=start)
    JobEvent.objects.create(job=job, state=State.RUNNING, gpus=2)
    JobEvent.objects.create(job=job, message="grew to 4 GPUs", gpus=4)
    JobEvent.objects.filter(job=job, gpus=2).update(ts=start)
    JobEvent.objects.filter(job=job, gpus=4).update(ts=start + timedelta(seconds=60))
    end = start + timedelta(seconds=120)
    assert accounting.job_gpu_seconds(job, now=end) == pytest.approx(360)
    Job.objects.filter(pk=job.pk).update(state=State.SUCCEEDED, finished_at=end)
    job = reload(job)
    assert accounting.job_gpu_seconds(job) == pytest.approx(360)
    usage = accounting.daily_usage(timezone.localdate(start), timezone.localdate(end))
    assert sum(usage.values()) == pytest.approx(360)
    window = quotas.QuotaBook(users=[alice.pk])
    scope, _ = window.constraints(alice.pk, "alice", None, "", "local")[0]
    assert window.use(scope, hours=True).gpu_seconds == pytest.approx(360)


def test_the_end_of_an_elastic_job_records_the_gpu_seconds_of_its_sizes(alice, bob, image, script, four):
    job, blocker = elastic_beside(alice, bob, script)
    end(blocker)
    scheduler.admit()
    start = timezone.now() - timedelta(seconds=120)
    Job.objects.filter(pk=job.pk).update(started_at=start)
    JobEvent.objects.filter(job=job, state=State.RUNNING).update(ts=start)
    JobEvent.objects.filter(job=job, message__startswith="grew").update(ts=start + timedelta(seconds=60))
    states.transition(job.pk, State.SUCCEEDED)
    assert reload(job).gpu_seconds == pytest.approx(2 * 60 + 4 * 60, rel=0.02)


@pytest.mark.parametrize("most, error", [
    (1, "Most GPUs must be at least GPUs (2)."),
    (5, "This machine runs at most 4 processes per job."),
])
def test_a_bad_maximum_is_a_400_naming_max_gpus(alice, image, script, four, most, error):
    response = submit(alice, script, 2, max_gpus=most)
    assert response.status_code == 400
    assert response.json() == {"max_gpus": [error]}


def test_a_maximum_equal_to_the_minimum_is_a_fixed_job(alice, image, script, four):
    response = submit(alice, script, 2, max_gpus=2)
    assert response.status_code == 201 and response.json()["max_gpus"] is None


def test_horovodrun_runs_an_elastic_job_with_bounds_and_the_discovery_script(tmp_path):
    spec = JobSpec(job_id=7, gpus=3, python="python", script_name="t.py", script_content="", script_path=None,
                   min_gpus=2, max_gpus=4)
    argv, files = LocalRunner(tmp_path).command(spec)
    assert files == {}
    assert "-H" not in argv
    joined = " ".join(argv)
    assert ("-np 3 --min-np 2 --max-np 4 --host-discovery-script ./discover_hosts.sh "
            "--blacklist-cooldown-range 10 60 --network-interface lo") in joined   # a healed host is let back in
    fixed = " ".join(LocalRunner(tmp_path).command(JobSpec(job_id=7, gpus=3, python="python", script_name="t.py",
                                                           script_content="", script_path=None))[0])
    assert "-np 3 -H localhost:3" in fixed and "--min-np" not in fixed


def test_on_a_cluster_with_a_gpu_limit_a_job_grows_and_shrinks_by_whole_workers(alice, bob, script):
    """2..6 GPUs on 2-GPU nodes: workers of 2. Beside a 2-GPU job within a limit of 7, it grows to
    4, not 5; a queued job that needs 1 GPU takes a whole worker from it."""
    from jobs.backends.kubernetes.models import Cluster
    from jobs.models import Image

    cluster = Cluster.objects.create(name="fake", namespace="team-a", gpus_per_node=2, gpu_limit=7)
    Image.objects.create(name="horovod-k8s", container_image="registry.example/horovod:0.28.1", python="python")
    k8s = {"image": "horovod-k8s", "backend": "kubernetes", "cluster": cluster.name}
    blocker = submitted(bob, script, 2, **k8s)
    assert scheduler.admit() == [blocker.pk]
    running(blocker)
    job = submitted(alice, script, 2, max_gpus=6, **k8s)
    assert scheduler.admit() == [job.pk]
    assert reload(job).size == 4
    assert size_events(job) == [(4, "grew to 4 GPUs: 2 GPUs free on cluster fake")]
    running(job)
    small = submitted(bob, script, 1, **k8s)
    assert scheduler.admit() == [small.pk]           # 2 + 4 + 1 = 7 fit: admitted without a shrink
    assert reload(job).size == 4
    running(small)
    more = submitted(bob, script, 1, **k8s)
    assert scheduler.admit() == [more.pk]
    assert reload(job).size == 2 and size_events(job)[-1] == (2, f"shrank to 2 GPUs for job {more.pk}")


def test_the_portal_resizes_no_job_that_kueue_admitted_and_no_job_of_another_cluster(alice, bob, script):
    """Kueue would stop and requeue an MPIJob whose workers change: a job labelled for a Kueue
    queue keeps its size on a cluster with room. A queued job shrinks only jobs of its own
    cluster: GPUs given back elsewhere would not make it fit."""
    from jobs.backends import get
    from jobs.backends.kubernetes.models import Cluster, QueueMapping
    from jobs.models import Image

    kueue = Cluster.objects.create(name="kueue", namespace="team-a", gpus_per_node=2, gpu_limit=8,
                                   kueue_found=True)
    other = Cluster.objects.create(name="other", namespace="team-a", gpus_per_node=2, gpu_limit=4)
    Image.objects.create(name="horovod-k8s", container_image="registry.example/horovod:0.28.1", python="python")
    QueueMapping.objects.create(cluster=kueue, user=alice, queue="alice-queue")
    on = {"image": "horovod-k8s", "backend": "kubernetes"}
    under_kueue = submitted(alice, script, 2, max_gpus=6, cluster=kueue.name, **on)
    assert scheduler.admit() == [under_kueue.pk]
    assert reload(under_kueue).size == 2 and size_events(under_kueue) == []     # 6 GPUs free: left alone
    assert JobEvent.objects.filter(job=under_kueue).last().message == (
        "runs at 2 GPUs, its minimum, in Kueue queue alice-queue on cluster kueue; Kueue decides when it runs and "
        "resizes no MPIJob (its workload slices cover batch Jobs, Ray and Spark)")
    running(under_kueue)
    bobs = submitted(bob, script, 2, max_gpus=6, cluster=kueue.name, **on)          # bob has no Kueue queue there
    assert scheduler.admit() == [bobs.pk] and reload(bobs).size == 6
    running(bobs)
    grown = submitted(bob, script, 2, max_gpus=4, cluster=other.name, **on)         # the newest: shrunk first
    assert scheduler.admit() == [grown.pk] and reload(grown).size == 4
    running(grown)
    waiting = submitted(bob, script, 2, cluster=kueue.name, **on)                  # 2 + 6 of 8 in use
    assert scheduler.admit() == [waiting.pk]
    assert reload(bobs).size == 4 and size_events(bobs)[-1] == (4, f"shrank to 4 GPUs for job {waiting.pk}")
    assert [size for size, _ in size_events(grown)] == [4, 4]                   # the other cluster's job kept its GPUs
    assert reload(under_kueue).size == 2
    help_text = str(get("kubernetes").page_fields()["cluster"].help_text)
    assert ("kueue: for the users and groups given a Kueue queue, an elastic job runs at its minimum size; Kueue "
            "decides when it runs") in help_text
    assert "other: an elastic job grows and shrinks a worker at a time, within 4 GPUs." in help_text
