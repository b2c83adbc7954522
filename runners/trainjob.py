"""The TrainJob (trainer.kubeflow.org/v1alpha1) a torchrun job becomes: pure functions, one per
object, in the manner of runners.mpijob.

Kubeflow Trainer renders a TrainJob into a JobSet from the ClusterTrainingRuntime it references
(`torch-distributed` unless the cluster names another, see ../shared/reference/trainer/): one
replicated Job `node` of `numNodes` indexed pods, `<trainjob>-node-0-<index>-<suffix>`, each one
container `node` running the TrainJob's image, command and args. Its torch plugin gives that
container PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (the pod's completion index),
PET_MASTER_ADDR (`<trainjob>-node-0-0.<trainjob>`) and PET_MASTER_PORT (29500), which torchrun
reads as its --nnodes, --nproc-per-node, --node-rank, --master-addr and --master-port: the
command names none of them (launchers.torchrun.trainer_argv), and a job may not set them itself
(Trainer's webhook refuses a TrainJob whose env does).

Every worker runs the rank launcher (`-m ringmaster_rank`) in a writable folder of its pod (an
emptyDir), where the files of the job's ConfigMap are copied first: the uploaded script,
ringmaster_rank.py, ringmaster_metrics.py and the rank's words (argv.json). A script that writes
beside itself (a checkpoint) can; what it writes goes with the pod. The TrainJob API has no
working directory, so a `/bin/sh` wrapper, given both folders as words (no user word is ever
parsed by it), copies and changes into the work folder first. A job that runs a project gets the
packed project in the ConfigMap too (binaryData, runners.mpijob.PROJECT_ARCHIVE), which that
wrapper unpacks into the work folder's project/ (RINGMASTER_PROJECT_DIR), where the rank launcher
starts the entry point: every node's pod has the project's files before its ranks start, and needs
no way to the portal.

What else a pod gets goes through `runtimePatches` (the only pod fields a TrainJob may set): the
portal's labels (the informer finds the pods by them), the ConfigMap volume and its mount, no
privilege gained and no capability kept, the cluster's node selector and tolerations. The API
offers no automountServiceAccountToken and no priorityClassName: the runtime decides those.

validate() checks every TrainJob against the CRD's own schema and Trainer's rules before it is
sent. Nothing here talks to a cluster or imports Django.
"""
import json
from pathlib import Path

from .launchers import torchrun
from .limits import pod_memory
from .mpijob import (_DNS_1035, MAX_CONFIGMAP_BYTES, PROJECT_ARCHIVE, SCRIPT_DIR, _labels, _quantity,
                     _security_context, artifacts_volume, crd_problems, crd_validator, project_data,
                     project_problem, split_gpus)
from .projects import PROJECT_DIR, PROJECT_DIR_VAR, UNTAR

GROUP, VERSION, PLURAL, KIND = "trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"
API_VERSION = f"{GROUP}/{VERSION}"
OPERATOR = "Kubeflow Trainer v2"      # what serves them (named when a cluster lacks it)
# Why the Kubernetes backend runs torchrun jobs at one size (Backend.elastic_problem).
ELASTIC_PROBLEM = ("A TrainJob runs at one size: Kubeflow Trainer v2 removed its elastic policy (v2.2). "
                   "Leave Most GPUs empty, or run the job on instances or on this machine.")
RUNTIME_KIND = "ClusterTrainingRuntime"
NODE = "node"                     # the runtime's replicated Job, and its container, for trainer nodes
# JobSet names the JobSet after the TrainJob and labels every pod with it.
JOB_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
CONTAINER = NODE                  # whose log carries the ranks' output
FILES_DIR = SCRIPT_DIR            # where the ConfigMap is mounted (read-only)
WORK_DIR = "/ringmaster/work"     # where its files are copied and the ranks run (an emptyDir)
PATCH_MANAGER = "ringmaster.io/portal"    # who owns the TrainJob's runtime patch
RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
CRD_FILE = Path(__file__).with_name("schemas") / "trainjob-crd-v1alpha1.yaml"
JOB_PYTHON = Path(__file__).resolve().parent / "job_python"
RANK_FILES = ("ringmaster_rank.py", "ringmaster_metrics.py")
# Copies the files of the folder given as $0 into the one given as $1, changes into it, then
# runs the rest: the words stay words.
CHANGE_DIR = ["/bin/sh", "-c", 'cp -L -- "$0"/* "$1"/ && cd "$1" && shift && exec "$@"', FILES_DIR, WORK_DIR]
# A project's job: the same, with the project's archive unpacked into the work folder's project/
# instead of copied.
PROJECT_DIR_IN_POD = f"{WORK_DIR}/{PROJECT_DIR}"
CHANGE_DIR_WITH_PROJECT = [
    "/bin/sh", "-c",
    f'cp -L -- "$0"/* "$1"/ && rm -f -- "$1"/{PROJECT_ARCHIVE} && mkdir -- "$1"/{PROJECT_DIR} && '
    f'{UNTAR} -f "$0"/{PROJECT_ARCHIVE} -C "$1"/{PROJECT_DIR} && cd "$1" && shift && exec "$@"',
    FILES_DIR, WORK_DIR]


class InvalidTrainJob(ValueError):
    """The TrainJob would be refused by the API server or by Trainer's webhook."""

    def __init__(self, problems):
        super().__init__("the TrainJob is not valid: " + "; ".join(problems))
        self.problems = problems


def node_split(spec, cluster):
    """(numNodes, numProcPerNode): as few equal nodes as fit the cluster's nodes (16 GPUs on
    8-GPU nodes: 2 x 8)."""
    return split_gpus(spec.gpus, cluster.gpus_per_node)


def script_configmap_name(spec):
    return f"{spec.name}-script"


def trainer_env(spec, cluster=None):
    """The trainer container's environment: NCCL_DEBUG unless the user sets it, the user's
    variables, then what torchrun's rank launcher needs (RINGMASTER_PREFIX_OUTPUT: the ranks'
    lines carry their rank, which the portal relies on), and RINGMASTER_OUTPUT_DIR where the
    cluster has an artifacts volume, and RINGMASTER_PROJECT_DIR for a project."""
    env = {"NCCL_DEBUG": "WARN", **spec.env, **torchrun.environment(spec),
           **(artifacts_volume(spec, cluster)[2] if cluster else {}),
           **({PROJECT_DIR_VAR: PROJECT_DIR_IN_POD} if spec.project is not None else {})}
    return [{"name": name, "value": value} for name, value in env.items()]


def new_trainer(spec, cluster):
    """spec.trainer: image, the command (into the work folder, then torchrun), env, the split
    and each node's GPUs (limits), CPU and memory."""
    nodes, per_node = node_split(spec, cluster)
    memory = pod_memory(spec, cluster.memory_per_gpu_gib * per_node)
    return {
        "image": spec.container_image,
        "command": list(CHANGE_DIR_WITH_PROJECT if spec.project is not None else CHANGE_DIR),
        "args": torchrun.trainer_argv(spec),
        "env": trainer_env(spec, cluster),
        "numNodes": nodes,
        "numProcPerNode": per_node,
        "resourcesPerNode": {
            "requests": {"cpu": _quantity(cluster.cpu_per_gpu * per_node), "memory": memory},
            "limits": {"memory": memory, "nvidia.com/gpu": per_node},
        },
    }


def new_pod_patch(spec, cluster):
    """The runtime patch of the trainer nodes' pod template: the portal's labels, the job's
    folder, a locked-down container, placement."""
    pod = {
        "containers": [{
            "name": NODE,
            "volumeMounts": [{"name": "job", "mountPath": FILES_DIR, "readOnly": True},
                             {"name": "work", "mountPath": WORK_DIR}],
            "securityContext": _security_context(()),
        }],
        "volumes": [{"name": "job", "configMap": {"name": script_configmap_name(spec), "defaultMode": 0o444}},
                    {"name": "work", "emptyDir": {}}],
    }
    volumes, mounts, _ = artifacts_volume(spec, cluster)
    pod["containers"][0]["volumeMounts"] += mounts
    pod["volumes"] += volumes
    if cluster.node_selector:
        pod["nodeSelector"] = dict(cluster.node_selector)
    if cluster.tolerations:
        pod["tolerations"] = [dict(t) for t in cluster.tolerations]
    job = {"name": NODE, "template": {"spec": {"template": {"metadata": {"labels": _labels(spec)}, "spec": pod}}}}
    return {"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [job]}}}}


def new_trainjob(spec, cluster):
    """The whole TrainJob for `spec` on `cluster`, labelled for the cluster's Kueue queue where
    it has one (Kueue's webhook, not the portal, then creates it suspended)."""
    body = {
        "runtimeRef": {"apiGroup": GROUP, "kind": RUNTIME_KIND, "name": cluster.training_runtime},
        "trainer": new_trainer(spec, cluster),
        "runtimePatches": [new_pod_patch(spec, cluster)],
    }
    if spec.time_limit_seconds:
        body["activeDeadlineSeconds"] = spec.time_limit_seconds
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": spec.name, "namespace": cluster.namespace, "labels": _labels(spec, cluster)},
        "spec": body,
    }


def configmap_data(spec):
    """The job folder's files: the uploaded script, the rank launcher, ringmaster_metrics and
    the rank's words."""
    data = {name: (JOB_PYTHON / name).read_text() for name in RANK_FILES}
    argv_name, argv = spec.argv_file()
    data[argv_name] = argv.decode()
    if spec.script_content is not None:
        data[spec.script_name] = spec.script_content
    return data


def new_script_configmap(spec, cluster, owner=None):
    """The ConfigMap of the job's folder (and its project). `owner`: the created TrainJob, so the
    ConfigMap goes when the TrainJob does."""
    metadata = {"name": script_configmap_name(spec), "namespace": cluster.namespace, "labels": _labels(spec)}
    if owner is not None:
        metadata["ownerReferences"] = [{
            "apiVersion": API_VERSION, "kind": KIND, "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"], "controller": False, "blockOwnerDeletion": False,
        }]
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": configmap_data(spec)}
    if spec.project is not None:
        configmap["binaryData"] = project_data(spec)
    return configmap


def schema_problems(trainjob):
    """Where `trainjob` breaks the CRD's openAPIV3Schema as the API server applies it (strict)."""
    return crd_problems(crd_validator(CRD_FILE, VERSION), trainjob)


def trainer_problems(trainjob):
    """What the CRD's CEL rules and Trainer's webhook refuse, which the JSON schema does not say."""
    problems = []
    name = trainjob.get("metadata", {}).get("name", "")
    spec = trainjob.get("spec", {})
    trainer = spec.get("trainer") or {}
    if not _DNS_1035.match(name) or len(name) > 63:
        problems.append("metadata.name must be a DNS-1035 label of at most 63 characters")
    nodes = trainer.get("numNodes", 1)
    last_pod = f"{name}-{NODE}-0-{max(nodes - 1, 0) if isinstance(nodes, int) else 0}"
    if len(last_pod) > 63:
        problems.append(f"metadata.name: {last_pod!r} (the last node's host name) is longer than 63 characters")
    if isinstance(trainer.get("numProcPerNode"), int) and trainer["numProcPerNode"] < 1:
        problems.append("spec.trainer.numProcPerNode must be at least 1")
    if isinstance(nodes, int) and nodes < 1:
        problems.append("spec.trainer.numNodes must be at least 1")
    reserved = sorted({e.get("name") for e in trainer.get("env") or [] if isinstance(e, dict)} & set(RESERVED_ENV))
    if reserved:
        problems.append(f"spec.trainer.env: {', '.join(reserved)} are set by the training runtime")
    if not (spec.get("runtimeRef") or {}).get("name"):
        problems.append("spec.runtimeRef.name: the cluster names no training runtime")
    return problems


def validate(trainjob):
    """Raise InvalidTrainJob naming every problem, or return the TrainJob unchanged."""
    problems = document_problems(trainjob)
    if problems:
        raise InvalidTrainJob(problems)
    return trainjob


def build(spec, cluster):
    """The validated TrainJob and the ConfigMap of the job's folder for `spec` on `cluster`."""
    trainjob = validate(new_trainjob(spec, cluster))
    if spec.script_content is not None and spec.script_name in (*RANK_FILES, spec.argv_file()[0]):
        raise InvalidTrainJob([f"a script may not be named {spec.script_name} (Ringmaster's own file there)"])
    if project_problem(spec):
        raise InvalidTrainJob([project_problem(spec)])
    configmap = new_script_configmap(spec, cluster)
    if len(json.dumps(configmap["data"]).encode()) + len(spec.project or b"") > MAX_CONFIGMAP_BYTES:
        raise InvalidTrainJob([f"the script is larger than {MAX_CONFIGMAP_BYTES:,} bytes, too large for a ConfigMap"])
    return trainjob, configmap


def document_problems(trainjob):
    """What the API server or Trainer would refuse in `trainjob` ([] if nothing)."""
    return schema_problems(trainjob) + trainer_problems(trainjob)


new_document = new_trainjob      # each Kubernetes builder's name for its object (runners.mpijob's too)
