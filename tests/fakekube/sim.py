"""The MPI operator (or Kubeflow Trainer with JobSet) and the kubelet, played by one thread per
MPIJob (TrainJob), driven by a Scenario."""
import copy
import dataclasses
import random
import threading
import time
import uuid
from typing import Optional

from .store import rfc3339

OPERATOR = "training.kubeflow.org/operator-name"
JOB_NAME = "training.kubeflow.org/job-name"
JOB_ROLE = "training.kubeflow.org/job-role"
REPLICA_INDEX = "training.kubeflow.org/replica-index"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"          # JobSet's labels on every pod of a JobSet
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"   # the Job's label and annotation
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER_PORT = 29500                       # Trainer's PET_MASTER_PORT
CONTROLLER = "mpi-job-controller"          # the operator's event source component
RAND_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"   # what Kubernetes uses for generateName suffixes
DEFAULT_BACKOFF_LIMIT = 6                  # batch/v1 Job's default


@dataclasses.dataclass
class Scenario:
    """How the fake operator and kubelet run one MPIJob. attempts[i] = (output chunks, exit code) for
    launcher attempt i (the last one repeats); None: every rank prints a few tagged lines, exit 0."""
    attempts: Optional[list] = None
    step_seconds: float = 0.05
    hold: Optional[threading.Event] = None
    unschedulable: bool = False
    image_pull_error: bool = False
    oom_worker: Optional[int] = None
    evict_worker: Optional[int] = None
    validation_error: Optional[str] = None
    steps: int = 3                          # lines per rank in the default output
    pull_seconds: Optional[float] = None    # how long containers stay ContainerCreating (step_seconds)
    # An elastic job (a launcher running horovodrun --host-discovery-script) that waits below its
    # minimum this long fails, as Horovod does after its elastic timeout.
    elastic_timeout: float = 60.0
    # How long a worker pod that an elastic job's operator makes while it runs (a replacement, a
    # growth) stays Pending before it runs: a real one waits for its node, image and sshd.
    worker_start_seconds: float = 0.0
    # How often the fake's operator looks whether its MPIJob was deleted or suspended while it
    # waits (a thousand jobs at once need it to look less often than the tests' 50 ms).
    react_seconds: float = 0.05
    # TrainJobs: the rank whose worker fails (its node prints torchrun's summary and exits 1).
    failed_rank: Optional[int] = None


def default_output(np, steps=3):
    return [b"".join(f"[1,{r}]<stdout>:step {s} rank {r}\n".encode() for r in range(np))
            for s in range(1, steps + 1)]


def mpirun_error(name, ns, rank, worker):
    return (
        "--------------------------------------------------------------------------\n"
        "Primary job  terminated normally, but 1 process returned\n"
        "a non-zero exit code. Per user-direction, the job has been aborted.\n"
        "--------------------------------------------------------------------------\n"
        "--------------------------------------------------------------------------\n"
        f"mpirun noticed that process rank {rank} with PID 0 on node "
        f"{name}-worker-{worker}.{name}.{ns}.svc exited on signal 9 (Killed).\n"
        "--------------------------------------------------------------------------\n").encode()


class Gone(Exception):
    """The MPIJob was deleted (or the server stops): the thread unwinds."""


class Suspended(Exception):
    """The running job was suspended (Kueue preempted it): its pods go, and it starts over once
    it is unsuspended."""


class JobRunner(threading.Thread):
    resource = "mpijobs"

    def __init__(self, fake, job, scenario):
        super().__init__(daemon=True, name=f"fakekube-{job['metadata']['name']}")
        self.fake, self.store = fake, fake.store
        self.ns, self.name = job["metadata"]["namespace"], job["metadata"]["name"]
        self.uid = job["metadata"]["uid"]
        self.sc = scenario
        self.starting = {}                    # worker pod name -> when it starts running (sync_workers)
        self.released = threading.Event()     # release_unschedulable()
        spec = job["spec"]
        self.replica = spec["mpiReplicaSpecs"]
        self.workers = int((self.replica.get("Worker") or {}).get("replicas", 0) or 0)
        self.slots = int(spec.get("slotsPerWorker", 1) or 1)
        rp = spec.get("runPolicy") or {}
        self.backoff_limit = int(rp.get("backoffLimit", DEFAULT_BACKOFF_LIMIT))
        self.clean = rp.get("cleanPodPolicy", "None")
        self.ttl = rp.get("ttlSecondsAfterFinished")
        self.launcher_failed = 0
        self.node_of = {}
        self.elastic = elastic_options(self.replica)
        self.created = False                  # the Created condition and event are made once
        self.watch_suspend = False            # started: a suspension now stops the job

    # --- plumbing -----------------------------------------------------------------------------
    def alive(self):
        obj = self.store.objects.get((self.resource, self.ns, self.name))
        return (not self.fake.stopping.is_set() and obj is not None and obj["metadata"]["uid"] == self.uid)

    def pause(self, seconds=None):
        deadline = time.monotonic() + (self.sc.step_seconds if seconds is None else seconds)
        while True:
            if not self.alive():
                raise Gone()
            if self.watch_suspend and self.suspended_now():
                raise Suspended()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.fake.stopping.wait(min(left, self.sc.react_seconds))

    def wait_event(self, event):
        while not event.is_set():
            if not self.alive():
                raise Gone()
            if self.watch_suspend and self.suspended_now():
                raise Suspended()
            event.wait(0.05)

    def suspended_now(self):
        obj = self.store.objects.get((self.resource, self.ns, self.name))
        if obj is None:
            return False
        spec = obj["spec"]
        return bool((spec.get("runPolicy") or {}).get("suspend") if self.resource == "mpijobs" else spec.get("suspend"))

    def stop_for_suspend(self):
        """The operator's answer to a suspended running job: every pod of it goes (the launcher
        Job is suspended, the workers deleted), and the job says it is suspended."""
        self.watch_suspend = False
        for pod in self.store.list("pods", self.ns):
            labels = pod["metadata"].get("labels") or {}
            if labels.get(JOB_NAME) == self.name or labels.get(JOBSET_NAME) == self.name:
                self.fake.logs_close(pod)
                self.fake.delete_pod(self.ns, pod["metadata"]["name"])
        self.suspended_status()

    def suspended_status(self):
        msg = f"MPIJob {self.ns}/{self.name} is suspended."
        self.job_status(lambda st: st.update(replicaStatuses={"Launcher": {}, "Worker": {}}))
        self.condition("Running", "False", "MPIJobSuspended", msg)

    def job_status(self, mutate):
        def apply(obj):
            status = obj.setdefault("status", {})
            mutate(status)
            status["lastReconcileTime"] = rfc3339()
        if self.store.update(self.resource, self.ns, self.name, apply, uid=self.uid) is None:
            raise Gone()

    def condition(self, ctype, status, reason, message):
        def mutate(st):
            conds = st.setdefault("conditions", [])
            stamp = rfc3339()
            for c in conds:
                if c["type"] == ctype:
                    if c["status"] != status:
                        c["lastTransitionTime"] = stamp
                    c.update(status=status, reason=reason, message=message, lastUpdateTime=stamp)
                    break
            else:
                conds.append({"type": ctype, "status": status, "reason": reason, "message": message,
                              "lastUpdateTime": stamp, "lastTransitionTime": stamp})
            if ctype in ("Succeeded", "Failed") and status == "True":
                for c in conds:   # the operator's filterOutCondition: Running, and an earlier Failed, go False
                    if c["type"] in ("Running", "Failed") and c["type"] != ctype and c["status"] == "True":
                        c.update(status="False", lastUpdateTime=stamp, lastTransitionTime=stamp)
        self.job_status(mutate)

    def job_event(self, etype, reason, message):
        self.fake.record_event(self.ns, {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
                                         "name": self.name, "namespace": self.ns, "uid": self.uid},
                               etype, reason, message, {"component": CONTROLLER})

    def pod_event(self, pod, etype, reason, message, component="kubelet"):
        source = {"component": component}
        if component == "kubelet" and pod["spec"].get("nodeName"):
            source["host"] = pod["spec"]["nodeName"]
        self.fake.record_event(self.ns, {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
                                         "namespace": self.ns, "uid": pod["metadata"]["uid"],
                                         "fieldPath": f"spec.containers{{{pod['spec']['containers'][0]['name']}}}"
                                         if component == "kubelet" else None},
                               etype, reason, message, source)

    def pod_update(self, pod, mutate):
        new = self.store.update("pods", self.ns, pod["metadata"]["name"], mutate, uid=pod["metadata"]["uid"])
        if new is None:
            raise Gone() if not self.alive() else _PodGone()
        return new

    # --- pods ---------------------------------------------------------------------------------
    def make_pod(self, role, index=None, name=None):
        rtype = "Launcher" if role == "launcher" else "Worker"
        rspec = self.replica.get(rtype) or {}
        template = copy.deepcopy(rspec.get("template") or {})
        tmeta = template.get("metadata") or {}
        spec = template.get("spec") or {}
        labels = dict(tmeta.get("labels") or {})
        labels.update({OPERATOR: "mpi-operator", JOB_NAME: self.name, JOB_ROLE: role})
        owner = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "name": self.name, "uid": self.uid,
                 "controller": True, "blockOwnerDeletion": True}
        containers = spec.setdefault("containers", [{"name": role, "image": "busybox"}])
        for c in containers:
            c.setdefault("imagePullPolicy", "IfNotPresent")
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            c.setdefault("env", []).append({"name": "K_MPI_JOB_ROLE", "value": role})
        if role == "worker":
            labels[REPLICA_INDEX] = str(index)
            name = f"{self.name}-worker-{index}"
            spec["hostname"], spec["subdomain"] = name, self.name
            if not containers[0].get("command") and not containers[0].get("args"):
                containers[0]["command"] = ["/usr/sbin/sshd", "-De"]
        else:
            job_uid = self.fake.launcher_job_uid(self.uid)
            labels.update({"batch.kubernetes.io/job-name": f"{self.name}-launcher",
                           "job-name": f"{self.name}-launcher",
                           "batch.kubernetes.io/controller-uid": job_uid, "controller-uid": job_uid})
            owner = {"apiVersion": "batch/v1", "kind": "Job", "name": f"{self.name}-launcher",
                     "uid": job_uid, "controller": True, "blockOwnerDeletion": True}
        spec["restartPolicy"] = rspec.get("restartPolicy") or ("OnFailure" if role == "launcher" else "Never")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": self.ns, "labels": labels,
                            "annotations": dict(tmeta.get("annotations") or {}), "ownerReferences": [owner]},
               "spec": spec,
               "status": {"phase": "Pending", "qosClass": "BestEffort"}}
        return self.store.create("pods", pod)

    def waiting_statuses(self, pod, reason, message=None):
        statuses = []
        for c in pod["spec"]["containers"]:
            waiting = {"reason": reason}
            if message:
                waiting["message"] = message.replace("{image}", c.get("image", ""))
            statuses.append({"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False,
                             "restartCount": 0, "started": False, "state": {"waiting": waiting},
                             "lastState": {}})
        return statuses

    def schedule(self, pod):
        node = f"node-{random.randint(1, 3)}"
        stamp = rfc3339()

        def mutate(p):
            p["spec"]["nodeName"] = node
            p["status"].update(
                hostIP="10.0.0.1", startTime=stamp,
                conditions=[
                    {"type": "PodReadyToStartContainers", "status": "False", "lastTransitionTime": stamp},
                    {"type": "Initialized", "status": "True", "lastTransitionTime": stamp},
                    {"type": "Ready", "status": "False", "reason": "ContainersNotReady", "lastTransitionTime": stamp,
                     "message": f"containers with unready status: [{pod['spec']['containers'][0]['name']}]"},
                    {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady",
                     "lastTransitionTime": stamp},
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp}],
                containerStatuses=self.waiting_statuses(p, "ContainerCreating"))
        pod = self.pod_update(pod, mutate)
        self.pod_event(pod, "Normal", "Scheduled",
                       f"Successfully assigned {self.ns}/{pod['metadata']['name']} to {node}", "default-scheduler")
        return pod

    def unschedulable(self, pod):
        msg = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
        stamp = rfc3339()

        def mutate(p):
            p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                          "message": msg, "lastTransitionTime": stamp}]
        pod = self.pod_update(pod, mutate)
        self.pod_event(pod, "Warning", "FailedScheduling", msg, "default-scheduler")
        return pod

    def image_pull_fails(self, pod):
        image = pod["spec"]["containers"][0].get("image", "")
        self.pod_event(pod, "Normal", "Pulling", f'Pulling image "{image}"')
        err = (f'Failed to pull image "{image}": rpc error: code = NotFound desc = failed to pull and unpack '
               f'image "{image}": failed to resolve reference "{image}": {image}: not found')
        pod = self.pod_update(pod, lambda p: p["status"].update(
            containerStatuses=self.waiting_statuses(p, "ErrImagePull", err)))
        self.pod_event(pod, "Warning", "Failed", err)
        self.pod_event(pod, "Warning", "Failed", "Error: ErrImagePull")
        self.pause()
        pod = self.pod_update(pod, lambda p: p["status"].update(
            containerStatuses=self.waiting_statuses(p, "ImagePullBackOff", 'Back-off pulling image "{image}"')))
        self.pod_event(pod, "Normal", "BackOff", f'Back-off pulling image "{image}"')
        self.pod_event(pod, "Warning", "Failed", "Error: ImagePullBackOff")
        return pod

    def run_container(self, pod):
        """Pulled, Created, Started; the pod goes Running with its containers running."""
        c = pod["spec"]["containers"][0]
        self.pod_event(pod, "Normal", "Pulled", f'Container image "{c.get("image", "")}" already present on machine')
        self.pod_event(pod, "Normal", "Created", f"Created container: {c['name']}")
        stamp = rfc3339()

        def mutate(p):
            p["status"]["phase"] = "Running"
            p["status"]["podIP"] = f"10.1.0.{random.randint(2, 250)}"
            p["status"]["podIPs"] = [{"ip": p["status"]["podIP"]}]
            for cond in p["status"].get("conditions", []):
                if cond["type"] in ("Ready", "ContainersReady", "PodReadyToStartContainers"):
                    cond.update(status="True", lastTransitionTime=stamp)
                    cond.pop("reason", None)
                    cond.pop("message", None)
            p["status"]["containerStatuses"] = [
                {"name": cs["name"], "image": cs["image"], "imageID": f"docker.io/library/{cs['image']}@sha256:"
                 + uuid.uuid4().hex * 2, "containerID": "containerd://" + uuid.uuid4().hex * 2, "ready": True,
                 "restartCount": 0, "started": True, "state": {"running": {"startedAt": stamp}}, "lastState": {}}
                for cs in p["status"]["containerStatuses"]]
        self.fake.logs_open(pod)
        pod = self.pod_update(pod, mutate)
        self.pod_event(pod, "Normal", "Started", f"Started container {c['name']}")
        return pod

    def terminate(self, pod, exit_code, reason=None, pod_reason=None, pod_message=None):
        """The first container exits: flush its log, then the pod's phase follows."""
        self.fake.logs_close(pod)
        stamp = rfc3339()
        reason = reason or ("Completed" if exit_code == 0 else "Error")

        def mutate(p):
            p["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
            if pod_reason:
                p["status"]["reason"], p["status"]["message"] = pod_reason, pod_message
            for cond in p["status"].get("conditions", []):
                if cond["type"] in ("Ready", "ContainersReady"):
                    cond.update(status="False", reason="PodCompleted" if exit_code == 0 else "PodFailed",
                                lastTransitionTime=stamp)
            for cs in p["status"].get("containerStatuses", []):
                started = cs["state"].get("running", {}).get("startedAt", stamp)
                cs.update(ready=False, started=False, state={"terminated": {
                    "exitCode": exit_code, "reason": reason, "startedAt": started, "finishedAt": stamp,
                    "containerID": cs.get("containerID", "")}})
        return self.pod_update(pod, mutate)

    # --- the job ------------------------------------------------------------------------------
    def run(self):
        try:
            while True:
                try:
                    return self.reconcile()
                except Suspended:
                    self.stop_for_suspend()
        except (Gone, _PodGone):
            pass
        except Exception as exc:   # a bug in the fake must show up in the tests, not vanish
            self.fake.errors.append(exc)
            raise

    def reconcile(self):
        sc, ns, name = self.sc, self.ns, self.name
        problems = self.fake.validate_for_controller(self.store.get("mpijobs", ns, name))
        if sc.validation_error or problems:
            self.job_event("Warning", "ValidationError", sc.validation_error or "Invalid MPIJob: " + problems)
            return
        if not self.created:
            self.created = True
            msg = f"MPIJob {ns}/{name} is created."
            self.condition("Created", "True", "MPIJobCreated", msg)
            self.job_event("Normal", "MPIJobCreated", msg)
        self.wait_unsuspended()
        self.watch_suspend = True
        self.job_status(lambda st: st.update(startTime=rfc3339(), replicaStatuses={"Launcher": {}, "Worker": {}}))
        self.fake.create_owned_configmap(ns, name, self.uid, self.workers, self.slots)

        workers = [self.make_pod("worker", i) for i in range(self.workers)]
        launcher = None if sc.unschedulable else self.make_pod("launcher", name=self.launcher_name())
        self.pause()
        if sc.unschedulable:
            # the launcher is created once the workers fit (as with launcherCreationPolicy WaitForWorkersReady)
            workers = [self.unschedulable(w) for w in workers]
            self.wait_event(self.released)
            launcher = self.make_pod("launcher", name=self.launcher_name())
        workers = [self.schedule(w) for w in workers]
        launcher = self.schedule(launcher)
        self.job_status(lambda st: st["replicaStatuses"]["Launcher"].update(active=1))
        if sc.image_pull_error:
            for pod in workers + [launcher]:
                self.image_pull_fails(pod)
            while True:
                self.pause(3600)
        self.pause(sc.pull_seconds)
        workers = [self.run_container(w) for w in workers]
        self.job_status(lambda st: st["replicaStatuses"].update(Worker={"active": len(workers)}))

        attempts = sc.attempts or [(default_output(self.workers * self.slots, sc.steps), 0)]
        attempt = 0
        while True:
            chunks, exit_code = attempts[min(attempt, len(attempts) - 1)]
            if attempt > 0:
                launcher = self.schedule(self.make_pod("launcher", name=self.launcher_name()))
                self.job_status(lambda st: st["replicaStatuses"]["Launcher"].update(active=1))
                self.pause(sc.pull_seconds)
            launcher = self.run_container(launcher)
            if all(self.worker_phase(w) == "Running" for w in workers):
                msg = f"MPIJob {ns}/{name} is running."
                self.condition("Running", "True", "MPIJobRunning", msg)
                self.job_event("Normal", "MPIJobRunning", f"MPIJob {ns}/{name} is running")
            if self.elastic is not None:
                ended, workers = self.play_elastic(launcher, workers)
            else:
                ended = self.play(launcher, workers, chunks, exit_code, attempt)
            if ended == "evicted":
                return self.finish(workers)
            if ended == 0:
                msg = f"MPIJob {ns}/{name} successfully completed."
                self.job_status(lambda st: (st["replicaStatuses"]["Launcher"].update(active=0, succeeded=1),
                                            st.update(completionTime=rfc3339())))
                self.condition("Succeeded", "True", "MPIJobSucceeded", msg)
                self.job_event("Normal", "MPIJobSucceeded", msg)
                return self.finish(workers)
            self.launcher_failed += 1
            self.job_status(lambda st: st["replicaStatuses"]["Launcher"].update(active=0, failed=self.launcher_failed))
            if self.launcher_failed > self.backoff_limit:
                # mpi-operator: reason "<Job reason>/<last failed pod's status.reason>", message likewise.
                reason = "BackoffLimitExceeded/" + (launcher["status"].get("reason") or "")
                msg = "Job has reached the specified backoff limit: " + (launcher["status"].get("message") or "")
                self.job_status(lambda st: st.update(completionTime=rfc3339()))
                self.condition("Failed", "True", reason, msg)
                self.job_event("Warning", reason, msg)
                return self.finish(workers)
            attempt += 1
            self.pause()

    def play(self, launcher, workers, chunks, exit_code, attempt):
        """The launcher prints; trouble strikes after the first chunk. Returns the exit code or 'evicted'."""
        sc = self.sc
        for i, chunk in enumerate(chunks):
            self.fake.logs_write(launcher, chunk)
            if i == 0 and sc.hold is not None:
                self.wait_event(sc.hold)
            if i == 0 and sc.oom_worker is not None and self.worker_phase(workers[sc.oom_worker]) == "Running":
                self.pause()
                self.terminate(workers[sc.oom_worker], 137, "OOMKilled")
                self.job_status(lambda st: st["replicaStatuses"].update(
                    Worker={"active": self.workers - 1, "failed": 1}))
                self.pause()
                self.fake.logs_write(launcher, mpirun_error(self.name, self.ns, sc.oom_worker * self.slots,
                                                            sc.oom_worker))
                self.pause()
                self.terminate(launcher, 1)
                return 1
            if i == 0 and sc.evict_worker is not None:
                self.pause()
                self.evict(workers[sc.evict_worker])
                self.pause()
                self.fake.logs_write(launcher, mpirun_error(self.name, self.ns, sc.evict_worker * self.slots,
                                                            sc.evict_worker))
                self.terminate(launcher, 1)
                self.job_status(lambda st: st.update(completionTime=rfc3339()))
                return "evicted"
            if sc.oom_worker is not None and attempt > 0:
                # the OOM-killed worker is gone for good: mpirun cannot reach it
                self.fake.logs_write(launcher, f"ssh: connect to host {self.name}-worker-{sc.oom_worker}."
                                     f"{self.name}.{self.ns}.svc port 22: Connection refused\n".encode())
                self.pause()
                self.terminate(launcher, 1)
                return 1
            self.pause()
        self.terminate(launcher, exit_code)
        return exit_code

    # --- elastic jobs (mpi-operator v2: getOrCreateWorker, updateDiscoverHostsInConfigMap) -----
    def sync_workers(self):
        """The operator's reconcile of worker pods against spec Worker.replicas: pods at an index
        at or above it are deleted, a missing one below it is made (and started)."""
        job = self.store.get("mpijobs", self.ns, self.name)
        if job is None or job["metadata"]["uid"] != self.uid:
            raise Gone()
        replicas = int(job["spec"]["mpiReplicaSpecs"]["Worker"].get("replicas", 0))
        selector = f"{JOB_NAME}={self.name},{JOB_ROLE}=worker"
        for pod in self.fake.pods(self.ns, selector):
            if int(pod["metadata"]["labels"][REPLICA_INDEX]) >= replicas:
                self.fake.delete_pod(self.ns, pod["metadata"]["name"])
        workers = []
        for i in range(replicas):
            name = f"{self.name}-worker-{i}"
            pod = self.store.get("pods", self.ns, name)
            if pod is None:
                pod = self.schedule(self.make_pod("worker", i))
                self.starting[name] = time.monotonic() + self.sc.worker_start_seconds
            if name in self.starting and time.monotonic() >= self.starting[name]:
                del self.starting[name]
                pod = self.run_container(pod)
            workers.append(pod)
        self.workers = replicas
        return workers

    def sync_discovery(self):
        """discover_hosts.sh in the job's ConfigMap: one `echo` per Running worker, by name.
        Returns the hosts it lists."""
        running = sorted(p["metadata"]["name"] for p in self.fake.pods(self.ns, f"{JOB_NAME}={self.name},"
                                                                                 f"{JOB_ROLE}=worker")
                         if p["status"].get("phase") == "Running")
        hosts = [f"{pod}.{self.name}.{self.ns}.svc" for pod in running]
        script = "#!/bin/sh\n" + "".join(f"echo {host}\n" for host in hosts)

        def mutate(cm):
            cm.setdefault("data", {})["discover_hosts.sh"] = script
        self.store.update("configmaps", self.ns, f"{self.name}-config", mutate)
        return hosts

    def evict(self, w):
        """The kubelet evicts worker `w`; the operator counts it and says MPIJobEvicted (Failed)
        while the launcher runs on."""
        self.fake.logs_close(w)
        self.terminate(w, 137, "Error", "Evicted", "The node was low on resource: memory.")
        self.pod_event(w, "Warning", "Evicted", "The node was low on resource: memory.")
        msg = f"1/{self.workers} workers are evicted"
        self.job_status(lambda st: st["replicaStatuses"].update(Worker={"active": self.workers - 1, "failed": 1}))
        self.condition("Failed", "True", "MPIJobEvicted", msg)
        self.job_event("Warning", "MPIJobEvicted", msg)

    def play_elastic(self, launcher, workers):
        """horovodrun in elastic mode: each step it reads the discovery script and trains on what
        it lists (hosts x --slots-per-host ranks, each printing `step n size k`); below --min-np
        it waits. Runs `steps` steps, or until `hold` is set. Returns (exit code, workers)."""
        sc, min_np, slots = self.sc, *self.elastic
        step, waiting_since = 0, None
        while True:
            workers = self.sync_workers()
            size = len(self.sync_discovery()) * slots
            if size < min_np:
                waiting_since = waiting_since or time.monotonic()
                if time.monotonic() - waiting_since > sc.elastic_timeout:
                    self.fake.logs_write(launcher, b"[0]<stderr>:horovod.runner.elastic: timed out waiting "
                                                   b"for the minimum number of hosts\n")
                    self.terminate(launcher, 1)
                    return 1, workers
                self.pause()
                continue
            waiting_since = None
            step += 1
            self.fake.logs_write(launcher, b"".join(f"[{r}]<stdout>:step {step} size {size}\n".encode()
                                                    for r in range(size)))
            if step == 1 and sc.evict_worker is not None:
                self.pause()
                self.evict(workers[sc.evict_worker])
            self.pause()
            if (sc.hold.is_set() if sc.hold is not None else step >= sc.steps):
                self.terminate(launcher, 0)
                return 0, workers

    def finish(self, workers):
        for w in workers:
            phase = self.worker_phase(w)
            if self.clean == "All" or (self.clean == "Running" and phase in ("Running", "Pending")):
                self.fake.delete_pod(self.ns, w["metadata"]["name"])
        if self.ttl is not None:
            self.pause(float(self.ttl))
            for pod in self.fake.pods(self.ns, f"{JOB_NAME}={self.name},{JOB_ROLE}=launcher"):
                self.fake.delete_pod(self.ns, pod["metadata"]["name"])

    def worker_phase(self, w):
        pod = self.store.get("pods", self.ns, w["metadata"]["name"])
        return pod and pod["status"].get("phase")

    def launcher_name(self):
        return f"{self.name}-launcher-" + "".join(random.choice(RAND_ALPHABET) for _ in range(5))

    def wait_unsuspended(self):
        def suspended():
            obj = self.store.get("mpijobs", self.ns, self.name)
            if obj is None or obj["metadata"]["uid"] != self.uid:
                raise Gone()
            return bool((obj["spec"].get("runPolicy") or {}).get("suspend"))
        if not suspended():
            return
        msg = f"MPIJob {self.ns}/{self.name} is suspended."
        self.condition("Suspended", "True", "MPIJobSuspended", msg)
        self.condition("Running", "False", "MPIJobSuspended", msg)
        self.job_event("Normal", "MPIJobSuspended", msg)
        while suspended():
            self.pause(0.05)
        msg = f"MPIJob {self.ns}/{self.name} is resumed."
        self.condition("Suspended", "False", "MPIJobResumed", msg)
        self.job_event("Normal", "MPIJobResumed", msg)


def elastic_options(replica):
    """(--min-np, --slots-per-host) of a launcher running horovodrun in elastic mode, else None."""
    containers = ((replica.get("Launcher") or {}).get("template") or {}).get("spec", {}).get("containers") or [{}]
    command = containers[0].get("command") or []
    if "--host-discovery-script" not in command:
        return None
    option = lambda name, default: int(command[command.index(name) + 1]) if name in command else default  # noqa: E731
    return option("--min-np", 1), option("--slots-per-host", 1)


class _PodGone(Exception):
    """A pod of the job was deleted (by a test or cleanup) while the runner touched it."""


def torchrun_output(nodes, per_node, steps=3):
    """What each node's pod prints under torchrun with the rank launcher: each worker's lines
    carry its global rank as horovodrun's do. [node][step] -> bytes."""
    return [[b"".join(f"[{rank}]<stdout>:step {step} rank {rank}\n".encode()
                      for rank in range(node * per_node, (node + 1) * per_node))
             for step in range(1, steps + 1)] for node in range(nodes)]


def torchrun_failure(rank, local_rank, host):
    """What a node's torchrun agent prints when worker `rank` fails (its error file's root cause)."""
    return (
        f"[{rank}]<stderr>:Traceback (most recent call last):\n"
        f"[{rank}]<stderr>:  File \"train.py\", line 12, in <module>\n"
        f"[{rank}]<stderr>:RuntimeError: rank {rank} broke\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "============================================================\n"
        "ringmaster_rank FAILED\n"
        "------------------------------------------------------------\n"
        "Failures:\n"
        "  <NO_OTHER_FAILURES>\n"
        "------------------------------------------------------------\n"
        "Root Cause (first observed failure):\n"
        "[0]:\n"
        "  time      : 2026-12-04_07:00:00\n"
        f"  host      : {host}\n"
        f"  rank      : {rank} (local_rank: {local_rank})\n"
        "  exitcode  : 1 (pid: 4242)\n"
        "  error_file: /tmp/torchelastic_x/none_y/attempt_0/0/error.json\n"
        "  traceback : Traceback (most recent call last):\n"
        f"    RuntimeError: rank {rank} broke\n"
        "============================================================\n").encode()


class TrainJobRunner(JobRunner):
    """Kubeflow Trainer and JobSet for one TrainJob: the runtime's replicated Job `node` of
    numNodes indexed pods (`<job>-node-0-<index>-<suffix>`), the torch plugin's PET_ variables,
    and the TrainJob's conditions (Created, Suspended, Complete, Failed). The Scenario's
    `attempts`, if given, is [(output chunks, exit code)] per node; else each node prints its
    ranks' lines (torchrun_output) and, with `failed_rank`, that rank's node fails."""

    resource = "trainjobs"

    def __init__(self, fake, job, scenario):
        threading.Thread.__init__(self, daemon=True, name=f"fakekube-trainjob-{job['metadata']['name']}")
        self.fake, self.store = fake, fake.store
        self.ns, self.name = job["metadata"]["namespace"], job["metadata"]["name"]
        self.uid = job["metadata"]["uid"]
        self.sc = scenario
        self.released = threading.Event()
        self.created = False
        self.watch_suspend = False
        self.job = job
        trainer = job["spec"].get("trainer") or {}
        self.nodes = int(trainer.get("numNodes") or 1)
        self.per_node = int(trainer.get("numProcPerNode") or 1)

    def job_status(self, mutate):
        def apply(obj):
            mutate(obj.setdefault("status", {}))
            for cond in obj["status"].get("conditions", []):
                cond.pop("lastUpdateTime", None)     # a TrainJob's conditions are metav1.Conditions
        if self.store.update(self.resource, self.ns, self.name, apply, uid=self.uid) is None:
            raise Gone()

    def job_event(self, etype, reason, message):
        self.fake.record_event(self.ns, {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                         "name": self.name, "namespace": self.ns, "uid": self.uid},
                               etype, reason, message, {"component": "trainer-controller-manager"})

    def _patch(self):
        """The pod template patch of the runtime's `node` job (runtimePatches), merged."""
        template = {"metadata": {}, "spec": {}}
        for patch in self.job["spec"].get("runtimePatches") or []:
            for rjob in (((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}).get(
                    "replicatedJobs") or []:
                if rjob.get("name") == "node":
                    pod = ((rjob.get("template") or {}).get("spec") or {}).get("template") or {}
                    template["metadata"].update(pod.get("metadata") or {})
                    template["spec"].update(copy.deepcopy(pod.get("spec") or {}))
        return template

    def make_node_pod(self, index):
        trainer = self.job["spec"].get("trainer") or {}
        patch = self._patch()
        labels = {**(patch["metadata"].get("labels") or {}), JOBSET_NAME: self.name, REPLICATED_JOB: "node",
                  JOB_INDEX: "0", COMPLETION_INDEX: str(index), ANCESTOR: "trainer",
                  "batch.kubernetes.io/job-name": f"{self.name}-node-0", "job-name": f"{self.name}-node-0"}
        pspec = patch["spec"]
        overrides = {c["name"]: c for c in pspec.pop("containers", [])}
        env = [*(trainer.get("env") or []),
               {"name": "PET_NNODES", "value": str(self.nodes)},
               {"name": "PET_NPROC_PER_NODE", "value": str(self.per_node)},
               {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {
                   "fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}},
               {"name": "PET_MASTER_ADDR", "value": f"{self.name}-node-0-0.{self.name}"},
               {"name": "PET_MASTER_PORT", "value": str(TRAINER_PORT)}]
        container = {"name": "node", "image": trainer.get("image") or "pytorch/pytorch",
                     "command": trainer.get("command") or [], "args": trainer.get("args") or [], "env": env,
                     "resources": copy.deepcopy(trainer.get("resourcesPerNode") or {}),
                     "ports": [{"containerPort": TRAINER_PORT, "protocol": "TCP"}],
                     "imagePullPolicy": "IfNotPresent", "terminationMessagePath": "/dev/termination-log",
                     "terminationMessagePolicy": "File"}
        for key in ("volumeMounts", "securityContext"):
            if key in overrides.get("node", {}):
                container[key] = overrides["node"][key]
        job_uid = self.fake.launcher_job_uid(self.uid)
        suffix = "".join(random.choice(RAND_ALPHABET) for _ in range(5))
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"{self.name}-node-0-{index}-{suffix}", "namespace": self.ns, "labels": labels,
                            "annotations": {COMPLETION_INDEX: str(index)},
                            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                                 "name": f"{self.name}-node-0", "uid": job_uid,
                                                 "controller": True, "blockOwnerDeletion": True}]},
               "spec": {**pspec, "containers": [container], "restartPolicy": "Never",
                        "hostname": f"{self.name}-node-0-{index}", "subdomain": self.name,
                        "schedulerName": "default-scheduler", "dnsPolicy": "ClusterFirst",
                        "terminationGracePeriodSeconds": 30},
               "status": {"phase": "Pending", "qosClass": "Burstable"}}
        return self.store.create("pods", pod)

    def wait_unsuspended(self):
        def suspended():
            obj = self.store.get("trainjobs", self.ns, self.name)
            if obj is None or obj["metadata"]["uid"] != self.uid:
                raise Gone()
            return bool(obj["spec"].get("suspend"))
        if not suspended():
            return
        self.condition("Suspended", "True", "Suspended", "TrainJob is suspended")
        while suspended():
            self.pause(0.05)
        self.condition("Suspended", "False", "Resumed", "TrainJob is resumed")

    def suspended_status(self):
        self.job_status(lambda st: st.update(jobsStatus=[{"name": "node", "active": 0, "ready": 0, "succeeded": 0,
                                                          "failed": 0, "suspended": 1}]))

    def reconcile(self):
        sc = self.sc
        if not self.created:
            self.created = True
            self.condition("Created", "True", "JobsCreationSucceeded", "Succeeded to create Jobs")
            self.job_event("Normal", "Created", f"TrainJob {self.ns}/{self.name} is created")
        self.wait_unsuspended()
        self.watch_suspend = True
        pods = [self.make_node_pod(i) for i in range(self.nodes)]
        self.pause()
        if sc.unschedulable:
            pods = [self.unschedulable(p) for p in pods]
            self.wait_event(self.released)
        pods = [self.schedule(p) for p in pods]
        if sc.image_pull_error:
            for pod in pods:
                self.image_pull_fails(pod)
            while True:
                self.pause(3600)
        self.pause(sc.pull_seconds)
        pods = [self.run_container(p) for p in pods]
        self.job_status(lambda st: st.update(jobsStatus=[{"name": "node", "active": 1, "ready": 1, "succeeded": 0,
                                                          "failed": 0, "suspended": 0}]))
        outputs = sc.attempts or [(chunks, 0) for chunks in torchrun_output(self.nodes, self.per_node, sc.steps)]
        failing = None if sc.failed_rank is None else sc.failed_rank // self.per_node
        steps = max(len(chunks) for chunks, _ in outputs)
        for step in range(steps):
            for node, (chunks, _) in enumerate(outputs):
                if step < len(chunks):
                    self.fake.logs_write(pods[node], chunks[step])
            if step == 0 and sc.hold is not None:
                self.wait_event(sc.hold)
            if step == 0 and failing is not None:
                self.pause()
                host = pods[failing]["spec"]["hostname"]
                self.fake.logs_write(pods[failing], torchrun_failure(sc.failed_rank, sc.failed_rank % self.per_node,
                                                                     host))
                self.terminate(pods[failing], 1)
                self.pause()
                for node, pod in enumerate(pods):   # the Job failed: JobSet stops its other pods
                    if node != failing:
                        self.terminate(pod, 143)
                self.fail("FailedJobs", "jobset failed due to one or more job failures")
                return
            self.pause()
        codes = [code for _, code in outputs]
        for pod, code in zip(pods, codes):
            self.terminate(pod, code)
        if any(codes):
            self.fail("FailedJobs", "jobset failed due to one or more job failures")
            return
        self.job_status(lambda st: st.update(jobsStatus=[{"name": "node", "active": 0, "ready": 0, "succeeded": 1,
                                                          "failed": 0, "suspended": 0}]))
        self.condition("Complete", "True", "AllJobsCompleted", "jobset completed successfully")
        self.job_event("Normal", "Completed", f"TrainJob {self.ns}/{self.name} completed")

    def fail(self, reason, message):
        self.job_status(lambda st: st.update(jobsStatus=[{"name": "node", "active": 0, "ready": 0, "succeeded": 0,
                                                          "failed": 1, "suspended": 0}]))
        self.condition("Failed", "True", reason, message)
        self.job_event("Warning", reason, message)
