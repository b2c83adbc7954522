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
