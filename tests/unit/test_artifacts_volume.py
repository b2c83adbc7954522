"""A cluster's artifacts volume (issue 44, part 4): the MPIJob's workers and the TrainJob's nodes
mount the PersistentVolumeClaim the admin names at RINGMASTER_OUTPUT_DIR, each job under a
sub-path of its own name, and both still pass their CRD schemas (runners.mpijob/trainjob.build)."""
import pytest

from runners import mpijob, trainjob
from runners.base import JobSpec

MOUNT = {"name": "artifacts", "mountPath": mpijob.OUTPUT_MOUNT, "subPath": "rm-abc-7"}
VOLUME = {"name": "artifacts", "persistentVolumeClaim": {"claimName": "ringmaster-artifacts"}}


def spec(launcher, **more):
    return JobSpec(job_id=7, gpus=4, python="python", script_name="train.py", script_content="print(1)\n",
                   script_path=None, container_image="registry.example/torch:2.13", launcher=launcher,
                   installation="abc", **more)


def env_of(container):
    return {e["name"]: e["value"] for e in container.get("env", [])}


@pytest.mark.parametrize("command", ["mpirun", "horovodrun"])
def test_the_mpijobs_ranks_write_to_their_own_part_of_the_clusters_volume(command):
    cluster = mpijob.ClusterSpec(namespace="ns", gpus_per_node=2, artifacts_volume="ringmaster-artifacts",
                                 mpijob_command=command)
    job, _ = mpijob.build(spec("horovod"), cluster)
    replicas = job["spec"]["mpiReplicaSpecs"]
    worker = replicas["Worker"]["template"]["spec"]
    assert VOLUME in worker["volumes"] and MOUNT in worker["containers"][0]["volumeMounts"]
    launcher = replicas["Launcher"]["template"]["spec"]["containers"][0]
    assert env_of(launcher)["RINGMASTER_OUTPUT_DIR"] == mpijob.OUTPUT_MOUNT
    if command == "mpirun":                    # forwarded to the ranks by name
        assert "RINGMASTER_OUTPUT_DIR" in launcher["command"]


def test_the_trainjobs_nodes_mount_it_and_without_a_volume_nothing_is_added():
    cluster = mpijob.ClusterSpec(namespace="ns", gpus_per_node=2, artifacts_volume="ringmaster-artifacts")
    job, _ = trainjob.build(spec("torchrun"), cluster)
    (patch,) = job["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]["spec"]
    assert VOLUME in pod["volumes"] and MOUNT in pod["containers"][0]["volumeMounts"]
    assert env_of(job["spec"]["trainer"])["RINGMASTER_OUTPUT_DIR"] == mpijob.OUTPUT_MOUNT

    plain, _ = trainjob.build(spec("torchrun"), mpijob.ClusterSpec(namespace="ns", gpus_per_node=2))
    assert "RINGMASTER_OUTPUT_DIR" not in env_of(plain["spec"]["trainer"])
    assert "artifacts" not in str(plain["spec"]["runtimePatches"])
