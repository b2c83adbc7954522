"""The TrainJob builder (runners.trainjob): plain pytest, no Django, no cluster."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runners import mpijob, trainjob
from runners.base import JobSpec

CLUSTER = mpijob.ClusterSpec(namespace="team-a", gpus_per_node=8)


def spec(**overrides):
    fields = dict(job_id=7, gpus=16, python="python", script_name="train.py", script_content="print('hi')\n",
                  script_path=None, args=("--lr", "0.1"), env={"WANDB_MODE": "offline"},
                  time_limit_seconds=7200, container_image="registry.example/torch:2.13", launcher="torchrun")
    fields.update(overrides)
    return JobSpec(**fields)


def pod_patch(job):
    (patch,) = job["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    return node["template"]["spec"]["template"]


def test_sixteen_gpus_on_eight_gpu_nodes_is_two_nodes_of_eight_processes():
    job, _ = trainjob.build(spec(), CLUSTER)
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and job["kind"] == "TrainJob"
    assert job["metadata"]["name"] == "rm-job-7" and job["metadata"]["namespace"] == "team-a"
    trainer = job["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 8)
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 8
    assert trainer["resourcesPerNode"]["requests"] == {"cpu": "32", "memory": "128Gi"}
    assert job["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                         "name": "torch-distributed"}
    assert job["spec"]["activeDeadlineSeconds"] == 7200 and "suspend" not in job["spec"]


def test_the_nodes_run_the_rank_launcher_under_torchrun_in_the_job_folder_leaving_the_split_to_the_runtime():
    job, configmap = trainjob.build(spec(), CLUSTER)
    trainer = job["spec"]["trainer"]
    assert trainer["image"] == "registry.example/torch:2.13"
    # The ConfigMap's files copied into a writable folder of the pod, the ranks run there.
    assert trainer["command"] == ["/bin/sh", "-c", 'cp -L -- "$0"/* "$1"/ && cd "$1" && shift && exec "$@"',
                                  "/ringmaster/script", "/ringmaster/work"]
    assert trainer["args"] == ["python", "-m", "torch.distributed.run", "--max-restarts=0", "-m", "ringmaster_rank"]
    env = {e["name"]: e["value"] for e in trainer["env"]}
    assert env["WANDB_MODE"] == "offline" and env["RINGMASTER_PREFIX_OUTPUT"] == "1"
    assert not set(env) & set(trainjob.RESERVED_ENV)          # PET_*: the torch runtime's
    assert sorted(configmap["data"]) == ["argv.json", "ringmaster_metrics.py", "ringmaster_rank.py", "train.py"]
    assert json.loads(configmap["data"]["argv.json"]) == ["train.py", "--lr", "0.1"]
    template = pod_patch(job)
    (container,) = template["spec"]["containers"]
    assert container["name"] == "node"
    assert container["volumeMounts"] == [{"name": "job", "mountPath": "/ringmaster/script", "readOnly": True},
                                         {"name": "work", "mountPath": "/ringmaster/work"}]
    assert template["spec"]["volumes"][1] == {"name": "work", "emptyDir": {}}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert template["spec"]["volumes"][0]["configMap"]["name"] == configmap["metadata"]["name"]
    assert template["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "ringmaster"


def test_a_jobs_memory_limit_is_each_nodes_limit_and_request():
    job, _ = trainjob.build(spec(memory_mib=3 * 1024, max_processes=64), CLUSTER)
    resources = job["spec"]["trainer"]["resourcesPerNode"]
    assert resources["limits"]["memory"] == resources["requests"]["memory"] == "3072Mi"
    assert trainjob.schema_problems(job) == []


def test_a_kueue_cluster_gets_a_labelled_trainjob_on_its_runtime_which_kueue_suspends_not_the_portal():
    cluster = mpijob.ClusterSpec(namespace="a", gpus_per_node=8, kueue_queue="team", training_runtime="torch-nccl",
                                 node_selector={"gpu": "h100"})
    job, _ = trainjob.build(spec(), cluster)
    assert "suspend" not in job["spec"]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team"
    assert job["spec"]["runtimeRef"]["name"] == "torch-nccl"
    assert pod_patch(job)["spec"]["nodeSelector"] == {"gpu": "h100"}


@pytest.mark.parametrize(("overrides", "problem"), [
    (dict(env={"PET_NNODES": "3"}), "PET_NNODES are set by the training runtime"),
    (dict(installation="x" * 60), "the last node's host name"),
    (dict(script_name="argv.json"), "may not be named argv.json"),
])
def test_what_trainer_would_refuse_is_refused_before_it_is_sent(overrides, problem):
    with pytest.raises(trainjob.InvalidTrainJob, match=problem):
        trainjob.build(spec(**overrides), CLUSTER)


def test_a_misspelt_field_is_named_by_the_strict_schema():
    job = trainjob.new_trainjob(spec(), CLUSTER)
    job["spec"]["trainer"]["numProcsPerNode"] = 8
    assert trainjob.schema_problems(job) == ["spec.trainer.numProcsPerNode: unknown field"]


@given(gpus=st.integers(1, 64), per_node=st.integers(1, 8), job_id=st.integers(1, 10**12),
       args=st.lists(st.text(max_size=20), max_size=4),
       env=st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True), st.text(max_size=10), max_size=4),
       uploaded=st.booleans(), kueue=st.sampled_from(["", "q"]), limit=st.sampled_from([None, 60]),
       memory=st.sampled_from([None, 512, 10**6]))
@settings(max_examples=150, deadline=None)
def test_every_built_trainjob_passes_the_crd_schema_and_trainers_rules(
        gpus, per_node, job_id, args, env, uploaded, kueue, limit, memory):
    env = {name: value for name, value in env.items() if name not in trainjob.RESERVED_ENV}
    job_spec = spec(gpus=gpus, job_id=job_id, args=tuple(args), env=env, time_limit_seconds=limit, memory_mib=memory,
                    script_content="x = 1\n" if uploaded else None, script_path=None if uploaded else "/t.py")
    cluster = mpijob.ClusterSpec(namespace="ns", gpus_per_node=per_node, kueue_queue=kueue)
    job, configmap = trainjob.build(job_spec, cluster)
    assert trainjob.schema_problems(job) == [] and trainjob.trainer_problems(job) == []
    trainer = job["spec"]["trainer"]
    assert trainer["numNodes"] * trainer["numProcPerNode"] == gpus and trainer["numProcPerNode"] <= per_node
    assert json.loads(configmap["data"]["argv.json"]) == list(job_spec.rank_argv())
