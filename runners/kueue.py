"""Kueue (kueue.x-k8s.io) as the portal meets it: whether a cluster runs it (API discovery of
the Workload kind), and what it says of one job (its Workload, the LocalQueue the job is in, the
job's place among the pending workloads).

Kueue, not the portal, decides when a labelled job runs: its webhook creates the job suspended,
its scheduler admits the job's Workload by the ClusterQueue's quota and unsuspends the job, and
it suspends the job again when it preempts or evicts it. The portal only reads. What the reading
means in words is kueuestatus's. Nothing here imports Django.
"""
from dataclasses import dataclass

from kubernetes import client
from kubernetes.client.rest import ApiException

GROUP, VERSION = "kueue.x-k8s.io", "v1beta1"
WORKLOAD_KIND = "Workload"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"          # what puts a job in a LocalQueue
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"           # Kueue's label on a job's Workload
VISIBILITY = "/apis/visibility.kueue.x-k8s.io/v1beta1/namespaces/{namespace}/localqueues/{name}/pendingworkloads"


@dataclass(frozen=True)
class Discovery:
    found: bool
    detail: str


def discover(api_client, timeout):
    """Whether the cluster serves Kueue's Workload kind (API discovery of kueue.x-k8s.io).
    Raises what the client raises where the API server cannot be asked."""
    groups = client.ApisApi(api_client).get_api_versions(_request_timeout=timeout).groups or []
    group = next((g for g in groups if g.name == GROUP), None)
    if group is None:
        return Discovery(False, f"the API server has no {GROUP} API group (Kueue is not installed)")
    versions = [group.preferred_version.version] if group.preferred_version else []
    versions += [v.version for v in group.versions or [] if v.version not in versions]
    for version in versions:
        try:
            resources = client.CustomObjectsApi(api_client).get_api_resources(
                GROUP, version, _request_timeout=timeout).resources or []
        except ApiException as exc:
            if exc.status == 404:
                continue
            raise
        if any(r.kind == WORKLOAD_KIND for r in resources):
            return Discovery(True, f"Kueue found: {GROUP}/{version} serves Workloads")
    return Discovery(False, f"{GROUP} serves no Workload kind (in {', '.join(versions) or 'no version'})")


@dataclass(frozen=True)
class QueueView:
    """What Kueue says of one job now: its Workload (None: not made yet), the ClusterQueue of
    its LocalQueue, and its place among the pending workloads where the cluster tells it."""

    queue: str
    workload: dict | None = None
    cluster_queue: str = ""
    position: int | None = None          # 1: next in its ClusterQueue (the visibility API)
    pending: int | None = None           # pending workloads of its LocalQueue (its status)


def queue_of(job):
    """The LocalQueue a job (its MPIJob or TrainJob) is labelled for, or ""."""
    return ((job or {}).get("metadata", {}).get("labels") or {}).get(QUEUE_LABEL, "")


def look(api_client, namespace, job, timeout):
    """The QueueView of a labelled `job` (its MPIJob or TrainJob as the API gave it)."""
    queue = queue_of(job)
    custom = client.CustomObjectsApi(api_client)
    uid = job["metadata"].get("uid", "")
    items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "workloads",
                                                 label_selector=f"{JOB_UID_LABEL}={uid}",
                                                 _request_timeout=timeout).get("items") or []
    workload = items[0] if items else None
    cluster_queue, pending = "", None
    try:
        local = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "localqueues", queue,
                                                    _request_timeout=timeout)
        cluster_queue = (local.get("spec") or {}).get("clusterQueue", "")
        pending = (local.get("status") or {}).get("pendingWorkloads")
    except ApiException as exc:
        if exc.status not in (403, 404):
            raise
    position = None
    if workload is not None and not _reserved(workload):
        position = _position(api_client, namespace, queue, workload["metadata"]["name"], timeout)
    return QueueView(queue, workload, cluster_queue, position, pending)


def _reserved(workload):
    return any(c.get("type") == "QuotaReserved" and c.get("status") == "True"
               for c in (workload.get("status") or {}).get("conditions") or [])


def _position(api_client, namespace, queue, name, timeout):
    """The workload's place (1: next) in its ClusterQueue from the pending-workloads visibility
    API, or None where the cluster does not serve it (or does not let the portal read it)."""
    try:
        summary = api_client.call_api(VISIBILITY, "GET", path_params={"namespace": namespace, "name": queue},
                                      header_params={"Accept": "application/json"},
                                      response_types_map={200: "object"}, auth_settings=["BearerToken"],
                                      _return_http_data_only=True, _request_timeout=timeout)
    except ApiException as exc:
        if exc.status in (403, 404, 503):
            return None
        raise
    for item in (summary or {}).get("items") or []:
        if item.get("metadata", {}).get("name") == name and item.get("positionInClusterQueue") is not None:
            return int(item["positionInClusterQueue"]) + 1
    return None
