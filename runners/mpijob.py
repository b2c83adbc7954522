"""The MPIJob (kubeflow.org/v2beta1) a job becomes: pure functions, one per object, in the
manner of mpi-operator's controller (newLauncherPodTemplate, newWorker, newConfigMap).

Read next to mpi-operator's examples (examples/v2beta1/horovod/*.yaml): GPUs go on workers only
(`nvidia.com/gpu` limits), `slotsPerWorker` is the GPUs of one worker, `-np` is workers x slots.
The ranks start on the workers under sshd and do not inherit the launcher container's
environment, so every user variable is forwarded with `mpirun -x NAME`. Job pods get no
ServiceAccount token, cannot gain privileges, and keep no capability but those sshd needs.

The operator validates late (a bad spec only gets a `ValidationError` event and the job sits
forever), so validate() checks every MPIJob against the CRD's own schema and the controller's
rules before it is sent. Nothing here talks to a cluster or imports Django.
"""
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from . import kueue
from .artifacts import CHECKPOINT_VAR, OUTPUT_DIR_VAR
from .projects import PROJECT_DIR_VAR, UNTAR
from .base import BLACKLIST_COOLDOWN
from .limits import pod_memory

GROUP, VERSION, PLURAL, KIND = "kubeflow.org", "v2beta1", "mpijobs", "MPIJob"
API_VERSION = f"{GROUP}/{VERSION}"
OPERATOR = "mpi-operator v0.8"                   # what serves them (named when a cluster lacks it)
ELASTIC_PROBLEM = None                           # its Worker replicas scale (Backend.elastic_problem)
LAUNCHER, WORKER = "launcher", "worker"          # container names
SCRIPT_DIR = "/ringmaster/script"                # where an uploaded script is mounted
JOB_NAME_LABEL = "training.kubeflow.org/job-name"   # set by the operator on every pod
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
MANAGED_BY = {"app.kubernetes.io/managed-by": "ringmaster"}
JOB_ID_LABEL = "ringmaster.io/job-id"
INSTALLATION_LABEL = "ringmaster.io/installation"    # the portal that made it
CLEAN_POD_POLICIES = ("None", "Running", "All")
MPIJOB_COMMANDS = ("mpirun", "horovodrun")
# Elastic jobs: mpi-operator v2 keeps this script in the job's ConfigMap (mounted at /etc/mpi),
# one `echo <pod>.<job>.<namespace>.svc` per Running worker, without slots (--slots-per-host).
DISCOVER_HOSTS = "/etc/mpi/discover_hosts.sh"
BOUNDS_ANNOTATION = "ringmaster.io/elastic-workers"   # "min-max" worker replicas of an elastic job
CRD_FILE = Path(__file__).with_name("schemas") / "mpijob-crd-v2beta1.yaml"
MAX_CONFIGMAP_BYTES = 1_000_000   # the API server refuses a ConfigMap over 1 MiB (with its metadata)
# A job's project (JobSpec.project, runners.projects.pack's archive) reaches its pods in the job's
# ConfigMap, as binaryData under PROJECT_ARCHIVE, and is unpacked in each pod before its ranks start
# (an MPIJob: by an init container into an emptyDir at PROJECT_MOUNT, on the launcher and every
# worker; a TrainJob: by its node's command, runners.trainjob). Pods need no way to the portal. The
# archive may take MAX_PROJECT_BYTES of the ConfigMap; the rest is the job's other files'.
PROJECT_ARCHIVE = "project.tar.gz"
MAX_PROJECT_BYTES = 900_000
PROJECT_MOUNT = "/ringmaster/project"
# Unpacks the archive named by $0 into the folder named by $1 (two words: nothing else is parsed).
UNPACK = 'mkdir -p -- "$1" && ' + UNTAR + ' -f "$0" -C "$1"'
_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?\Z")
# Capabilities a job's containers keep; every other one is dropped. mpirun and horovodrun reach
# the workers over SSH: the launcher's ssh client needs none. A worker runs the image's sshd as
# root (mpi-operator's default command and sshAuthMountPath /root/.ssh), which binds port 22
# (NET_BIND_SERVICE), chroots its pre-authentication child into /run/sshd (SYS_CHROOT), and
# switches it to the unprivileged sshd user and sets the login's groups (SETUID, SETGID). Both
# launchers run their commands without a terminal, so sshd neither hands one over (CHOWN) nor
# writes a login record (AUDIT_WRITE). All four are in Pod Security's baseline set.
LAUNCHER_CAPABILITIES = ()
WORKER_CAPABILITIES = ("NET_BIND_SERVICE", "SETGID", "SETUID", "SYS_CHROOT")


@dataclass(frozen=True)
class ClusterSpec:
    """What the builder needs to know about the cluster a job goes to (plain data)."""

    namespace: str
    gpus_per_node: int
    node_selector: dict = field(default_factory=dict)
    tolerations: tuple = ()
    priority_class: str = ""
    kueue_queue: str = ""
    mpijob_command: str = "mpirun"           # or "horovodrun": what the launcher pod runs
    training_runtime: str = "torch-distributed"   # the ClusterTrainingRuntime a TrainJob references
    cpu_per_gpu: float = 4.0
    memory_per_gpu_gib: int = 16
    launcher_cpu: float = 1.0
    launcher_memory_gib: int = 2
    clean_pod_policy: str = "Running"
    backoff_limit: int = 0
    ttl_seconds_after_finished: int = 3600
    # A PersistentVolumeClaim the job's pods mount at OUTPUT_MOUNT, under a sub-path of the job's
    # name: where RINGMASTER_OUTPUT_DIR's files stay ("": no volume, no RINGMASTER_OUTPUT_DIR).
    artifacts_volume: str = ""


# Where a job's pods see their part of the cluster's artifacts volume (RINGMASTER_OUTPUT_DIR), and
# a rerun's pods the part of the job it reruns (RINGMASTER_CHECKPOINT names a file there).
OUTPUT_MOUNT = "/ringmaster/output"
CHECKPOINT_MOUNT = "/ringmaster/checkpoint"


def artifacts_volume(spec, cluster):
    """([volume], [mounts], {RINGMASTER_OUTPUT_DIR: ...}) of the cluster's artifacts volume, each
    job in a sub-path of its own name; nothing where the cluster names none. A rerun from a
    checkpoint (spec.checkpoint: the folder the portal reads the parent's files in, whose last
    part is the parent's sub-path, and the file's name there) mounts the parent's sub-path too,
    read-only, and RINGMASTER_CHECKPOINT names the file in it."""
    if not cluster.artifacts_volume:
        return [], [], {}
    volume = {"name": "artifacts", "persistentVolumeClaim": {"claimName": cluster.artifacts_volume}}
    mounts = [{"name": "artifacts", "mountPath": OUTPUT_MOUNT, "subPath": spec.name}]
    env = {OUTPUT_DIR_VAR: OUTPUT_MOUNT}
    if spec.checkpoint is not None:
        folder, name = spec.checkpoint
        mounts.append({"name": "artifacts", "mountPath": CHECKPOINT_MOUNT, "subPath": Path(folder).name,
                       "readOnly": True})
        env[CHECKPOINT_VAR] = f"{CHECKPOINT_MOUNT}/{name}"
    return [volume], mounts, env


class InvalidMPIJob(ValueError):
    """The MPIJob would be refused by the API server or ignored by the operator."""

    def __init__(self, problems):
        super().__init__("the MPIJob is not valid: " + "; ".join(problems))
        self.problems = problems


def split_gpus(gpus, gpus_per_node):
    """(workers, slots per worker): as few equal workers as fit on nodes of `gpus_per_node`.

    16 GPUs on 8-GPU nodes: 2 x 8; 12 on 8: 2 x 6; 4 on 8: 1 x 4. A count no split of at most
    `gpus_per_node` divides evenly gets more, smaller workers (13 on 8: 13 x 1).
    """
    if gpus < 1 or gpus_per_node < 1:
        raise ValueError("GPUs and GPUs per node must be at least 1")
    workers = -(-gpus // gpus_per_node)
    while gpus % workers:
        workers += 1
    return workers, gpus // workers


def elastic_slots(min_gpus, max_gpus, gpus_per_node):
    """GPUs per worker of an elastic job: the most that fit a node and divide both its minimum
    and its maximum, so every size between is a whole number of workers (2..4 on 8-GPU nodes:
    2; 8..16 on 8: 8; 3..4: 1). The job grows and shrinks a worker, this many GPUs, at a time."""
    common = math.gcd(min_gpus, max_gpus)
    return max(s for s in range(1, min(common, gpus_per_node) + 1) if common % s == 0)


def worker_split(spec, cluster):
    """(workers, GPUs per worker) of `spec` at its size now."""
    if spec.elastic:
        slots = elastic_slots(spec.min_gpus, spec.max_gpus, cluster.gpus_per_node)
        return spec.gpus // slots, slots
    return split_gpus(spec.gpus, cluster.gpus_per_node)


def replica_bounds(spec, cluster):
    """(fewest, most) worker replicas of an elastic job: its minimum and maximum in workers."""
    slots = elastic_slots(spec.min_gpus, spec.max_gpus, cluster.gpus_per_node)
    return spec.min_gpus // slots, spec.max_gpus // slots


def script_configmap_name(spec):
    return f"{spec.name}-script"


def script_path_in_pod(spec):
    if spec.project is not None:
        return f"{PROJECT_MOUNT}/{spec.script_name}"
    if spec.script_content is not None:
        return f"{SCRIPT_DIR}/{spec.script_name}"
    return spec.script_path


def project_problem(spec):
    """Why the job's project cannot go to a Kubernetes cluster (None: it can, or it has none)."""
    if spec.project is None:
        return None
    return project_size_problem(len(spec.project))


def project_size_problem(size):
    """Why a project packed into `size` bytes is too large for a Kubernetes job (None: it is not)."""
    if size <= MAX_PROJECT_BYTES:
        return None
    return (f"The project packs into {size:,} bytes; a Kubernetes job takes at most {MAX_PROJECT_BYTES:,} "
            f"(it reaches the pods in a ConfigMap, which holds at most 1 MiB). Leave large data out of the "
            f"project (read it from the cluster's volumes), or run the job on instances or on this machine.")


def _quantity(value):
    """A CPU count as Kubernetes writes it: 4 -> "4", 0.5 -> "500m"."""
    millis = round(value * 1000)
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def project_env(spec):
    """{RINGMASTER_PROJECT_DIR: where the project lies in the pod} of a project's job, else {}."""
    return {PROJECT_DIR_VAR: PROJECT_MOUNT} if spec.project is not None else {}


def forwarded_env(spec, cluster=None):
    """The launcher's environment: the user's variables (and NCCL_DEBUG unless they set it),
    RINGMASTER_OUTPUT_DIR where the cluster has an artifacts volume, RINGMASTER_PROJECT_DIR for a
    project."""
    env = {"NCCL_DEBUG": "WARN", **spec.env, **(artifacts_volume(spec, cluster)[2] if cluster else {}),
           **project_env(spec)}
    return [{"name": name, "value": value} for name, value in env.items()]


def launcher_command(spec, cluster, np):
    """argv of the launcher container: mpirun (or horovodrun) with every user variable
    forwarded to the ranks. No shell: each word is one argument, whatever it contains."""
    training = [spec.python, script_path_in_pod(spec), *spec.args]
    if spec.elastic:
        # Always horovodrun (mpirun cannot resize): the hosts are the Running workers the
        # operator lists in its discovery script; the portal scales the Worker replicas.
        slots = elastic_slots(spec.min_gpus, spec.max_gpus, cluster.gpus_per_node)
        return ["horovodrun", "-np", str(np), "--min-np", str(spec.min_gpus), "--max-np", str(spec.max_gpus),
                "--slots-per-host", str(slots), "--host-discovery-script", DISCOVER_HOSTS,
                *BLACKLIST_COOLDOWN, *training]
    if cluster.mpijob_command == "horovodrun":
        # horovodrun forwards the launcher's whole environment to the ranks itself.
        return ["horovodrun", "-np", str(np), "--hostfile", "/etc/mpi/hostfile", *training]
    names = dict.fromkeys(["NCCL_DEBUG", "LD_LIBRARY_PATH", "PATH", *spec.env, *artifacts_volume(spec, cluster)[2],
                           *project_env(spec)])
    forward = [word for name in names for word in ("-x", name)]
    # A project's ranks start at its root (horovodrun's start where the launcher runs: workingDir).
    where = ["--wdir", PROJECT_MOUNT] if spec.project is not None else []
    return ["mpirun", "--allow-run-as-root", "--tag-output", "-np", str(np), "-bind-to", "none",
            "-map-by", "slot", *where, *forward, "-mca", "pml", "ob1", "-mca", "btl", "^openib", *training]


def scale_patch(spec, cluster):
    """The merge patch that sets an elastic job's Worker replicas to its size now (the operator
    creates or deletes worker pods, highest index first, and rewrites the discovery script)."""
    workers, _ = worker_split(spec, cluster)
    low, high = replica_bounds(spec, cluster)
    if not low <= workers <= high:
        raise ValueError(f"{workers} workers is outside the job's bounds ({low} to {high})")
    return {"spec": {"mpiReplicaSpecs": {"Worker": {"replicas": workers}}}}


def made_for(existing, spec):
    """Whether an MPIJob found under `spec`'s name was made by this portal for this job (its
    labels name the job and the installation): only then may a retried launch adopt it."""
    labels = (existing or {}).get("metadata", {}).get("labels", {}) or {}
    return (labels.get(JOB_ID_LABEL) == str(spec.job_id)
            and labels.get(INSTALLATION_LABEL, "") == spec.installation)


def _labels(spec, cluster=None):
    labels = {**MANAGED_BY, JOB_ID_LABEL: str(spec.job_id)}
    if spec.installation:
        labels[INSTALLATION_LABEL] = spec.installation
    if cluster is not None and cluster.kueue_queue:
        labels[kueue.QUEUE_LABEL] = cluster.kueue_queue
    return labels


def _script_volume(spec):
    """([volumes], [mounts], [init containers]) of the job's own files, on launcher and workers:
    the ConfigMap of an uploaded script, mounted; or a project, unpacked from the ConfigMap by an
    init container into an emptyDir of the pod (writable, as the job's folder is elsewhere)."""
    if spec.script_content is None and spec.project is None:
        return [], [], []
    volume = {"name": "script", "configMap": {"name": script_configmap_name(spec), "defaultMode": 0o444}}
    mount = {"name": "script", "mountPath": SCRIPT_DIR, "readOnly": True}
    if spec.project is None:
        return [volume], [mount], []
    project = {"name": "project", "mountPath": PROJECT_MOUNT}
    unpack = {
        "name": "project",
        "image": spec.container_image,
        "command": ["/bin/sh", "-c", UNPACK, f"{SCRIPT_DIR}/{PROJECT_ARCHIVE}", PROJECT_MOUNT],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "256Mi"}},
        "volumeMounts": [mount, project],
        "securityContext": _security_context(()),
    }
    return [volume, {"name": "project", "emptyDir": {}}], [project], [unpack]


def _security_context(capabilities):
    """A job container's securityContext: no privilege gained through setuid binaries or file
    capabilities, and no capability beyond `capabilities`."""
    dropped = {"drop": ["ALL"]}
    if capabilities:
        dropped["add"] = list(capabilities)
    return {"allowPrivilegeEscalation": False, "capabilities": dropped}


def _pod_spec(container, volumes, placed, init_containers=()):
    """A job pod's spec around its one container. No ServiceAccount token: user code never
    needs the cluster's API (the portal follows the job itself), and a mounted token would give
    it whatever the namespace's default account may do."""
    pod = {"automountServiceAccountToken": False, "containers": [container], **placed}
    if init_containers:
        pod["initContainers"] = list(init_containers)
    if volumes:
        pod["volumes"] = volumes
    return pod


def _scheduling(cluster, gpu_pod):
    """Pod spec fields placing a pod: node selector (GPU pods only), tolerations, priority."""
    placed = {}
    if gpu_pod and cluster.node_selector:
        placed["nodeSelector"] = dict(cluster.node_selector)
    if cluster.tolerations:
        placed["tolerations"] = [dict(t) for t in cluster.tolerations]
    if cluster.priority_class:
        placed["priorityClassName"] = cluster.priority_class
    return placed


def new_launcher_template(spec, cluster, np):
    """The launcher's pod template: runs mpirun, needs no GPU (the operator hides them) and no
    capability."""
    volumes, mounts, init = _script_volume(spec)
    container = {
        "name": LAUNCHER,
        "image": spec.container_image,
        "command": launcher_command(spec, cluster, np),
        "env": forwarded_env(spec, cluster),
        "resources": {
            "requests": {"cpu": _quantity(cluster.launcher_cpu), "memory": pod_memory(spec, cluster.launcher_memory_gib)},
            "limits": {"memory": pod_memory(spec, cluster.launcher_memory_gib)},
        },
        "securityContext": _security_context(LAUNCHER_CAPABILITIES),
    }
    if mounts:
        container["volumeMounts"] = mounts
    if spec.project is not None:
        container["workingDir"] = PROJECT_MOUNT
    return {"metadata": {"labels": _labels(spec)},
            "spec": _pod_spec(container, volumes, _scheduling(cluster, gpu_pod=False), init)}


def new_worker_template(spec, cluster, slots):
    """A worker's pod template: `slots` GPUs (limits only), CPU and memory per GPU. No command:
    the operator starts sshd, and mpirun starts the ranks through it; the container keeps only
    the capabilities sshd needs as root (WORKER_CAPABILITIES), which the ranks inherit."""
    volumes, mounts, init = _script_volume(spec)
    more_volumes, more_mounts, _ = artifacts_volume(spec, cluster)      # the ranks run here
    volumes, mounts = volumes + more_volumes, mounts + more_mounts
    memory = pod_memory(spec, cluster.memory_per_gpu_gib * slots)
    container = {
        "name": WORKER,
        "image": spec.container_image,
        "resources": {
            "requests": {"cpu": _quantity(cluster.cpu_per_gpu * slots), "memory": memory},
            "limits": {"memory": memory, "nvidia.com/gpu": slots},
        },
        "securityContext": _security_context(WORKER_CAPABILITIES),
    }
    if mounts:
        container["volumeMounts"] = mounts
    return {"metadata": {"labels": _labels(spec)},
            "spec": _pod_spec(container, volumes, _scheduling(cluster, gpu_pod=True), init)}


def new_script_configmap(spec, cluster, owner=None):
    """The ConfigMap holding an uploaded script or a project (None when the script is in the
    image). `owner`: the created MPIJob, so the ConfigMap goes when the MPIJob does."""
    if spec.script_content is None and spec.project is None:
        return None
    metadata = {"name": script_configmap_name(spec), "namespace": cluster.namespace, "labels": _labels(spec)}
    if owner is not None:
        metadata["ownerReferences"] = [{
            "apiVersion": API_VERSION, "kind": KIND, "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"], "controller": False, "blockOwnerDeletion": False,
        }]
    if spec.project is not None:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
                "binaryData": project_data(spec)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {spec.script_name: spec.script_content}}


def project_data(spec):
    """A ConfigMap's binaryData holding the job's project archive (base64, as the API takes it)."""
    import base64

    return {PROJECT_ARCHIVE: base64.b64encode(spec.project).decode()}


def new_mpijob(spec, cluster):
    """The whole MPIJob for `spec` on `cluster`, every run policy set explicitly."""
    workers, slots = worker_split(spec, cluster)
    metadata = {"name": spec.name, "namespace": cluster.namespace, "labels": _labels(spec, cluster)}
    if spec.elastic:
        metadata["annotations"] = {BOUNDS_ANNOTATION: "{}-{}".format(*replica_bounds(spec, cluster))}
    run_policy = {
        "cleanPodPolicy": cluster.clean_pod_policy,
        "ttlSecondsAfterFinished": cluster.ttl_seconds_after_finished,
        "backoffLimit": cluster.backoff_limit,
    }
    if spec.time_limit_seconds:
        run_policy["activeDeadlineSeconds"] = spec.time_limit_seconds
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "slotsPerWorker": slots,
            "mpiImplementation": "OpenMPI",
            # Start the launcher once the workers are up (its ssh would fail before), except
            # under Kueue, which suspends the job and deadlocks with this policy (mpi-operator#615).
            "launcherCreationPolicy": "AtStartup" if cluster.kueue_queue else "WaitForWorkersReady",
            "runPolicy": run_policy,
            "mpiReplicaSpecs": {
                # Never: a failed launcher is replaced by a new pod (up to backoffLimit), so each
                # attempt has a log of its own that the follower reads to the end.
                "Launcher": {"replicas": 1, "restartPolicy": "Never",
                             "template": new_launcher_template(spec, cluster, workers * slots)},
                "Worker": {"replicas": workers, "restartPolicy": "Never",
                           "template": new_worker_template(spec, cluster, slots)},
            },
        },
    }


# What the API server knows of an object's metadata (ObjectMeta); anything else is unknown.
OBJECT_META_FIELDS = ("name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
                      "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels",
                      "annotations", "ownerReferences", "finalizers", "managedFields")


def strict(schema):
    """The schema as the API server applies it with fieldValidation=Strict: an object's fields
    are those its schema names, unless it says otherwise (additionalProperties, or
    x-kubernetes-preserve-unknown-fields). Plain JSON Schema would let any misspelled field by."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: strict(value) for key, value in schema.items()}
    if ("properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        closed["additionalProperties"] = False
    return closed


@lru_cache(maxsize=None)
def crd_validator(crd_file, version_name):
    """A validator of version `version_name` of the CRD in `crd_file`, strict as the API server
    is (see strict), with metadata limited to ObjectMeta's fields."""
    import jsonschema
    import yaml

    crd = yaml.load(Path(crd_file).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    version = next(v for v in crd["spec"]["versions"] if v["name"] == version_name)
    schema = strict(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object", "additionalProperties": False,
                                        "properties": {name: {} for name in OBJECT_META_FIELDS}}
    return jsonschema.Draft7Validator(schema)


def schema_problems(mpijob):
    """Where `mpijob` breaks the CRD's openAPIV3Schema as the API server applies it (strict:
    an unknown field is refused, named by its path)."""
    return crd_problems(crd_validator(CRD_FILE, VERSION), mpijob)


def crd_problems(validator, document):
    """Where `document` breaks the schema of `validator` (crd_validator), one line a problem."""
    problems = []
    for error in sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(part) for part in error.absolute_path)
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            known = error.schema.get("properties", {})
            problems += [f"{where + '.' if where else ''}{name}: unknown field"
                         for name in sorted(error.instance) if name not in known]
            continue
        problems.append(f"{where or '(root)'}: {error.message}")
    return problems


def controller_problems(mpijob):
    """What mpi-operator's validation.go refuses (it would only emit a ValidationError event)."""
    problems = []
    name = mpijob.get("metadata", {}).get("name", "")
    specs = mpijob.get("spec", {}).get("mpiReplicaSpecs", {})
    unknown = set(specs) - {"Launcher", "Worker"}
    if unknown:
        problems.append(f"mpiReplicaSpecs: unknown replica types {sorted(unknown)}")
    # The operator defaults before it validates: a launcher's replicas to 1, a worker's to 0, a
    # restart policy to OnFailure (launcher) or Never (worker).
    launcher, worker = specs.get("Launcher"), specs.get("Worker")
    if launcher is None:
        problems.append("mpiReplicaSpecs.Launcher is required")
    elif launcher.get("replicas", 1) != 1:
        problems.append("mpiReplicaSpecs.Launcher.replicas must be 1")
    if worker is not None and worker.get("replicas", 0) < 1:
        problems.append("mpiReplicaSpecs.Worker.replicas must be at least 1")
    for kind, replica in specs.items():
        replica = replica or {}
        if replica.get("restartPolicy", "Never") not in ("Never", "OnFailure"):
            problems.append(f"mpiReplicaSpecs.{kind}.restartPolicy must be Never or OnFailure")
        if not replica.get("template", {}).get("spec", {}).get("containers"):
            problems.append(f"mpiReplicaSpecs.{kind}: the pod template needs a container")
    policy = mpijob.get("spec", {}).get("runPolicy", {})
    if policy.get("cleanPodPolicy") not in CLEAN_POD_POLICIES:
        problems.append(f"runPolicy.cleanPodPolicy must be set to one of {', '.join(CLEAN_POD_POLICIES)}")
    for setting in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        if isinstance(policy.get(setting), int) and policy[setting] < 0:
            problems.append(f"runPolicy.{setting} must not be negative")
    # An elastic job's worker pods go up to its most replicas (the annotation the builder sets).
    most = (mpijob.get("metadata", {}).get("annotations") or {}).get(BOUNDS_ANNOTATION, "").partition("-")[2]
    replicas = int(most) if most.isdigit() else (worker or {}).get("replicas", 1)
    last_worker = f"{name}-worker-{max(replicas - 1, 0)}"
    if len(last_worker) > 63 or not _DNS_1035.match(last_worker):
        problems.append(f"metadata.name: {last_worker!r} (the last worker's name) is not a valid DNS-1035 label")
    return problems


def validate(mpijob):
    """Raise InvalidMPIJob naming every problem, or return the MPIJob unchanged."""
    problems = document_problems(mpijob)
    if problems:
        raise InvalidMPIJob(problems)
    return mpijob


def build(spec, cluster):
    """The validated MPIJob and the script's ConfigMap (or None) for `spec` on `cluster`."""
    mpijob = validate(new_mpijob(spec, cluster))
    if project_problem(spec):
        raise InvalidMPIJob([project_problem(spec)])
    configmap = new_script_configmap(spec, cluster)
    if spec.script_content is not None and len(spec.script_content.encode()) > MAX_CONFIGMAP_BYTES:
        raise InvalidMPIJob([f"the script is larger than {MAX_CONFIGMAP_BYTES:,} bytes, too large for a ConfigMap"])
    return mpijob, configmap


def document_problems(mpijob):
    """What the API server or the operator would refuse in `mpijob` ([] if nothing)."""
    return schema_problems(mpijob) + controller_problems(mpijob)


new_document = new_mpijob        # each Kubernetes builder's name for its object (runners.trainjob's too)
