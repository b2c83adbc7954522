"""Kueue's view of a job in words (runners.kueuestatus), and what the follow tells when Kueue
holds, preempts and re-admits a job (runners.kubestatus.observe with a QueueView)."""
from runners import kubestatus
from runners.base import Requeued, Running, Status
from runners.kueue import QueueView
from runners.kueuestatus import eviction, waiting

SHORT = ("couldn't assign flavors to pod set worker: insufficient unused quota for nvidia.com/gpu in flavor "
         "default-flavor, 8 more needed")
PREEMPTED = ("Preempted to accommodate a workload (UID: u1, JobUID: j1) due to prioritization in the ClusterQueue")


def workload(*conditions, gpus=8, workers=1):
    pod_sets = [{"name": "launcher", "count": 1, "template": {"spec": {"containers": [{"name": "launcher"}]}}},
                {"name": "worker", "count": workers, "template": {"spec": {"containers": [
                    {"name": "worker", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}}]
    return {"metadata": {"name": "mpijob-x-1a2b3"}, "spec": {"queueName": "team-queue", "podSets": pod_sets},
            "status": {"conditions": [{"type": t, "status": s, "reason": r, "message": m}
                                      for t, s, r, m in conditions]}}


def view(wl, position=None, pending=None, cluster_queue="cluster-queue"):
    return QueueView("team-queue", wl, cluster_queue, position, pending)


def test_a_held_job_says_which_clusterqueue_resource_asked_free_and_position():
    held = workload(("QuotaReserved", "False", "Pending", SHORT), workers=2)
    assert str(waiting(view(held, position=3))) == (
        "waiting in Kueue: ClusterQueue cluster-queue has 8 nvidia.com/gpu free in flavor default-flavor, "
        "the job asks for 16; position 3 in ClusterQueue cluster-queue")
    assert str(waiting(view(held, pending=4))).endswith("; 4 workloads pending in LocalQueue team-queue")
    assert str(waiting(view(held))).endswith("the job asks for 16")


def test_a_job_larger_than_the_whole_quota_and_other_holds_keep_kueues_words():
    too_big = workload(("QuotaReserved", "False", "Pending", "couldn't assign flavors to pod set worker: "
                        "insufficient quota for nvidia.com/gpu in flavor default-flavor, request > maximum "
                        "capacity (64 > 16)"), gpus=8, workers=8)
    assert str(waiting(view(too_big))) == ("waiting in Kueue: the job asks for 64 nvidia.com/gpu, more than "
                                           "ClusterQueue cluster-queue has in flavor default-flavor")
    missing = workload(("QuotaReserved", "False", "Inadmissible", "LocalQueue team-queue doesn't exist"))
    assert str(waiting(view(missing, cluster_queue=""))) == \
        "waiting in Kueue (LocalQueue team-queue): LocalQueue team-queue doesn't exist"
    assert str(waiting(view(None))) == "waiting for Kueue to queue the job in LocalQueue team-queue"
    assert str(waiting(view(workload(("QuotaReserved", "True", "QuotaReserved", ""))))) == \
        "quota reserved in ClusterQueue cluster-queue: waiting for Kueue's admission checks"
    assert str(waiting(view(workload(("QuotaReserved", "True", "", ""), ("Admitted", "True", "Admitted", ""))))) == ""


def test_a_preemption_is_named_with_kueues_reason_and_stays_in_the_wait_until_readmitted():
    preempted = workload(("Evicted", "True", "Preempted", PREEMPTED),
                         ("Preempted", "True", "InClusterQueue", PREEMPTED), ("QuotaReserved", "False", "Pending", SHORT))
    assert eviction(view(preempted)) == f"preempted by Kueue (InClusterQueue): {PREEMPTED}"
    assert str(waiting(view(preempted, position=1))).startswith(
        f"preempted by Kueue (InClusterQueue): {PREEMPTED}; waiting in Kueue: ClusterQueue cluster-queue has 0")
    evicted = workload(("Evicted", "True", "PodsReadyTimeout", "Exceeded the PodsReady timeout"))
    assert eviction(view(evicted)) == "evicted by Kueue (PodsReadyTimeout): Exceeded the PodsReady timeout"
    readmitted = workload(("Evicted", "False", "QuotaReserved", f"Previously: {PREEMPTED}"),
                          ("Admitted", "True", "Admitted", ""))
    assert eviction(view(readmitted)) == "" and eviction(None) == ""


def mpijob(suspend, running):
    conditions = [{"type": "Running", "status": "True" if running else "False", "reason": "", "message": ""}]
    return {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "team-queue"}},
            "spec": {"runPolicy": {"suspend": suspend}}, "status": {"conditions": conditions}}


def look(before, job, queue, now):
    return kubestatus.observe(before, kubestatus.Seen(mpijob=job, deleted=False, polled=True, now=now, queue=queue),
                              300, 30)


def test_the_follow_tells_kueues_wait_then_running_then_requeued_then_running_again():
    held = view(workload(("QuotaReserved", "False", "Pending", SHORT)), position=1)
    first = look(kubestatus.Observation(), mpijob(True, False), held, 0)
    assert first.tell == (Status(waiting(held).words, "; position 1 in ClusterQueue cluster-queue"),)
    moved = look(first.observation, mpijob(True, False), view(held.workload, position=2), 0.5)
    assert moved.tell == (Status(waiting(held).words, "; position 2 in ClusterQueue cluster-queue"),)
    same = look(moved.observation, mpijob(True, False), view(held.workload, position=2), 0.7)
    assert same.tell == ()
    running = look(same.observation, mpijob(False, True), held, 1)
    assert [type(e) for e in running.tell] == [Status, Running] and running.tell[0] == Status("")
    preempted = view(workload(("Evicted", "True", "Preempted", PREEMPTED), ("Preempted", "True", "InClusterQueue",
                                                                           PREEMPTED),
                              ("QuotaReserved", "False", "Pending", SHORT)), position=1)
    # The operator has not yet said the job stopped running: a suspended job is not running.
    stopped = look(running.observation, mpijob(True, True), preempted, 2)
    assert stopped.tell[0] == Requeued(f"preempted by Kueue (InClusterQueue): {PREEMPTED}")
    assert stopped.tell[1] == Status(waiting(preempted).words, waiting(preempted).place) and len(stopped.tell) == 2
    again = look(stopped.observation, mpijob(False, True), preempted, 3)
    assert [type(e) for e in again.tell] == [Status, Running] and not again.done


def test_a_suspended_running_job_is_requeued_even_where_kueues_objects_cannot_be_read():
    running = look(kubestatus.Observation(), mpijob(False, True), None, 0)
    assert [type(e) for e in running.tell] == [Running]
    stopped = look(running.observation, mpijob(True, False), None, 1)
    assert stopped.tell == (Requeued("suspended by Kueue"),)
