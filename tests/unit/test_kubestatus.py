"""Reading MPIJob conditions, pod trouble and the launcher's timestamped log (runners.kubestatus)."""
from datetime import datetime, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from runners import kubestatus
from runners.kubestatus import LogCursor, LogReader


def mpijob(*conditions):
    return {"status": {"conditions": [
        {"type": kind, "status": status, "reason": reason, "message": message}
        for kind, status, reason, message in conditions]}}


def test_conditions_map_to_running_and_the_end_with_reason_and_message():
    created = mpijob(("Created", "True", "MPIJobCreated", ""))
    assert not kubestatus.is_running(created) and kubestatus.outcome(created) is None
    running = mpijob(("Created", "True", "", ""), ("Running", "True", "MPIJobRunning", ""))
    assert kubestatus.is_running(running) and kubestatus.outcome(running) is None
    done = mpijob(("Running", "False", "", ""), ("Succeeded", "True", "MPIJobSucceeded", "MPIJob team/x successfully completed."))
    assert kubestatus.outcome(done) == kubestatus.Outcome(True, "MPIJob team/x successfully completed.")
    failed = mpijob(("Failed", "True", "BackoffLimitExceeded", "Job has reached the specified backoff limit"))
    assert kubestatus.outcome(failed) == kubestatus.Outcome(
        False, "MPIJob failed: BackoffLimitExceeded: Job has reached the specified backoff limit")
    assert kubestatus.outcome(mpijob(("Failed", "False", "x", "y"))) is None


def pod(name, role="worker", **status):
    return {"metadata": {"name": name, "labels": {"training.kubeflow.org/job-role": role}},
            "spec": {"containers": [{"name": "worker", "resources": {"limits": {"memory": "16Gi"}}}]},
            "status": status}


def test_unschedulable_pods_say_why():
    pods = [pod("j-worker-0", phase="Pending", conditions=[{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}])]
    assert kubestatus.pod_trouble(pods).waiting == \
        "not schedulable yet: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."


def test_image_pull_errors_are_reported_with_the_image():
    pods = [pod("j-worker-0", phase="Pending", containerStatuses=[{
        "name": "worker", "image": "reg/x:1", "state": {"waiting": {
            "reason": "ImagePullBackOff", "message": 'Back-off pulling image "reg/x:1"'}}}])]
    trouble = kubestatus.pod_trouble(pods)
    assert trouble.pull_error == 'cannot pull image reg/x:1: Back-off pulling image "reg/x:1"'
    assert trouble.waiting.startswith("waiting for the image: cannot pull image reg/x:1")


def test_oomkilled_and_evicted_pods_become_notes():
    pods = [
        pod("j-worker-1", phase="Failed", containerStatuses=[{
            "name": "worker", "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]),
        pod("j-worker-2", phase="Failed", reason="Evicted", message="The node was low on resource: memory."),
    ]
    assert kubestatus.pod_trouble(pods).notes == [
        "worker in pod j-worker-1 was OOMKilled (memory limit 16Gi)",
        "pod j-worker-2 was evicted: The node was low on resource: memory.",
    ]


def test_the_operators_validation_error_event_is_found():
    events = [{"reason": "MPIJobCreated", "message": "x"},
              {"reason": "ValidationError", "type": "Warning", "message": "spec.mpiReplicaSpecs[Launcher].replicas: must be 1"}]
    assert kubestatus.validation_error(events) == "spec.mpiReplicaSpecs[Launcher].replicas: must be 1"
    assert kubestatus.validation_error(events[:1]) is None


def test_launcher_pods_oldest_first_and_their_exit_code():
    first = pod("j-launcher-b", role="launcher", phase="Failed",
                containerStatuses=[{"name": "launcher", "state": {"terminated": {"exitCode": 3}}}])
    first["metadata"]["creationTimestamp"] = "2026-11-23T10:00:00Z"
    second = pod("j-launcher-a", role="launcher", phase="Running")
    second["metadata"]["creationTimestamp"] = "2026-11-23T10:00:05Z"
    assert [p["metadata"]["name"] for p in kubestatus.launcher_pods([second, pod("w"), first])] == \
        ["j-launcher-b", "j-launcher-a"]
    assert kubestatus.exit_code(first) == 3 and kubestatus.exit_code(second) is None


def test_timestamps_parse_with_trimmed_nanoseconds():
    at = int(datetime(2026, 11, 23, 13, 39, 8, tzinfo=timezone.utc).timestamp())
    assert kubestatus.parse_log_timestamp(b"2026-11-23T13:39:08.123456789Z") == (at, 123456789)
    assert kubestatus.parse_log_timestamp(b"2026-11-23T13:39:08.5Z") == (at, 500000000)
    assert kubestatus.parse_log_timestamp(b"2026-11-23T13:39:08Z") == (at, 0)
    assert kubestatus.parse_log_timestamp(b"[1,0]<stdout>:x") is None


def stamped(lines):
    return b"".join(f"2026-11-23T13:39:{second:02d}.{nanos:09d}Z {text}\n".encode()
                    for second, nanos, text in lines)


def test_a_stream_cut_mid_line_resumes_without_loss_or_repeat():
    lines = [(1, 0, "[1,0]<stdout>:a"), (1, 0, "[1,1]<stdout>:b"), (2, 5, "[1,0]<stdout>:c"), (3, 0, "end")]
    log = stamped(lines)
    cursor = LogCursor(pod="p")
    first = LogReader(cursor)
    cut = log.index(b"[1,0]<stdout>:c") + 4          # inside the third line
    taken = first.feed(log[:cut])
    assert taken == b"[1,0]<stdout>:a\n[1,1]<stdout>:b\n"
    resumed = LogCursor.from_json(cursor.to_json())      # as stored with the batch
    assert resumed.same == 2                              # two lines shared that timestamp
    second = LogReader(resumed)
    taken += second.feed(log)                             # the server sends from an earlier time
    assert taken == b"[1,0]<stdout>:a\n[1,1]<stdout>:b\n[1,0]<stdout>:c\nend\n"


def test_a_final_line_without_newline_is_taken_when_the_container_ended():
    reader = LogReader(LogCursor(pod="p"))
    assert reader.feed(b"2026-11-23T13:39:01Z done") == b""
    assert reader.finish() == b"done\n"


@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0, 7]), st.text(
    alphabet=st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)), max_size=12)),
    max_size=30).map(sorted), st.lists(st.integers(0, 2000), max_size=6))
@settings(max_examples=300, deadline=None)
def test_any_cuts_and_resumes_give_every_line_once(lines, cuts):
    log = stamped(lines)
    expected = b"".join(f"{text}\n".encode() for _, _, text in lines)
    cursor, taken = LogCursor(pod="p"), b""
    for cut in sorted(cuts):                   # each connection is cut; the next resumes from the stored cursor
        cursor = LogCursor.from_json(cursor.to_json())
        taken += LogReader(cursor).feed(log[:cut])
    final = LogReader(LogCursor.from_json(cursor.to_json()))
    taken += final.feed(log) + final.finish()
    assert taken == expected


# --- observe(): what was seen -> what the follower tells and does -------------------------------

from runners.base import Exited, Running, Status  # noqa: E402

GRACE, DRAIN = 300, 30
RUNNING = mpijob(("Created", "True", "", ""), ("Running", "True", "MPIJobRunning", ""))
SUCCEEDED = mpijob(("Succeeded", "True", "MPIJobSucceeded", "MPIJob team/x successfully completed."))
FAILED = mpijob(("Failed", "True", "BackoffLimitExceeded", "Job has reached the specified backoff limit"))
PULL = {"containerStatuses": [{"name": "worker", "image": "nope:1", "state": {
    "waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]}
UNSCHEDULABLE = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                     "reason": "Unschedulable", "message": "no GPUs"}]}


def look(before, now, job=None, pods=(), events=(), polled=True, drained=False, deleted=False):
    return kubestatus.observe(before, kubestatus.Seen(mpijob=job, deleted=deleted, pods=tuple(pods),
                                                      events=tuple(events), polled=polled, drained=drained,
                                                      now=now), GRACE, DRAIN)


def test_observe_tells_running_once_with_the_workers_counted():
    first = look(kubestatus.Observation(), 0, RUNNING, [pod("j-worker-0"), pod("j-worker-1"), pod("j-l", "launcher")])
    assert first.tell == (Running("MPIJob running (2 workers)"),) and not first.done
    again = look(first.observation, 1, RUNNING)
    assert again.tell == () and again.observation.running_told


def test_observe_tells_a_waiting_reason_only_when_it_changes():
    waiting = look(kubestatus.Observation(), 0, None, [pod("j-worker-0", **UNSCHEDULABLE)])
    assert waiting.tell == (Status("not schedulable yet: no GPUs"),)
    same = look(waiting.observation, 2, None, [pod("j-worker-0", **UNSCHEDULABLE)])
    assert same.tell == ()
    cleared = look(same.observation, 4, None, [pod("j-worker-0", phase="Running")])
    assert cleared.tell == (Status(""),)
    quiet = look(cleared.observation, 6, None, [pod("j-worker-0", phase="Running")])
    assert quiet.tell == ()
    unpolled = look(kubestatus.Observation(), 0, None, [pod("j-worker-0", **UNSCHEDULABLE)], polled=False)
    assert unpolled.tell == ()                                 # pods are judged when they were read


def test_a_rejected_mpijob_is_deleted_and_ends_the_follow():
    events = [{"type": "Warning", "reason": "ValidationError", "message": "MPIJob.kubeflow.org is invalid: x"}]
    decision = look(kubestatus.Observation(), 0, None, events=events)
    assert decision.delete and decision.done
    assert decision.tell == (Exited(None, "the MPI operator rejected the MPIJob: MPIJob.kubeflow.org is invalid: x"),)


def test_an_image_that_cannot_be_pulled_fails_only_after_the_grace_and_the_clock_resets():
    pulling = [pod("j-worker-0", **PULL)]
    first = look(kubestatus.Observation(), 100, None, pulling)
    assert not first.done and first.observation.pull_since == 100
    assert first.tell == (Status("waiting for the image: cannot pull image nope:1: Back-off pulling image"),)
    cleared = look(first.observation, 200, None, [pod("j-worker-0", phase="Running")])
    assert cleared.observation.pull_since is None                                  # the error went away
    again = look(cleared.observation, 300, None, pulling)
    assert not look(again.observation, 300 + GRACE - 1, None, pulling).done
    late = look(again.observation, 300 + GRACE, None, pulling)
    assert late.delete and late.done
    assert late.tell == (Exited(None, "image pull failed for 300 s: cannot pull image nope:1: Back-off pulling image"),)
    running = look(kubestatus.Observation(running_told=True, pull_since=0), GRACE * 2, RUNNING, pulling)
    assert not running.done                                     # a running job is not failed for a pull


def test_the_end_waits_for_the_log_to_drain_or_the_drain_time():
    ended = look(kubestatus.Observation(running_told=True), 10, SUCCEEDED, polled=False)
    assert not ended.done and ended.observation.ended_at == 10
    drained = look(ended.observation, 11, SUCCEEDED, polled=False, drained=True)
    assert drained.done and drained.tell == (Exited(0, "MPIJob team/x successfully completed."),)
    late = look(ended.observation, 10 + DRAIN + 1, SUCCEEDED, polled=False)
    assert late.done and late.tell == (
        Exited(0, "MPIJob team/x successfully completed. (the launcher's log may be incomplete)"),)


def test_a_failure_carries_the_launchers_exit_code_and_what_the_pods_showed():
    oom = pod("j-worker-1", containerStatuses=[{"name": "worker", "state": {"terminated": {"reason": "OOMKilled"}}}])
    launcher = pod("j-launcher", "launcher", containerStatuses=[
        {"name": "launcher", "state": {"terminated": {"exitCode": 137}}}])
    seen = look(kubestatus.Observation(running_told=True), 5, RUNNING, [oom, launcher])
    assert seen.observation.last_code == 137
    assert seen.tell == (Status("worker in pod j-worker-1 was OOMKilled (memory limit 16Gi)"),)
    end = look(seen.observation, 6, FAILED, polled=False, drained=True)
    assert end.tell == (Exited(137, "MPIJob failed: BackoffLimitExceeded: Job has reached the specified backoff limit",
                               cause="worker in pod j-worker-1 was OOMKilled (memory limit 16Gi)"),)


def test_an_mpijob_deleted_behind_the_portals_back_ends_the_follow_saying_so():
    decision = look(kubestatus.Observation(running_told=True), 0, RUNNING, polled=False, deleted=True, drained=True)
    assert decision.done and decision.tell == (Exited(None, "the MPIJob was deleted outside Ringmaster"),)


# --- elastic jobs: a worker lost while the launcher runs on -------------------------------------

EVICTING = mpijob(("Created", "True", "", ""), ("Running", "False", "MPIJobRunning", ""),
                  ("Failed", "True", "MPIJobEvicted", "1/2 workers are evicted"))


def gpu_worker(name, gpus=2, **status):
    item = pod(name, **status)
    item["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = gpus
    return item


def test_an_eviction_ends_the_mpijob_only_once_the_launcher_has_ended():
    """mpi-operator sets Failed (MPIJobEvicted) as soon as a worker is evicted, while the launcher
    runs on; it fills completionTime when the launcher ends."""
    assert kubestatus.outcome(EVICTING) is None
    ended = {"status": dict(EVICTING["status"], completionTime="2026-11-26T10:00:00Z")}
    assert kubestatus.outcome(ended) == kubestatus.Outcome(False, "MPIJob failed: MPIJobEvicted: 1/2 workers are evicted")


def look_elastic(before, pods, minimum, job=EVICTING):
    return kubestatus.observe(before, kubestatus.Seen(mpijob=job, deleted=False, pods=tuple(pods), polled=True,
                                                      now=5, min_gpus=minimum), GRACE, DRAIN)


EVICTED = {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}


def test_an_elastic_jobs_evicted_worker_is_replaced_and_the_job_goes_on_saying_so():
    running = kubestatus.Observation(running_told=True)
    pods = [gpu_worker("j-worker-0", phase="Running"), gpu_worker("j-worker-1", **EVICTED),
            gpu_worker("j-worker-2", phase="Running"), pod("j-launcher-x", "launcher", phase="Running")]
    seen = look_elastic(running, pods, minimum=2)
    message = ("lost j-worker-1 (evicted: The node was low on resource: memory.): "
               "continuing on 4 GPUs while Kubernetes replaces it")
    assert seen.replace == ("j-worker-1",) and not seen.done and not seen.delete
    assert seen.tell == (Status(message),)
    below = look_elastic(running, pods, minimum=6)
    assert below.replace == ("j-worker-1",)
    assert below.tell == (Status("lost j-worker-1 (evicted: The node was low on resource: memory.): 4 GPUs left, "
                                 "fewer than the 6 the job needs: Horovod waits for its replacement"),)


def test_a_job_of_one_size_and_a_worker_being_deleted_are_not_lost_workers():
    running = kubestatus.Observation(running_told=True)
    pods = [gpu_worker("j-worker-0", phase="Running"), gpu_worker("j-worker-1", **EVICTED)]
    fixed = look_elastic(running, pods, minimum=None)
    assert fixed.replace == () and fixed.tell == (Status("pod j-worker-1 was evicted: The node was low on resource: "
                                                         "memory."),)
    deleting = gpu_worker("j-worker-1", **EVICTED)
    deleting["metadata"]["deletionTimestamp"] = "2026-11-26T10:00:00Z"
    assert look_elastic(running, [deleting], minimum=1).replace == ()
    ended = {"status": dict(EVICTING["status"], completionTime="2026-11-26T10:00:00Z")}
    assert look_elastic(running, pods, minimum=1, job=ended).replace == ()
