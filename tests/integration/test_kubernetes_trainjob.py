"""A torchrun job on the Kubernetes backend as a Kubeflow Trainer TrainJob: the runner, with the
real `kubernetes` client over HTTP, against the fake API server playing Trainer, JobSet and the
kubelet (tests/fakekube)."""
import os
import subprocess
import sys
import threading
import time

import kubernetes
import pytest

from runners import mpijob, projects, trainjob
from runners.base import Exited, Output, Running, waited
from runners.kubernetes import KubernetesRunner, Timings
from runners.output import OutputSplitter, first_rank_failure
from tests.fakekube import Scenario
from tests.integration.test_kubernetes import fake  # noqa: F401 (the fake API server)
from tests.unit.test_trainjob import spec as torch_spec

pytestmark = pytest.mark.integration
NS = "team-a"
FAST = Timings(poll_seconds=0.2, drain_seconds=5, cancel_seconds=10, request_seconds=5)


@pytest.fixture
def runner(fake, tmp_path):
    fake.scenario = Scenario()
    path = fake.write_kubeconfig(tmp_path / "kubeconfig", namespace=NS)
    api = kubernetes.config.new_client_from_config(config_file=str(path))
    yield KubernetesRunner(api, mpijob.ClusterSpec(namespace=NS, gpus_per_node=2), FAST)
    api.close()


def spec(job_id, gpus=4):
    return torch_spec(job_id=job_id, gpus=gpus, installation="tj", time_limit_seconds=600)


def follow(runner, job):
    """(every event but Waiting, the lines of the output) of one follow to its end."""
    told, splitter, lines = [], OutputSplitter(), []
    for event in waited(runner.follow(job, 0)):
        if isinstance(event, Output):
            lines += splitter.feed(event.data)
        elif type(event).__name__ != "Waiting":
            told.append(event)
        if isinstance(event, Exited):
            return told, lines
    raise AssertionError("the follow ended without Exited")


def test_a_four_gpu_torchrun_job_is_two_nodes_that_run_to_complete_with_every_ranks_lines(fake, runner):  # noqa: F811
    job = spec(41)
    started = runner.launch(job)
    assert started.detail.startswith(f"created the TrainJob {NS}/{job.name}")
    told, lines = follow(runner, job)
    assert isinstance(told[0], Running) and told[-1] == Exited(0, "jobset completed successfully")
    ranked = sorted((line.rank, line.text) for line in lines)
    assert ranked == sorted((rank, f"step {step} rank {rank}") for rank in range(4) for step in (1, 2, 3))
    stored = fake.trainjob(NS, job.name)
    assert (stored["spec"]["trainer"]["numNodes"], stored["spec"]["trainer"]["numProcPerNode"]) == (2, 2)
    assert {c["type"] for c in stored["status"]["conditions"] if c["status"] == "True"} >= {"Created", "Complete"}
    pods = fake.node_pods(NS, job.name)
    assert [p["metadata"]["name"].rsplit("-", 1)[0] for p in pods] == [f"{job.name}-node-0-0", f"{job.name}-node-0-1"]
    env = {e["name"] for e in pods[0]["spec"]["containers"][0]["env"]}
    assert {"PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "RINGMASTER_PREFIX_OUTPUT"} <= env


def test_a_sixteen_gpu_job_on_eight_gpu_nodes_is_two_nodes_of_eight_that_run_to_complete(fake, runner):  # noqa: F811
    runner.cluster = mpijob.ClusterSpec(namespace=NS, gpus_per_node=8)
    job = spec(46, gpus=16)
    runner.launch(job)
    told, lines = follow(runner, job)
    assert told[-1] == Exited(0, "jobset completed successfully")
    stored = fake.trainjob(NS, job.name)             # the fake validated it against the CRD on create
    assert (stored["spec"]["trainer"]["numNodes"], stored["spec"]["trainer"]["numProcPerNode"]) == (2, 8)
    assert stored["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] in (8, "8")
    assert sorted({line.rank for line in lines if line.rank is not None}) == list(range(16))


def test_a_failed_rank_fails_the_trainjob_and_is_named_with_its_exit_code(fake, runner):  # noqa: F811
    job = spec(42)
    fake.scenarios[job.name] = Scenario(failed_rank=3)
    runner.launch(job)
    told, lines = follow(runner, job)
    end = told[-1]
    assert end.code == 1 and "TrainJob failed: FailedJobs" in end.detail
    assert first_rank_failure([line.text for line in lines if line.rank is None]) == (3, 1)
    assert (3, "RuntimeError: rank 3 broke") in [(line.rank, line.text) for line in lines]


def test_cancel_deletes_the_trainjob_its_pods_and_its_configmap(fake, runner):  # noqa: F811
    job = spec(43)
    hold = __import__("threading").Event()
    fake.scenarios[job.name] = Scenario(hold=hold)
    try:
        runner.launch(job)
        fake.wait_for(lambda: len([p for p in fake.node_pods(NS, job.name) if p["status"]["phase"] == "Running"]) == 2,
                      30, "both nodes to run")
        runner.cancel(job)
    finally:
        hold.set()
    assert fake.trainjob(NS, job.name) is None
    assert fake.node_pods(NS, job.name) == []
    assert not [c for c in fake.configmaps(NS) if c["metadata"]["name"] == f"{job.name}-script"]


def test_a_cluster_without_the_runtime_refuses_the_trainjob_saying_so(fake, runner):  # noqa: F811
    job = spec(44)
    runner.cluster = mpijob.ClusterSpec(namespace=NS, gpus_per_node=2, training_runtime="torch-missing")
    with pytest.raises(Exception, match="torch-missing"):
        runner.launch(job)
    assert fake.trainjob(NS, job.name) is None


def test_every_nodes_lines_come_while_the_nodes_run_and_a_new_follower_resumes_each_pod(fake, runner):  # noqa: F811
    hold = threading.Event()                 # the nodes print their first step, then wait for this
    fake.scenario = Scenario(hold=hold)
    job = spec(45)
    runner.launch(job)
    splitter, lines, cursor, offset = OutputSplitter(), [], None, 0
    deadline = time.monotonic() + 60
    follow_events = waited(runner.follow(job, 0))
    try:
        for event in follow_events:
            if isinstance(event, Output):
                lines += splitter.feed(event.data)
                cursor, offset = event.cursor, event.offset + len(event.data)
            if {line.rank for line in lines} == {0, 1, 2, 3} or time.monotonic() > deadline:
                break
    finally:
        follow_events.close()
    # Node 1's ranks (2 and 3) are read while node 0 still runs: no node waits for another's end.
    assert sorted((line.rank, line.text) for line in lines) == [(r, f"step 1 rank {r}") for r in range(4)]
    hold.set()
    told, rest = [], []
    for event in waited(runner.follow(job, offset, cursor)):   # a new follower, at the stored cursor
        if isinstance(event, Output):
            rest += splitter.feed(event.data)
        elif isinstance(event, Exited):
            told.append(event)
            break
    assert told == [Exited(0, "jobset completed successfully")]
    assert sorted((line.rank, line.text) for line in rest) == \
        sorted((r, f"step {step} rank {r}") for r in range(4) for step in (2, 3))


# Prints what PROJECT's train.py prints, without torch: the fake runs no torchrun to start it under.
WHERE = """import json, os
from datautils import batch

rank = int(os.environ["RANK"])
print("TRAIN " + json.dumps({"rank": rank, "batch": batch(rank), "config": open("conf/settings.txt").read().strip(),
                            "cwd": os.getcwd()}), flush=True)
"""


def test_a_two_file_project_reaches_every_node_pod_which_unpacks_it_and_starts_its_rank_there(
        fake, runner, tmp_path):  # noqa: F811
    """The fake runs no container: each node pod's own command runs here, on its ConfigMap's
    files as the kubelet mounts them, up to the rank launcher that torchrun would start."""
    from tests.clusterjobs import in_folders, mount_configmap
    from tests.test_projects import LIMITS, PROJECT, ranks_said, zip_of

    archive = zip_of({**PROJECT, "where.py": WHERE}, top="proj/")
    job = torch_spec(job_id=48, gpus=2, installation="tj", script_name="where.py", script_content=None, args=(),
                     project=projects.pack(projects.read_archive(archive, LIMITS)))
    runner.cluster = mpijob.ClusterSpec(namespace=NS, gpus_per_node=1)            # two nodes of one GPU
    hold = threading.Event()
    fake.scenarios[job.name] = Scenario(hold=hold)
    outputs = []
    try:
        runner.launch(job)
        pods = fake.wait_for(lambda: len(fake.node_pods(NS, job.name)) == 2 and fake.node_pods(NS, job.name), 30,
                             "both nodes' pods")
        configmaps = {c["metadata"]["name"]: c for c in fake.configmaps(NS)}
        for index, pod in enumerate(pods):
            (container,) = pod["spec"]["containers"]
            volumes = {volume["name"]: volume for volume in pod["spec"]["volumes"]}
            mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
            assert volumes[mounts[trainjob.WORK_DIR]] == {"name": "work", "emptyDir": {}}
            configmap = configmaps[volumes[mounts[trainjob.FILES_DIR]]["configMap"]["name"]]
            folders = {trainjob.FILES_DIR: mount_configmap(configmap, tmp_path / f"node-{index}" / "files"),
                       trainjob.WORK_DIR: tmp_path / f"node-{index}" / "work"}
            folders[trainjob.WORK_DIR].mkdir()
            env = {e["name"]: in_folders([e["value"]], folders)[0] for e in container["env"] if "value" in e}
            assert env["RINGMASTER_PROJECT_DIR"] == str(folders[trainjob.WORK_DIR] / "project")
            env.update(PATH=os.environ["PATH"], RANK=str(index), RINGMASTER_PREFIX_OUTPUT="")
            # The node's command up to torchrun's words, then what torchrun starts in each worker.
            done = subprocess.run([*in_folders(container["command"], folders), sys.executable, "-m",
                                   "ringmaster_rank"], env=env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            outputs.append(done.stdout)
            root = folders[trainjob.WORK_DIR] / "project"
            assert sorted(str(path.relative_to(root)) for path in root.rglob("*")
                          if path.is_file() and "__pycache__" not in path.parts) == \
                ["conf/settings.txt", "datautils.py", "train.py", "where.py"]
    finally:
        hold.set()
        runner.delete(job)
    assert ranks_said(line for output in outputs for line in output.splitlines()) == {
        index: {"rank": index, "batch": [index, index + 1], "config": "lr=0.1",
                "cwd": str(tmp_path / f"node-{index}" / "work" / "project")} for index in (0, 1)}
