"""Kubernetes clusters (for the kubernetes backend): connecting to one, the namespace a job goes
to, the MPIJob or TrainJob it becomes, and the runner that runs it there."""
import hashlib
import os
import importlib
import re
from pathlib import Path

import yaml
from django.conf import settings

from runners import kueue, launchers, mpijob
from runners.kubernetes import KubernetesRunner, Timings

from jobs.backends.kubernetes.models import Cluster, ClusterJob, QueueMapping


class ClusterError(ValueError):
    pass


def _dns_label(text):
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return label[:63].rstrip("-")


def namespace_for(cluster, group):
    """The cluster's namespace for a job charged to `group` (a Group or None)."""
    if "{group}" not in cluster.namespace:
        return cluster.namespace
    if group is None:
        raise ClusterError(f"cluster {cluster.name} runs each group's jobs in the group's own namespace "
                           f"({cluster.namespace}): charge the job to a group")
    namespace = _dns_label(cluster.namespace.replace("{group}", _dns_label(group.name)))
    if not namespace or not namespace[0].isalpha():
        raise ClusterError(f"group {group.name!r} gives no valid namespace from {cluster.namespace!r}")
    return namespace


_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")


def queue_problem(queue):
    """Why `queue` cannot be a kueue.x-k8s.io/queue-name label, or None."""
    if len(queue) > 63 or not _LABEL_VALUE.match(queue):
        return "Must be a valid label value (a LocalQueue name)."
    return None


def cluster_problems(cluster):
    """{field: [message]} for settings no MPIJob on `cluster` could be created with."""
    from runners.base import JobSpec

    problems = {}
    sample = cluster.namespace.replace("{group}", "group")
    if len(sample) > 63 or not _DNS_LABEL.match(sample):
        problems["namespace"] = ["Must be a namespace name (lowercase letters, digits and -), "
                                 "optionally with {group} in it."]
    if problem := queue_problem(cluster.kueue_queue):
        problems["kueue_queue"] = [problem]
    if not isinstance(cluster.node_selector, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in cluster.node_selector.items()):
        problems["node_selector"] = ['Must be an object of label names to strings, e.g. {"gpu": "a100"}.']
    if not isinstance(cluster.tolerations, list) or not all(isinstance(t, dict) for t in cluster.tolerations):
        problems["tolerations"] = ["Must be a list of tolerations (objects)."]
    if problem := artifacts_path_problem(cluster):
        problems["artifacts_path"] = [problem]
    if problems or not cluster.gpus_per_node:
        return problems
    spec = JobSpec(job_id=1, gpus=cluster.gpus_per_node, python="python", script_name="", script_content=None,
                   script_path="/train.py", container_image="image")
    for problem in mpijob.schema_problems(mpijob.new_mpijob(spec, cluster_spec(cluster, _SampleGroup))):
        field = ("tolerations" if ".tolerations" in problem else "priority_class"
                 if "priorityClassName" in problem else "node_selector" if "nodeSelector" in problem else None)
        problems.setdefault(field or "__all__", []).append(problem)
    return problems


def artifacts_path_problem(cluster):
    """Why the portal cannot read the cluster's artifacts volume at `artifacts_path`, or None."""
    path = cluster.artifacts_path
    if not path:
        return None
    if not cluster.artifacts_volume:
        return "Name the artifacts volume too: this is where the portal sees it."
    if not os.path.isabs(path):
        return "Must be an absolute path on the portal's machine."
    if not os.path.isdir(path):
        return f"{path} is not a folder on the portal's machine: mount the volume there first."
    return None


class _SampleGroup:
    name = "group"


def queue_for(cluster, user=None, group=None):
    """The Kueue LocalQueue of a job of `user` charged to `group` on `cluster` (its
    kueue.x-k8s.io/queue-name label; "" for none): the user's own mapping, else the group's,
    else the cluster's default."""
    return queue_of(cluster, getattr(user, "pk", None), getattr(group, "pk", None))


def queue_of(cluster, user_id, group_id):
    """queue_for, by the user's and the group's ids."""
    if cluster.pk:
        mappings = QueueMapping.objects.filter(cluster=cluster.pk)
        for field, who in (("user", user_id), ("group", group_id)):
            if who:
                queue = mappings.filter(**{field: who}).values_list("queue", flat=True).first()
                if queue:
                    return queue
    return cluster.kueue_queue


# Kueue resizes a running job only through workload slices, which cover batch/v1 Jobs, Ray and
# Spark, not MPIJobs (Kueue v0.18): an MPIJob whose workers change is no longer the Workload Kueue
# admitted, and Kueue stops it and queues it again. So the portal never resizes a job that Kueue
# admitted; an elastic job runs there at the size it started at, its minimum.
KUEUE_RESIZES_NO_MPIJOB = ("Kueue decides when it runs and resizes no MPIJob (its workload slices cover batch Jobs, "
                           "Ray and Spark)")


def elastic_words(cluster):
    """What an elastic job does on `cluster`, for the job form."""
    if cluster.kueue_queue or QueueMapping.objects.filter(cluster=cluster.pk).exists():
        who = "" if cluster.kueue_queue else "for the users and groups given a Kueue queue, "
        return f"{cluster.name}: {who}an elastic job runs at its minimum size; {KUEUE_RESIZES_NO_MPIJOB}."
    if cluster.gpu_limit is None:
        return (f"{cluster.name}: no GPU limit here, so the cluster queues jobs itself and an elastic job runs at "
                "its minimum size.")
    return f"{cluster.name}: an elastic job grows and shrinks a worker at a time, within {cluster.gpu_limit} GPUs."


def cluster_spec(cluster, group=None, user=None):
    return mpijob.ClusterSpec(
        namespace=namespace_for(cluster, group),
        gpus_per_node=cluster.gpus_per_node,
        node_selector=dict(cluster.node_selector or {}),
        tolerations=tuple(cluster.tolerations or ()),
        priority_class=cluster.priority_class,
        kueue_queue=queue_for(cluster, user, group),
        mpijob_command=cluster.mpijob_command,
        training_runtime=cluster.training_runtime,
        cpu_per_gpu=cluster.cpu_per_gpu,
        memory_per_gpu_gib=cluster.memory_per_gpu_gib,
        clean_pod_policy=cluster.clean_pod_policy,
        backoff_limit=cluster.backoff_limit,
        ttl_seconds_after_finished=cluster.ttl_seconds_after_finished,
        artifacts_volume=cluster.artifacts_volume,
    )


def parse_kubeconfig(text, context=""):
    """The kubeconfig as a mapping, or ClusterError saying what is wrong with it."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ClusterError(f"the kubeconfig is not valid YAML: {exc}".splitlines()[0])
    if not isinstance(data, dict) or not data.get("clusters") or not data.get("contexts"):
        raise ClusterError("the kubeconfig has no clusters or contexts")
    names = [c.get("name") for c in data["contexts"] if isinstance(c, dict)]
    wanted = context or data.get("current-context")
    if wanted not in names:
        raise ClusterError(f"the kubeconfig has no context {wanted!r} (it has: {', '.join(map(str, names))})")
    return data


def api_client(cluster):
    """A kubernetes ApiClient for the cluster (the kubeconfig is decrypted only in memory)."""
    from kubernetes import client, config

    if cluster.connection == Cluster.Connection.IN_CLUSTER:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    data = parse_kubeconfig(cluster.kubeconfig(), cluster.context)
    return config.new_client_from_config_dict(data, context=cluster.context or None)


def timings(cluster):
    return Timings(
        request_seconds=settings.RINGMASTER_KUBE_REQUEST_SECONDS,
        poll_seconds=settings.RINGMASTER_KUBE_POLL_SECONDS,
        image_pull_grace_seconds=cluster.image_pull_grace_seconds,
        kueue_seconds=settings.RINGMASTER_KUBE_POLL_SECONDS * 5,
    )


def connection_key(cluster):
    """Who the portal is at the cluster's API server: the same for every job of the cluster until
    an admin changes how it connects (then the follows' shared watches start anew with it)."""
    material = "\0".join((str(cluster.pk), cluster.connection, cluster.context, cluster.kubeconfig_encrypted))
    return hashlib.sha256(material.encode()).hexdigest()


def kubeconfig_namespace(path):
    """The namespace of the kubeconfig file's current context ("" where it names none)."""
    try:
        config = yaml.safe_load(Path(path).read_text()) or {}
        context = next(c for c in config.get("contexts", []) if c.get("name") == config.get("current-context"))
        return context.get("context", {}).get("namespace", "") or ""
    except (OSError, yaml.YAMLError, StopIteration, AttributeError):
        return ""


def cluster_of(job):
    """The cluster `job` runs on (chosen at submission), or None."""
    link = ClusterJob.objects.select_related("cluster").filter(job_id=job.pk).first()
    return link.cluster if link is not None else None


def runner_for(job):
    """The runner of a kubernetes job on its cluster."""
    cluster = cluster_of(job)
    if cluster is None:
        raise ValueError(f"job {job.pk} has no Kubernetes cluster")
    return KubernetesRunner(api_client(cluster), cluster_spec(cluster, job.charged_group, job.owner), timings(cluster),
                            cluster_name=cluster.name, connection=connection_key(cluster))


def builder_of(job):
    """The module that builds the Kubernetes object `job` runs as: its launcher's (runners.mpijob
    for Horovod, runners.trainjob for torchrun)."""
    return builder_of_launcher(job.launcher)


def builder_of_launcher(name):
    return importlib.import_module(launchers.of(name).KUBERNETES)


def render(job, cluster=None):
    """(kind, the object the backend would create for `job` on its cluster, or on `cluster`),
    without talking to the cluster."""
    from jobs.backends import job_spec

    cluster = cluster or cluster_of(job)
    if cluster is None:
        raise ValueError(f"job {job.pk} has no Kubernetes cluster")
    builder = builder_of(job)
    return builder.KIND, builder.new_document(job_spec(job), cluster_spec(cluster, job.charged_group, job.owner))


def default_cluster():
    """The one enabled cluster, if there is exactly one."""
    clusters = list(Cluster.objects.filter(enabled=True)[:2])
    return clusters[0] if len(clusters) == 1 else None


def kueue_presence(cluster):
    """(True, False or None where the cluster could not be asked; what was found): whether
    the cluster serves Kueue's Workload kind (API discovery of kueue.x-k8s.io)."""
    from runners.kubernetes import _message

    try:
        found = kueue.discover(api_client(cluster), settings.RINGMASTER_KUBE_REQUEST_SECONDS)
    except ClusterError as exc:
        return None, str(exc)
    except Exception as exc:
        return None, f"cannot tell whether Kueue runs there: {_message(exc)}"
    return found.found, found.detail


def kueue_refusal(cluster, queue, detail):
    """Why a job labelled for `queue` may not go to `cluster`, whose last check found no Kueue."""
    return (f"Kueue is not installed on cluster {cluster.name} ({detail}): a job in queue {queue} would never "
            "be admitted. Install Kueue (deploy/KUBERNETES.md), or leave the queue empty.")


def record_kueue(cluster):
    """Look for Kueue on the cluster and keep what was found on it; returns (found, detail)."""
    found, detail = kueue_presence(cluster)
    if found is not None:
        cluster.kueue_found, cluster.kueue_detail = found, detail[:300]
        if cluster.pk:
            Cluster.objects.filter(pk=cluster.pk).update(kueue_found=found, kueue_detail=detail[:300])
    return found, detail


def check_all():
    """Check every enabled cluster (from beat): whether it is reachable, and Kueue there."""
    return {cluster.name: check(cluster) for cluster in Cluster.objects.filter(enabled=True)}


def check(cluster):
    """(ok, what was found): can the portal reach the cluster and list MPIJobs there? Whether
    Kueue runs there is recorded on the cluster; a queue name without Kueue fails the check."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from runners.kubernetes import _message

    try:
        namespace = cluster.namespace.replace("{group}", "default") if "{group}" in cluster.namespace \
            else cluster.namespace
        api = client.CustomObjectsApi(api_client(cluster))
        api.list_namespaced_custom_object(mpijob.GROUP, mpijob.VERSION, namespace, mpijob.PLURAL, limit=1,
                                          _request_timeout=settings.RINGMASTER_KUBE_REQUEST_SECONDS)
    except ApiException as exc:
        if exc.status == 404:
            return False, ("the cluster does not serve MPIJobs (kubeflow.org/v2beta1): "
                           "install mpi-operator v0.8 (deploy/KUBERNETES.md)")
        return False, f"{exc.status}: {_message(exc)}"
    except ClusterError as exc:
        return False, str(exc)
    except Exception as exc:
        return False, _message(exc)
    found, detail = record_kueue(cluster)
    queues = {cluster.kueue_queue} - {""}
    if cluster.pk:
        queues |= set(cluster.queue_mappings.values_list("queue", flat=True))
    if found is False and queues:
        return False, kueue_refusal(cluster, ", ".join(sorted(queues)), detail)
    return True, f"reachable; MPIJobs can be listed in {namespace}; {detail}"
