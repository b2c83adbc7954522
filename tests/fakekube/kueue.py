"""Kueue (kueue.x-k8s.io/v1beta1) in the fake API server: its webhook, which suspends a job that
carries the queue-name label, and one controller thread that does what Kueue's job and workload
reconcilers and its scheduler do for MPIJobs and TrainJobs:

- a Workload per labelled job (named `<kind>-<job>-<hash>`, labelled with the job's uid, owned
  by the job), with a pod set per replica type and the priority of its pods' PriorityClass;
- one ClusterQueue with a nominal quota of `nvidia.com/gpu` in one ResourceFlavor, and
  LocalQueues pointing at it; only GPUs are counted (the ClusterQueue covers nothing else);
- admission in order (priority, then age; BestEffortFIFO: a smaller workload may pass a larger
  one that does not fit), with the QuotaReserved and Admitted conditions, unsuspending the job;
  the rest held with Kueue's own message ("couldn't assign flavors to pod set worker:
  insufficient unused quota for nvidia.com/gpu in flavor default-flavor, 8 more needed");
- preemption (withinClusterQueue: LowerPriority): the lowest-priority, newest admitted
  workloads make room for a higher one: Evicted and Preempted conditions, Requeued, the job
  suspended again; re-admitted later, the eviction conditions go False ("Previously: ...");
- Finished once the job succeeded or failed; the Workload goes with its job;
- the statuses of the queues (pending, reserving, admitted workloads; flavor usage), and the
  visibility API's pending workloads of a LocalQueue with their positions.

Every Kueue object it stores is checked against Kueue's CRD (tests/fakekube/crds/kueue-*-crd.yaml, copies of ../shared/schemas);
a problem there is a bug in the fake and is raised (FakeKube.errors)."""
import copy
import hashlib
import threading

from . import schema as crd
from .store import ApiError, rfc3339

GROUP, VERSION = "kueue.x-k8s.io", "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
GPU = "nvidia.com/gpu"
CONTROLLER = "kueue-admission"
OWNER = {"mpijobs": ("kubeflow.org/v2beta1", "MPIJob"), "trainjobs": ("trainer.kubeflow.org/v1alpha1", "TrainJob")}


def is_true(obj, ctype):
    return any(c.get("type") == ctype and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


def set_condition(obj, ctype, status, reason, message):
    conds = obj.setdefault("status", {}).setdefault("conditions", [])
    for c in conds:
        if c["type"] == ctype:
            if c["status"] != status:
                c["lastTransitionTime"] = rfc3339()
            c.update(status=status, reason=reason, message=message)
            return
    conds.append({"type": ctype, "status": status, "reason": reason, "message": message,
                  "lastTransitionTime": rfc3339()})


def _gpus(template):
    containers = ((template or {}).get("spec") or {}).get("containers") or []
    return sum(int(((c.get("resources") or {}).get("limits") or {}).get(GPU, 0) or
                   ((c.get("resources") or {}).get("requests") or {}).get(GPU, 0) or 0) for c in containers)


def pod_sets(resource, job):
    """Kueue's pod sets of a job: [{name, count, template}] (an MPIJob: launcher and worker; a
    TrainJob: its runtime's `node` job)."""
    spec = job["spec"]
    if resource == "mpijobs":
        return [{"name": rtype.lower(), "count": int(replica.get("replicas", 1) or 1),
                 "template": copy.deepcopy(replica.get("template") or {})}
                for rtype, replica in sorted((spec.get("mpiReplicaSpecs") or {}).items())]
    trainer = spec.get("trainer") or {}
    container = {"name": "node", "image": trainer.get("image") or "pytorch/pytorch",
                 "resources": copy.deepcopy(trainer.get("resourcesPerNode") or {})}
    return [{"name": "node", "count": int(trainer.get("numNodes") or 1),
             "template": {"spec": {"containers": [container]}}}]


def suspended(resource, job):
    if resource == "mpijobs":
        return bool((job["spec"].get("runPolicy") or {}).get("suspend"))
    return bool(job["spec"].get("suspend"))


def _set_suspend(resource, value):
    def mutate(job):
        if resource == "mpijobs":
            job["spec"].setdefault("runPolicy", {})["suspend"] = value
        else:
            job["spec"]["suspend"] = value
    return mutate


def finished(resource, job):
    if resource == "mpijobs":
        return next((c for c in ("Succeeded", "Failed") if is_true(job, c)), None)
    return "Succeeded" if is_true(job, "Complete") else ("Failed" if is_true(job, "Failed") else None)


class Kueue(threading.Thread):
    """Kueue in `fake`: a ClusterQueue of `gpus` GPUs and a LocalQueue per (namespace, name) of
    `queues`. `priorities`: PriorityClass name -> value, read from the pods' priorityClassName."""

    def __init__(self, fake, gpus=16, queues=(), cluster_queue="cluster-queue", flavor="default-flavor",
                 priorities=None, preemption="LowerPriority"):
        super().__init__(daemon=True, name="fakekube-kueue")
        self.fake, self.store = fake, fake.store
        self.cluster_queue, self.flavor = cluster_queue, flavor
        self.priorities = dict(priorities or {})
        self._born = {}                   # Workload uid -> creation order (timestamps are in seconds)
        self.schemas = {plural: crd.kueue_schema(plural) for plural in ("workloads", "localqueues", "clusterqueues")}
        self._put("resourceflavors", {"apiVersion": API_VERSION, "kind": "ResourceFlavor",
                                      "metadata": {"name": flavor}, "spec": {}})
        self._put("clusterqueues", {
            "apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": {"name": cluster_queue},
            "spec": {"namespaceSelector": {}, "queueingStrategy": "BestEffortFIFO",
                     "preemption": {"withinClusterQueue": preemption},
                     "resourceGroups": [{"coveredResources": [GPU], "flavors": [
                         {"name": flavor, "resources": [{"name": GPU, "nominalQuota": gpus}]}]}]}})
        for namespace, name in queues:
            self.add_local_queue(namespace, name)

    # --- objects --------------------------------------------------------------------------
    def _checked(self, resource, obj):
        schema = self.schemas.get(resource)
        if schema is None:
            return obj
        obj, pruned = schema.default_and_prune(obj)
        causes = schema.errors(obj)
        if causes or pruned:
            raise AssertionError(f"the fake's {resource} object breaks Kueue's CRD: {causes or pruned}")
        return obj

    def _put(self, resource, obj):
        return self.store.create(resource, self._checked(resource, obj))

    def _change(self, resource, ns, name, mutate):
        def checked(obj):
            mutate(obj)
            new = self._checked(resource, obj)
            obj.clear()
            obj.update(new)
        return self.store.update(resource, ns, name, checked)

    def add_local_queue(self, namespace, name):
        return self._put("localqueues", {"apiVersion": API_VERSION, "kind": "LocalQueue",
                                         "metadata": {"name": name, "namespace": namespace},
                                         "spec": {"clusterQueue": self.cluster_queue}})

    def nominal(self):
        cq = self.store.get("clusterqueues", "", self.cluster_queue)
        return int(cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"])

    def set_nominal(self, gpus):
        def mutate(cq):
            cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = gpus
        self._change("clusterqueues", "", self.cluster_queue, mutate)

    # --- the webhook ----------------------------------------------------------------------
    @staticmethod
    def default(resource, job):
        """Kueue's mutating webhook on create: a job with a queue name starts suspended."""
        if (job.get("metadata", {}).get("labels") or {}).get(QUEUE_LABEL):
            _set_suspend(resource, True)(job)

    # --- the controller -------------------------------------------------------------------
    def run(self):
        seen = None
        while not self.fake.stopping.is_set():
            with self.store.lock:
                if self.store.rv == seen:
                    self.store.changed.wait(0.2)
                    continue
                try:
                    self.reconcile()
                except Exception as exc:      # a bug in the fake must show in the tests
                    self.fake.errors.append(exc)
                    raise
                seen = self.store.rv

    def reconcile(self):
        jobs = {}
        for resource in OWNER:
            for job in self.store.list(resource):
                if (job["metadata"].get("labels") or {}).get(QUEUE_LABEL):
                    jobs[job["metadata"]["uid"]] = (resource, job)
        workloads = {}
        for wl in self.store.list("workloads"):
            uid = wl["metadata"]["labels"][JOB_UID_LABEL]
            if uid not in jobs:                    # the job is gone: so is its Workload (ownerReference)
                self.store.delete("workloads", wl["metadata"]["namespace"], wl["metadata"]["name"])
            else:
                workloads[uid] = wl
        for uid, (resource, job) in jobs.items():
            if uid not in workloads:
                workloads[uid] = self._new_workload(resource, job)
            end = finished(resource, job)
            if end and not is_true(workloads[uid], "Finished"):
                workloads[uid] = self._change("workloads", *_key(workloads[uid]), lambda wl, e=end: set_condition(
                    wl, "Finished", "True", e, f"Job finished: {e.lower()}"))
        self._schedule(jobs, workloads)
        for uid, (resource, job) in jobs.items():
            wl = workloads[uid]
            admitted = is_true(wl, "Admitted") and not is_true(wl, "Finished")
            if not finished(resource, job) and suspended(resource, job) == admitted:
                self.store.update(resource, job["metadata"]["namespace"], job["metadata"]["name"],
                                  _set_suspend(resource, not admitted))
        self._queue_statuses(workloads.values())

    def _new_workload(self, resource, job):
        meta = job["metadata"]
        api_version, kind = OWNER[resource]
        digest = hashlib.sha1(meta["uid"].encode()).hexdigest()[:5]
        sets = pod_sets(resource, job)
        priority_class = next((s["template"].get("spec", {}).get("priorityClassName") for s in sets
                               if s["template"].get("spec", {}).get("priorityClassName")), "")
        spec = {"queueName": meta["labels"][QUEUE_LABEL], "podSets": sets, "active": True,
                "priority": self.priorities.get(priority_class, 0)}
        if priority_class:
            spec.update(priorityClassName=priority_class, priorityClassSource="scheduling.k8s.io/priorityclass")
        wl = self._put("workloads", {
            "apiVersion": API_VERSION, "kind": "Workload",
            "metadata": {"name": f"{kind.lower()}-{meta['name']}-{digest}", "namespace": meta["namespace"],
                         "labels": {JOB_UID_LABEL: meta["uid"]},
                         "ownerReferences": [{"apiVersion": api_version, "kind": kind, "name": meta["name"],
                                              "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
            "spec": spec})
        self._born[wl["metadata"]["uid"]] = len(self._born)
        self._job_event(resource, job, "Normal", "CreatedWorkload",
                        f"Created Workload: {meta['namespace']}/{wl['metadata']['name']}")
        return wl

    def _schedule(self, jobs, workloads):
        nominal = self.nominal()
        queues = {(q["metadata"]["namespace"], q["metadata"]["name"]) for q in self.store.list("localqueues")}
        active = [wl for wl in workloads.values() if not is_true(wl, "Finished")]
        admitted = [wl for wl in active if is_true(wl, "QuotaReserved")]
        used = sum(asked(wl) for wl in admitted)
        for wl in sorted((wl for wl in active if not is_true(wl, "QuotaReserved")), key=self._order):
            uid = wl["metadata"]["labels"][JOB_UID_LABEL]
            if (wl["metadata"]["namespace"], wl["spec"]["queueName"]) not in queues:
                self._pending(wl, "Inadmissible", f"LocalQueue {wl['spec']['queueName']} doesn't exist")
                continue
            need = asked(wl)
            if need > nominal - used:
                victims = self._victims(wl, need - (nominal - used), admitted)
                if not victims:
                    self._pending(wl, "Pending", f"couldn't assign flavors to pod set {gpu_pod_set(wl)}: insufficient "
                                                 f"unused quota for {GPU} in flavor {self.flavor}, "
                                                 f"{need - (nominal - used)} more needed")
                    continue
                for victim in victims:
                    workloads[victim["metadata"]["labels"][JOB_UID_LABEL]] = self._evict(victim, wl, jobs)
                    admitted.remove(victim)
                    used -= asked(victim)
            workloads[uid] = self._admit(wl, jobs[uid])
            admitted.append(workloads[uid])
            used += need

    def _victims(self, wl, short, admitted):
        """The admitted workloads of lower priority to preempt for `wl` (lowest, newest first),
        or [] where even all of them would not make room."""
        lower = sorted((a for a in admitted if a["spec"].get("priority", 0) < wl["spec"].get("priority", 0)),
                       key=lambda a: (a["spec"].get("priority", 0), -self._born[a["metadata"]["uid"]]))
        chosen, freed = [], 0
        for victim in lower:
            if freed >= short:
                break
            chosen.append(victim)
            freed += asked(victim)
        return chosen if freed >= short else []

    def _pending(self, wl, reason, message):
        def mutate(obj):
            set_condition(obj, "QuotaReserved", "False", reason, message)
        before = next((c for c in wl.get("status", {}).get("conditions", []) if c["type"] == "QuotaReserved"), None)
        self._change("workloads", *_key(wl), mutate)
        if before is None or before["message"] != message:
            self.fake.record_event(wl["metadata"]["namespace"], _involved(wl), "Warning", "Pending", message,
                                   {"component": CONTROLLER})

    def _admit(self, wl, job_of):
        resource, job = job_of
        assignments = [{"name": s["name"], "count": s["count"], "flavors": {GPU: self.flavor},
                        "resourceUsage": {GPU: str(_gpus(s["template"]) * s["count"])}}
                       for s in wl["spec"]["podSets"]]

        def mutate(obj):
            obj.setdefault("status", {})["admission"] = {"clusterQueue": self.cluster_queue,
                                                         "podSetAssignments": assignments}
            set_condition(obj, "QuotaReserved", "True", "QuotaReserved",
                          f"Quota reserved in ClusterQueue {self.cluster_queue}")
            set_condition(obj, "Admitted", "True", "Admitted", "The workload is admitted")
            for ctype in ("Evicted", "Preempted"):
                cond = next((c for c in obj["status"]["conditions"] if c["type"] == ctype), None)
                if cond is not None and cond["status"] == "True":
                    set_condition(obj, ctype, "False", "QuotaReserved", f"Previously: {cond['message']}")
        new = self._change("workloads", *_key(wl), mutate)
        self.fake.record_event(wl["metadata"]["namespace"], _involved(wl), "Normal", "Admitted",
                               f"Admitted by ClusterQueue {self.cluster_queue}", {"component": CONTROLLER})
        self._job_event(resource, job, "Normal", "Started", f"Admitted by clusterQueue {self.cluster_queue}")
        return new

    def _evict(self, victim, by, jobs):
        by_job = by["metadata"]["labels"][JOB_UID_LABEL]
        message = (f"Preempted to accommodate a workload (UID: {by['metadata']['uid']}, JobUID: {by_job}) "
                   "due to prioritization in the ClusterQueue")

        def mutate(obj):
            obj["status"].pop("admission", None)
            set_condition(obj, "Evicted", "True", "Preempted", message)
            set_condition(obj, "Preempted", "True", "InClusterQueue", message)
            set_condition(obj, "QuotaReserved", "False", "Pending", message)
            set_condition(obj, "Admitted", "False", "NoReservation", "The workload has no reservation")
            set_condition(obj, "Requeued", "True", "Preempted", message)
        evicted = self._change("workloads", *_key(victim), mutate)
        self.fake.record_event(victim["metadata"]["namespace"], _involved(victim), "Normal", "Preempted", message,
                               {"component": CONTROLLER})
        resource, job = jobs[victim["metadata"]["labels"][JOB_UID_LABEL]]
        self._job_event(resource, job, "Normal", "Stopped", message)
        return evicted

    def _job_event(self, resource, job, etype, reason, message):
        api_version, kind = OWNER[resource]
        meta = job["metadata"]
        self.fake.record_event(meta["namespace"], {"apiVersion": api_version, "kind": kind, "name": meta["name"],
                                                   "namespace": meta["namespace"], "uid": meta["uid"]},
                               etype, reason, message, {"component": "kueue-job-controller"})

    def _queue_statuses(self, workloads):
        active = [wl for wl in workloads if not is_true(wl, "Finished")]
        reserving = [wl for wl in active if is_true(wl, "QuotaReserved")]
        pending = [wl for wl in active if not is_true(wl, "QuotaReserved")]
        usage = sum(asked(wl) for wl in reserving)
        flavors = [{"name": self.flavor, "resources": [{"name": GPU, "total": str(usage)}]}]

        def cq_status(cq):
            cq["status"] = {"pendingWorkloads": len(pending), "reservingWorkloads": len(reserving),
                            "admittedWorkloads": len(reserving), "flavorsUsage": flavors,
                            "flavorsReservation": flavors}
        self._change("clusterqueues", "", self.cluster_queue, cq_status)
        for lq in self.store.list("localqueues"):
            mine = [wl for wl in active if (wl["metadata"]["namespace"], wl["spec"]["queueName"]) ==
                    (lq["metadata"]["namespace"], lq["metadata"]["name"])]
            held = sum(1 for wl in mine if is_true(wl, "QuotaReserved"))

            def lq_status(obj, held=held, mine=mine):
                obj["status"] = {"pendingWorkloads": len(mine) - held, "reservingWorkloads": held,
                                 "admittedWorkloads": held}
            self._change("localqueues", lq["metadata"]["namespace"], lq["metadata"]["name"], lq_status)

    def _order(self, wl):
        """Kueue's queueing order: higher priority first, then older first."""
        return -wl["spec"].get("priority", 0), self._born.get(wl["metadata"]["uid"], 0)

    # --- the visibility API -------------------------------------------------------------------
    def pending_workloads(self, namespace, local_queue):
        """visibility.kueue.x-k8s.io/v1beta1 PendingWorkloadsSummary of a LocalQueue."""
        if self.store.get("localqueues", namespace, local_queue) is None:
            raise ApiError(404, "NotFound", f'localqueues.kueue.x-k8s.io "{local_queue}" not found')
        pending = sorted((wl for wl in self.store.list("workloads")
                          if not is_true(wl, "QuotaReserved") and not is_true(wl, "Finished")), key=self._order)
        items, in_queue = [], 0
        for position, wl in enumerate(pending):
            if (wl["metadata"]["namespace"], wl["spec"]["queueName"]) != (namespace, local_queue):
                continue
            items.append({"metadata": {k: wl["metadata"][k] for k in ("name", "namespace", "creationTimestamp",
                                                                       "ownerReferences")},
                          "priority": wl["spec"].get("priority", 0), "localQueueName": local_queue,
                          "positionInClusterQueue": position, "positionInLocalQueue": in_queue})
            in_queue += 1
        return {"kind": "PendingWorkloadsSummary", "apiVersion": "visibility.kueue.x-k8s.io/v1beta1",
                "metadata": {}, "items": items}


def asked(wl):
    return sum(_gpus(s["template"]) * s["count"] for s in wl["spec"]["podSets"])


def gpu_pod_set(wl):
    return next((s["name"] for s in wl["spec"]["podSets"] if _gpus(s["template"])), wl["spec"]["podSets"][0]["name"])


def _key(wl):
    return wl["metadata"]["namespace"], wl["metadata"]["name"]


def _involved(wl):
    return {"apiVersion": API_VERSION, "kind": "Workload", "name": wl["metadata"]["name"],
            "namespace": wl["metadata"]["namespace"], "uid": wl["metadata"]["uid"]}
