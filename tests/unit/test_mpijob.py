"""The MPIJob builder (runners.mpijob): plain pytest, no Django, no cluster."""
import copy
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from runners import mpijob, projects
from runners.base import JobSpec
from tests.clusterjobs import in_folders, mount_configmap

SHARED_CRD = Path(__file__).resolve().parents[3] / "shared" / "schemas" / "mpijob-crd-v2beta1.yaml"
EXAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "mpi-operator-examples"


def spec(**overrides):
    fields = dict(job_id=7, gpus=16, python="python", script_name="train.py", script_content="print('hi')\n",
                  script_path=None, args=("--lr", "0.1"), env={"WANDB_MODE": "offline"},
                  time_limit_seconds=7200, container_image="registry.example/horovod:0.28.1")
    fields.update(overrides)
    return JobSpec(**fields)


CLUSTER = mpijob.ClusterSpec(namespace="team-a", gpus_per_node=8)


def containers(job, kind):
    return job["spec"]["mpiReplicaSpecs"][kind]["template"]["spec"]["containers"]


@pytest.mark.parametrize(("gpus", "per_node", "split"), [
    (16, 8, (2, 8)), (8, 8, (1, 8)), (4, 8, (1, 4)), (12, 8, (2, 6)), (24, 8, (3, 8)), (13, 8, (13, 1)),
    (1, 8, (1, 1)), (6, 4, (2, 3)),
])
def test_gpus_split_into_equal_workers_that_fit_a_node(gpus, per_node, split):
    assert mpijob.split_gpus(gpus, per_node) == split


@given(st.integers(1, 512), st.integers(1, 16))
@settings(max_examples=300, deadline=None)
def test_every_split_fits_a_node_and_covers_the_job(gpus, per_node):
    workers, slots = mpijob.split_gpus(gpus, per_node)
    assert workers * slots == gpus and 1 <= slots <= per_node


def test_sixteen_gpus_on_eight_gpu_nodes_is_two_workers_of_eight():
    job = mpijob.new_mpijob(spec(), CLUSTER)
    assert job["apiVersion"] == "kubeflow.org/v2beta1" and job["kind"] == "MPIJob"
    assert job["metadata"]["name"] == "rm-job-7" and job["metadata"]["namespace"] == "team-a"
    assert job["spec"]["slotsPerWorker"] == 8
    assert job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    assert job["spec"]["mpiReplicaSpecs"]["Launcher"]["replicas"] == 1
    command = containers(job, "Launcher")[0]["command"]
    assert command[command.index("-np") + 1] == "16"


def test_gpus_are_limits_on_workers_only():
    job = mpijob.new_mpijob(spec(), CLUSTER)
    worker = containers(job, "Worker")[0]["resources"]
    assert worker["limits"]["nvidia.com/gpu"] == 8
    assert "nvidia.com/gpu" not in worker["requests"]
    assert worker["requests"] == {"cpu": "32", "memory": "128Gi"}
    launcher = containers(job, "Launcher")[0]["resources"]
    assert "nvidia.com/gpu" not in str(launcher)


def test_a_jobs_memory_limit_below_the_clusters_limits_and_requests_every_pod_of_it():
    job = mpijob.new_mpijob(spec(memory_mib=512, max_processes=64), CLUSTER)
    for kind in ("Worker", "Launcher"):
        resources = containers(job, kind)[0]["resources"]
        assert resources["limits"]["memory"] == resources["requests"]["memory"] == "512Mi"
    # Above what the cluster gives a pod, the cluster's amount stays.
    worker = containers(mpijob.new_mpijob(spec(memory_mib=10**6), CLUSTER), "Worker")[0]["resources"]
    assert worker["limits"]["memory"] == "128Gi"


def test_run_policy_is_set_explicitly_with_the_time_limit():
    job = mpijob.new_mpijob(spec(), mpijob.ClusterSpec(namespace="a", gpus_per_node=8, clean_pod_policy="All",
                                                        backoff_limit=2, ttl_seconds_after_finished=600))
    assert job["spec"]["runPolicy"] == {"cleanPodPolicy": "All", "ttlSecondsAfterFinished": 600,
                                        "backoffLimit": 2, "activeDeadlineSeconds": 7200}


def test_launcher_runs_mpirun_tagging_output_and_forwarding_every_user_variable():
    job = mpijob.new_mpijob(spec(env={"WANDB_MODE": "offline", "PATH": "/opt/bin"}), CLUSTER)
    command = containers(job, "Launcher")[0]["command"]
    assert command[:5] == ["mpirun", "--allow-run-as-root", "--tag-output", "-np", "16"]
    forwarded = [command[i + 1] for i, word in enumerate(command) if word == "-x"]
    assert forwarded == ["NCCL_DEBUG", "LD_LIBRARY_PATH", "PATH", "WANDB_MODE"]   # PATH once
    assert command[-4:] == ["python", "/ringmaster/script/train.py", "--lr", "0.1"]
    assert {"name": "WANDB_MODE", "value": "offline"} in containers(job, "Launcher")[0]["env"]
    for words in (["-bind-to", "none"], ["-map-by", "slot"], ["-mca", "pml", "ob1"], ["-mca", "btl", "^openib"]):
        at = command.index(words[0])
        assert words in [command[i:i + len(words)] for i in range(at, len(command))]


def test_hostile_arguments_stay_single_words_with_no_shell():
    hostile = ("; rm -rf /", "$(id)", "a b", "'\"")
    command = containers(mpijob.new_mpijob(spec(args=hostile), CLUSTER), "Launcher")[0]["command"]
    assert command[0] == "mpirun" and tuple(command[-4:]) == hostile


def test_horovodrun_launcher_uses_the_operators_hostfile():
    cluster = mpijob.ClusterSpec(namespace="a", gpus_per_node=4, mpijob_command="horovodrun")
    command = containers(mpijob.new_mpijob(spec(gpus=8), cluster), "Launcher")[0]["command"]
    assert command[:5] == ["horovodrun", "-np", "8", "--hostfile", "/etc/mpi/hostfile"]


def test_uploaded_script_is_mounted_from_a_configmap_on_launcher_and_workers():
    job_spec = spec()
    job = mpijob.new_mpijob(job_spec, CLUSTER)
    for kind in ("Launcher", "Worker"):
        pod = job["spec"]["mpiReplicaSpecs"][kind]["template"]["spec"]
        assert pod["volumes"] == [{"name": "script", "configMap": {"name": "rm-job-7-script", "defaultMode": 0o444}}]
        assert pod["containers"][0]["volumeMounts"][0]["mountPath"] == mpijob.SCRIPT_DIR
    owner = {"metadata": {"name": "rm-job-7", "uid": "u-1"}}
    configmap = mpijob.new_script_configmap(job_spec, CLUSTER, owner=owner)
    assert configmap["data"] == {"train.py": "print('hi')\n"}
    assert configmap["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_a_project_is_unpacked_by_an_init_container_on_the_launcher_and_every_worker_and_the_ranks_start_there(
        tmp_path):
    files = [projects.File("train.py", b"import datautils\n"), projects.File("datautils.py", b"X = 1\n"),
             projects.File("conf/run.sh", b"#!/bin/sh\n", executable=True)]
    job_spec = spec(script_content=None, project=projects.pack(files))
    job, configmap = mpijob.build(job_spec, CLUSTER)        # valid against the CRD, as the operator takes it
    assert mpijob.crd_problems(mpijob.crd_validator(SHARED_CRD, mpijob.VERSION), job) == []
    assert "data" not in configmap and list(configmap["binaryData"]) == [mpijob.PROJECT_ARCHIVE]
    launcher = containers(job, "Launcher")[0]
    assert launcher["workingDir"] == "/ringmaster/project"
    assert launcher["command"][launcher["command"].index("--wdir") + 1] == "/ringmaster/project"
    assert launcher["command"][-4:] == ["python", "/ringmaster/project/train.py", "--lr", "0.1"]
    assert {"name": "RINGMASTER_PROJECT_DIR", "value": "/ringmaster/project"} in launcher["env"]
    assert "RINGMASTER_PROJECT_DIR" in launcher["command"]            # mpirun -x: the ranks get it too
    for kind in ("Launcher", "Worker"):
        pod = job["spec"]["mpiReplicaSpecs"][kind]["template"]["spec"]
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        assert volumes["project"] == {"name": "project", "emptyDir": {}}
        assert volumes["script"]["configMap"]["name"] == configmap["metadata"]["name"]
        assert {"name": "project", "mountPath": "/ringmaster/project"} in pod["containers"][0]["volumeMounts"]
        (init,) = pod["initContainers"]
        assert init["image"] == job_spec.container_image
        assert init["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        # What the init container does, run here on the ConfigMap's files as the kubelet mounts them.
        mounted = {mount["mountPath"]: tmp_path / kind / mount["name"] for mount in init["volumeMounts"]}
        mount_configmap(configmap, mounted[mpijob.SCRIPT_DIR])
        subprocess.run(in_folders(init["command"], mounted), check=True, timeout=60)
        root = mounted["/ringmaster/project"]
        assert sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file()) == \
            ["conf/run.sh", "datautils.py", "train.py"]
        assert (root / "datautils.py").read_bytes() == b"X = 1\n" and os.access(root / "conf/run.sh", os.X_OK)


def test_a_project_too_large_for_a_configmap_is_refused_naming_the_limit():
    job_spec = spec(script_content=None, project=projects.pack([projects.File("blob.bin", os.urandom(950_000))]))
    with pytest.raises(mpijob.InvalidMPIJob, match="a Kubernetes job takes at most 900,000"):
        mpijob.build(job_spec, CLUSTER)


def test_a_script_inside_the_image_needs_no_configmap():
    job_spec = spec(script_content=None, script_name="", script_path="/examples/pytorch_mnist.py")
    job = mpijob.new_mpijob(job_spec, CLUSTER)
    assert "volumes" not in job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert containers(job, "Launcher")[0]["command"][-3] == "/examples/pytorch_mnist.py"
    assert mpijob.new_script_configmap(job_spec, CLUSTER) is None


def test_placement_kueue_and_priority():
    cluster = mpijob.ClusterSpec(namespace="a", gpus_per_node=8, node_selector={"gpu": "a100"},
                                 tolerations=({"key": "nvidia.com/gpu", "operator": "Exists"},),
                                 priority_class="training", kueue_queue="team-a")
    job = mpijob.new_mpijob(spec(), cluster)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["spec"]["launcherCreationPolicy"] == "AtStartup"      # Kueue suspends; mpi-operator#615
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    assert worker["nodeSelector"] == {"gpu": "a100"} and "nodeSelector" not in launcher
    assert worker["tolerations"] == launcher["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert worker["priorityClassName"] == launcher["priorityClassName"] == "training"
    assert mpijob.new_mpijob(spec(), CLUSTER)["spec"]["launcherCreationPolicy"] == "WaitForWorkersReady"


@given(gpus=st.integers(1, 64), per_node=st.integers(1, 8), job_id=st.integers(1, 10**12),
       args=st.lists(st.text(max_size=20), max_size=4),
       env=st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True), st.text(max_size=10), max_size=4),
       uploaded=st.booleans(), command=st.sampled_from(mpijob.MPIJOB_COMMANDS),
       policy=st.sampled_from(mpijob.CLEAN_POD_POLICIES), kueue=st.sampled_from(["", "q"]),
       memory=st.sampled_from([None, 512, 10**6]))
@settings(max_examples=150, deadline=None)
def test_every_built_mpijob_passes_the_crd_schema_and_the_controllers_rules(
        gpus, per_node, job_id, args, env, uploaded, command, policy, kueue, memory):
    job_spec = spec(gpus=gpus, job_id=job_id, args=tuple(args), env=env, memory_mib=memory, max_processes=64,
                    script_content="x = 1\n" if uploaded else None, script_path=None if uploaded else "/t.py")
    cluster = mpijob.ClusterSpec(namespace="ns", gpus_per_node=per_node, mpijob_command=command,
                                 clean_pod_policy=policy, kueue_queue=kueue)
    job, _ = mpijob.build(job_spec, cluster)
    assert mpijob.schema_problems(job) == [] and mpijob.controller_problems(job) == []
    assert_locked_down(job)


@pytest.mark.parametrize(("breakage", "problem"), [
    (lambda j: j["spec"]["mpiReplicaSpecs"]["Launcher"].update(replicas=2), "Launcher.replicas must be 1"),
    (lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"].update(replicas=0), "Worker.replicas must be at least 1"),
    (lambda j: j["spec"]["mpiReplicaSpecs"]["Worker"].update(restartPolicy="Always"), "Never or OnFailure"),
    (lambda j: j["spec"]["runPolicy"].pop("cleanPodPolicy"), "cleanPodPolicy must be set"),
    (lambda j: j["metadata"].update(name="Job_7"), "DNS-1035"),
    (lambda j: j["metadata"].update(name="a" * 60), "DNS-1035"),
    (lambda j: j["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"].update(containers=[]),
     "needs a container"),
    (lambda j: j["spec"].update(mpiImplementation="LAM"), "mpiImplementation"),
    (lambda j: j["spec"].update(slotsPerWorker="8"), "slotsPerWorker"),
    (lambda j: j["spec"].pop("mpiReplicaSpecs"), "mpiReplicaSpecs"),
    (lambda j: containers(j, "Worker")[0].pop("name"), "'name' is a required property"),
    (lambda j: j["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"].update(automountServiceAccountToken="no"),
     "Launcher.template.spec.automountServiceAccountToken: 'no' is not of type 'boolean'"),
    (lambda j: containers(j, "Worker")[0]["securityContext"]["capabilities"].update(drop="ALL"),
     "securityContext.capabilities.drop: 'ALL' is not of type 'array'"),
])
def test_validation_names_what_the_api_server_or_operator_would_refuse(breakage, problem):
    job = mpijob.new_mpijob(spec(), CLUSTER)
    breakage(job)
    with pytest.raises(mpijob.InvalidMPIJob) as caught:
        mpijob.validate(job)
    assert problem in str(caught.value)


def test_a_script_too_large_for_a_configmap_is_refused_before_sending():
    with pytest.raises(mpijob.InvalidMPIJob, match="too large for a ConfigMap"):
        mpijob.build(spec(script_content="#" * 1_000_001), CLUSTER)


def test_the_operators_own_examples_pass_the_same_validation():
    """The validator is not stricter than the operator: its example MPIJobs pass."""
    examples = sorted(EXAMPLES.glob("*.yaml"))
    assert len(examples) == 3
    for path in examples:
        for document in yaml.safe_load_all(path.read_text()):
            if document and document.get("kind") == "MPIJob":
                document = copy.deepcopy(document)
                document["spec"].setdefault("runPolicy", {}).setdefault("cleanPodPolicy", "Running")
                assert mpijob.schema_problems(document) == [], path.name
                assert mpijob.controller_problems(document) == [], path.name


def test_the_crd_in_the_repo_is_mpi_operators_v0_8_2_file():
    if not SHARED_CRD.exists():
        pytest.skip("the shared CRD is not next to this checkout")
    assert mpijob.CRD_FILE.read_bytes() == SHARED_CRD.read_bytes()


def _misspell(path, wrong):
    """A built MPIJob with a field added under `path` (dot path; digits index lists)."""
    document = mpijob.new_mpijob(spec(), CLUSTER)
    node = document
    for part in path.split(".") if path else []:
        node = node[int(part)] if part.isdigit() else node[part]
    node[wrong] = 1
    return document


@pytest.mark.parametrize(("path", "wrong"), [
    ("", "apiVerison"),
    ("metadata", "lables"),
    ("spec", "slotPerWorker"),
    ("spec.runPolicy", "ttlSecondAfterFinished"),
    ("spec.mpiReplicaSpecs.Worker", "replica"),
    ("spec.mpiReplicaSpecs.Worker.template.spec", "nodeSelectors"),
    ("spec.mpiReplicaSpecs.Worker.template.spec.containers.0", "imagePullPolice"),
    ("spec.mpiReplicaSpecs.Worker.template.spec.containers.0.resources", "limitz"),
    ("spec.mpiReplicaSpecs.Launcher.template.spec.containers.0", "comand"),
    ("spec.mpiReplicaSpecs.Launcher.template.spec.containers.0.securityContext", "allowPrivilegeEscalaton"),
    ("spec.mpiReplicaSpecs.Worker.template.spec.containers.0.securityContext.capabilities", "dorp"),
])
def test_a_misspelled_field_at_any_level_is_refused_naming_its_path(path, wrong):
    """As the API server with fieldValidation=Strict: a typo is an error, not a setting that is
    silently dropped (pruned) and ignored."""
    where = f"{path}.{wrong}" if path else wrong
    assert mpijob.schema_problems(_misspell(path, wrong)) == [f"{where}: unknown field"]
    with pytest.raises(mpijob.InvalidMPIJob, match=f"{where}: unknown field"):
        mpijob.validate(_misspell(path, wrong))


def test_fields_the_crd_leaves_open_stay_open():
    document = mpijob.new_mpijob(spec(), CLUSTER)
    document["metadata"]["labels"]["anything.example/at-all"] = "yes"           # a map of strings
    document["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["metadata"] = {"annotations": {"a": "b"}}
    assert mpijob.schema_problems(document) == []


# --- what a job's pods may do (issue #41) ---------------------------------------------------------
# Capabilities Pod Security's baseline level lets a container add (the Pod Security Standards):
# a namespace enforcing it, as the guide's job namespaces do, admits the pods.
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
# What the image's sshd needs as root on a worker, no more (tests/test_mpijob_sshd.py runs it so).
SSHD_CAPABILITIES = {"NET_BIND_SERVICE", "SETGID", "SETUID", "SYS_CHROOT"}


def assert_locked_down(job):
    """Every pod template of `job`: no ServiceAccount token, no privilege escalation, every
    capability dropped; the launcher adds none back, a worker only what its sshd needs."""
    for kind, replica in job["spec"]["mpiReplicaSpecs"].items():
        pod = replica["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False, kind
        assert "initContainers" not in pod and "ephemeralContainers" not in pod, kind
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False and not context.get("privileged"), kind
            assert context["capabilities"]["drop"] == ["ALL"], kind
            added = set(context["capabilities"].get("add", []))
            assert added == (SSHD_CAPABILITIES if kind == "Worker" else set()), kind
            assert added <= BASELINE_CAPABILITIES, kind


@pytest.mark.parametrize("job_spec", [
    spec(), spec(script_content=None, script_name="", script_path="/examples/train.py"),
    spec(gpus=8, min_gpus=8, max_gpus=16)],
    ids=["uploaded-script", "script-in-the-image", "elastic"])
@pytest.mark.parametrize("command", mpijob.MPIJOB_COMMANDS)
def test_job_pods_get_no_token_cannot_gain_privileges_and_keep_only_the_capabilities_sshd_needs(job_spec, command):
    job, _ = mpijob.build(job_spec, mpijob.ClusterSpec(namespace="team-a", gpus_per_node=8, mpijob_command=command,
                                                       kueue_queue="q"))
    assert_locked_down(job)
    (launcher_container,) = containers(job, "Launcher")
    assert launcher_container["securityContext"] == {"allowPrivilegeEscalation": False,
                                                     "capabilities": {"drop": ["ALL"]}}
    (worker,) = containers(job, "Worker")
    assert worker["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": sorted(SSHD_CAPABILITIES)}


# --- elastic jobs (issue #15): horovodrun over the operator's discovery script ----------------

def elastic(gpus, low, high):
    return spec(gpus=gpus, min_gpus=low, max_gpus=high)


@pytest.mark.parametrize(("low", "high", "per_node", "slots"), [
    (2, 4, 8, 2), (8, 16, 8, 8), (3, 4, 8, 1), (4, 12, 2, 2), (6, 18, 8, 6), (1, 8, 8, 1),
])
def test_an_elastic_job_has_workers_of_a_size_that_divides_its_minimum_and_maximum(low, high, per_node, slots):
    assert mpijob.elastic_slots(low, high, per_node) == slots


@given(st.integers(1, 64), st.integers(0, 64), st.integers(1, 16))
@settings(max_examples=300, deadline=None)
def test_every_size_of_an_elastic_job_is_whole_workers_that_fit_a_node(low, more, per_node):
    high = low + more
    slots = mpijob.elastic_slots(low, high, per_node)
    assert 1 <= slots <= per_node and low % slots == 0 and high % slots == 0


def test_an_elastic_launcher_runs_horovodrun_on_the_operators_discovery_script_between_its_bounds():
    job = mpijob.new_mpijob(elastic(8, 8, 16), CLUSTER)         # the mpirun cluster default changes nothing
    command = containers(job, "Launcher")[0]["command"]
    assert command[:command.index("python")] == [
        "horovodrun", "-np", "8", "--min-np", "8", "--max-np", "16", "--slots-per-host", "8",
        "--host-discovery-script", "/etc/mpi/discover_hosts.sh", "--blacklist-cooldown-range", "10", "60"]
    assert command[command.index("python"):] == ["python", "/ringmaster/script/train.py", "--lr", "0.1"]
    assert job["spec"]["slotsPerWorker"] == 8 and job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 1
    assert job["metadata"]["annotations"] == {mpijob.BOUNDS_ANNOTATION: "1-2"}
    assert mpijob.validate(job) is job


def test_a_scale_patch_sets_the_worker_replicas_within_the_bounds_and_refuses_beyond():
    assert mpijob.scale_patch(elastic(6, 2, 8), CLUSTER) == {"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": 3}}}}
    assert mpijob.replica_bounds(elastic(6, 2, 8), CLUSTER) == (1, 4)
    with pytest.raises(ValueError, match="outside the job's bounds"):
        mpijob.scale_patch(elastic(10, 2, 8), CLUSTER)


def test_the_last_worker_an_elastic_job_may_grow_to_must_have_a_valid_name():
    long_name = spec(installation="x" * 49, min_gpus=1, max_gpus=20, gpus=1)
    job = mpijob.new_mpijob(long_name, mpijob.ClusterSpec(namespace="a", gpus_per_node=1))
    assert any("worker-19" in problem for problem in mpijob.controller_problems(job))
    assert not mpijob.controller_problems(mpijob.new_mpijob(replace_spec(long_name, max_gpus=9),
                                                            mpijob.ClusterSpec(namespace="a", gpus_per_node=1)))


def replace_spec(item, **fields):
    from dataclasses import replace
    return replace(item, **fields)
