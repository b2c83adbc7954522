"""FakeKube: a kube-apiserver speaking enough of the protocol for the `kubernetes` Python client, with
an MPI operator and a kubelet inside (see sim.py)."""
import copy
import dataclasses
import datetime
import http.server
import json
import queue
import re
import secrets
import socket
import sys
import threading
import time
import urllib.parse
import uuid
from typing import Optional

import yaml

from . import schema as crd
from .kueue import Kueue
from .sim import JOB_NAME, JOBSET_NAME, JobRunner, Scenario, TrainJobRunner
from .store import (CLUSTER_SCOPED, KUEUE_RESOURCES, RESOURCES, WORKLOADS, ApiError, Store, api_version, bad_request,
                    not_found, parse_field_selector, parse_label_selector, rfc3339)

HTTP_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 409: "Conflict",
                410: "Gone", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
                503: "ServiceUnavailable", 504: "Timeout"}
DEFAULT_WATCH_SECONDS = 1800


@dataclasses.dataclass
class Faults:
    """Plain attributes tests set; each *_once resets itself when used."""
    create_errors: list = dataclasses.field(default_factory=list)   # HTTP codes for the next MPIJob creates
    create_slow_once: float = 0.0       # the next MPIJob create stores the object, then sleeps this long
    create_errors_after_store: list = dataclasses.field(default_factory=list)   # codes the next creates
                                        # answer after storing the object (a proxy or etcd timeout)
    watch_gone_once: bool = False       # the next MPIJob watch with a resourceVersion gets 410 Expired
    cut_log_once_after: Optional[int] = None   # the next follow log stream drops after N body bytes
    delay: float = 0.0                  # seconds before answering every request
    errors: dict = dataclasses.field(default_factory=dict)   # {(verb, resource): [codes]}, one per call


def _bool(value):
    """Go's strconv.ParseBool, which the apiserver uses for query parameters (the client sends True)."""
    return value in ("1", "t", "T", "true", "TRUE", "True")


def _ts(ns):
    t = datetime.datetime.fromtimestamp(ns // 1_000_000_000, datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S") + f".{ns % 1_000_000_000:09d}Z"


def _parse_time(text):
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise bad_request(f'parsing time "{text}" as "2006-01-02T15:04:05Z07:00": cannot parse')


def merge_patch(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    target = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = merge_patch(target.get(key), value)
    return target


def json_patch(target, ops):
    doc = copy.deepcopy(target)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.setdefault(p, {})
        last = parts[-1]
        if op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                parent.insert(len(parent) if last == "-" else int(last), op["value"]) if op["op"] == "add" \
                    else parent.__setitem__(int(last), op["value"])
            else:
                parent[last] = op["value"]
        elif op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif op["op"] == "test":
            if parent[int(last) if isinstance(parent, list) else last] != op["value"]:
                raise ApiError(422, "Invalid", f"testing value {op['path']} failed")
        else:
            raise bad_request(f"unsupported json patch op {op['op']}")
    return doc


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        """A client dropping a kept-alive connection is normal (a real API server says nothing)."""
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)


class FakeKube:
    def __init__(self, token=None, history_limit=1000, crd_path=crd.CRD_PATH):
        self.token = token or secrets.token_hex(16)
        self.store = Store(history_limit)
        self.crd = crd.CRDSchema(crd.load_crd_schema(crd_path))   # the schema is parsed once per process
        self.schemas = {"mpijobs": self.crd, "trainjobs": crd.CRDSchema(crd.load_crd_schema(crd.TRAINJOB_CRD_PATH))}
        # The ClusterTrainingRuntimes installed: Trainer's webhook refuses a TrainJob naming another.
        self.training_runtimes = {"torch-distributed"}
        self.scenario = Scenario()
        self.scenarios = {}
        self.faults = Faults()
        self.requests = []          # (verb, group, resource, subresource, namespace, name)
        self.raw_requests = []      # (method, path?query, status code)
        self.errors = []            # exceptions raised inside runner threads (a bug in the fake)
        self.runners = {}           # (ns, name) -> JobRunner of the current object
        self.kueue = None           # Kueue (kueue.py) once enable_kueue() made it
        self.stopping = threading.Event()
        self._logs = {}             # pod uid -> {"lines": [(ns, bytes)], "partial": bytearray, "done": bool}
        self._job_uids = {}
        self._event_names = {}      # (namespace, involved uid, reason, message, type) -> event name
        self._server = None
        self._thread = None
        self._sockets = set()

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self):
        fake = self

        class Handler(_Handler):
            pass
        Handler.fake = fake
        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True, name="fakekube-http")
        self._thread.start()
        return self

    def stop(self):
        self.stopping.set()
        with self.store.lock:
            self.store.changed.notify_all()
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            for sock in list(self._sockets):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def enable_kueue(self, **options):
        """Install Kueue (tests/fakekube/kueue.py): its API group is served from now on, its
        webhook suspends labelled jobs, its controller admits them. `options`: Kueue's."""
        self.kueue = Kueue(self, **options)
        self.kueue.start()
        return self.kueue

    @property
    def url(self):
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def kubeconfig_text(self, namespace="default", context="fake"):
        return yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": "fakekube", "cluster": {"server": self.url}}],
            "users": [{"name": "ringmaster", "user": {"token": self.token}}],
            "contexts": [{"name": context, "context": {"cluster": "fakekube", "user": "ringmaster",
                                                       "namespace": namespace}}],
            "current-context": context}, sort_keys=False)

    def write_kubeconfig(self, path, namespace="default", context="fake"):
        with open(path, "w") as f:
            f.write(self.kubeconfig_text(namespace, context))
        return path

    # --- accessors for tests ------------------------------------------------------------------
    def mpijob(self, ns, name):
        return self.store.get("mpijobs", ns, name)

    def mpijobs(self, ns=None):
        return self.store.list("mpijobs", ns)

    def trainjob(self, ns, name):
        return self.store.get("trainjobs", ns, name)

    def trainjobs(self, ns=None):
        return self.store.list("trainjobs", ns)

    def node_pods(self, ns, name):
        """A TrainJob's node pods, in node order."""
        pods = self.pods(ns, f"{JOBSET_NAME}={name}")
        return sorted(pods, key=lambda p: int(p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]))

    def configmaps(self, ns=None):
        return self.store.list("configmaps", ns)

    def pods(self, ns=None, selector=None):
        match = parse_label_selector(selector) if selector else None
        return self.store.list("pods", ns, (lambda o: match(o["metadata"].get("labels"))) if match else None)

    def launcher_pods(self, ns, name):
        pods = self.pods(ns, f"{JOB_NAME}={name},training.kubeflow.org/job-role=launcher")
        return sorted(pods, key=lambda p: int(p["metadata"]["resourceVersion"]))

    def events(self, ns=None, name=None, kind=None, reason=None):
        def match(e):
            io = e["involvedObject"]
            return ((name is None or io.get("name") == name) and (kind is None or io.get("kind") == kind)
                    and (reason is None or e["reason"] == reason))
        return sorted(self.store.list("events", ns, match), key=lambda e: int(e["metadata"]["resourceVersion"]))

    def logs(self, ns, pod_name, timestamps=False):
        pod = self.store.get("pods", ns, pod_name)
        if pod is None:
            return None
        with self.store.lock:
            lines = list(self._logs.get(pod["metadata"]["uid"], {}).get("lines", []))
        return b"".join((_ts(t).encode() + b" " if timestamps else b"") + line for t, line in lines).decode()

    def verbs(self):
        return {r[:4] for r in list(self.requests)}

    def wait_for(self, predicate, timeout=5.0, message="condition"):
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {message}")
            with self.store.lock:
                self.store.changed.wait(0.05)

    def compact(self):
        """Drop the watch history: any watch from an older resourceVersion now gets 410 Expired."""
        self.store.compact()

    def release_unschedulable(self, name, ns=None):
        for (n, job), runner in list(self.runners.items()):
            if job == name and (ns is None or n == ns):
                runner.released.set()

    def delete_mpijob(self, ns, name, propagation_policy="Background"):
        """A deletion behind the portal's back (kubectl delete mpijob): same as an API DELETE."""
        return self._delete_mpijob(ns, name, propagation_policy)

    def delete_pod(self, ns, name):
        obj = self.store.delete("pods", ns, name)
        if obj:
            with self.store.lock:
                self._logs.pop(obj["metadata"]["uid"], None)
        return obj

    # --- used by the runners ------------------------------------------------------------------
    def record_event(self, ns, involved, etype, reason, message, source):
        involved = {k: v for k, v in involved.items() if v is not None}
        stamp = rfc3339()
        # The same event again is counted on the one recorded (as the kubelet's aggregation does),
        # found by its key rather than by scanning every event (quadratic at 1,000 jobs).
        key = (ns, involved.get("uid"), reason, message, etype)
        with self.store.lock:
            if key in self._event_names:
                again = self.store.update("events", ns, self._event_names[key], lambda o: o.update(
                    count=o["count"] + 1, lastTimestamp=stamp))
                if again is not None:
                    return again
            made = self.store.create("events", {
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{involved['name']}.{uuid.uuid4().hex[:16]}", "namespace": ns},
                "involvedObject": involved, "reason": reason, "message": message, "type": etype,
                "source": source, "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
                "eventTime": None, "reportingComponent": source["component"],
                "reportingInstance": source.get("host", "")})
            self._event_names[key] = made["metadata"]["name"]
            return made

    def launcher_job_uid(self, mpijob_uid):
        return self._job_uids.setdefault(mpijob_uid, str(uuid.uuid4()))

    def create_owned_configmap(self, ns, name, uid, workers, slots):
        hostfile = "".join(f"{name}-worker-{i}.{name}.{ns}.svc slots={slots}\n" for i in range(workers))
        try:
            self.store.create("configmaps", {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": f"{name}-config", "namespace": ns, "labels": {"app": name},
                             "ownerReferences": [{"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
                                                  "name": name, "uid": uid, "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "data": {"hostfile": hostfile, "discover_hosts.sh": "#!/bin/sh\n"}})
        except ApiError:
            pass

    def _admit_trainjob_webhook(self, obj):
        """Trainer's validating webhook: the runtime must exist, and torchrun's reserved
        variables belong to the runtime."""
        name = obj["metadata"].get("name", "")
        problems = []
        runtime = (obj["spec"].get("runtimeRef") or {}).get("name", "")
        if runtime not in self.training_runtimes:
            problems.append(f'spec.runtimeRef: Invalid value: "{runtime}": ClusterTrainingRuntime.trainer.kubeflow.org '
                            f'"{runtime}" not found')
        reserved = sorted({e.get("name") for e in (obj["spec"].get("trainer") or {}).get("env") or []}
                          & {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"})
        if reserved:
            problems.append(f"spec.trainer.env: Invalid value: must not have reserved envs, invalid envs configured: "
                            f"{reserved}")
        if problems:
            raise ApiError(422, "Invalid", 'admission webhook "validate--v1alpha1-trainjob.kb.io" denied the request: '
                           f'TrainJob.trainer.kubeflow.org "{name}" is invalid: ' + ", ".join(problems))

    def validate_for_controller(self, job):
        """The checks mpi-operator's validation.go makes at reconcile time ('' when fine)."""
        if job is None:
            return ""
        errs = []
        specs = job["spec"].get("mpiReplicaSpecs") or {}
        launcher, worker = specs.get("Launcher"), specs.get("Worker")
        if launcher is None:
            errs.append('spec.mpiReplicaSpecs[Launcher]: Required value: must have Launcher replica spec')
        elif launcher.get("replicas", 1) != 1:
            errs.append(f"spec.mpiReplicaSpecs[Launcher].replicas: Invalid value: {launcher.get('replicas')}: "
                        "must be 1")
        if worker is not None and worker.get("replicas", 0) < 1:
            errs.append(f"spec.mpiReplicaSpecs[Worker].replicas: Invalid value: {worker.get('replicas')}: "
                        "must be greater than or equal to 1")
        for rtype, rspec in specs.items():
            if rspec and rspec.get("restartPolicy") not in (None, "Never", "OnFailure"):
                errs.append(f'spec.mpiReplicaSpecs[{rtype}].restartPolicy: Unsupported value: '
                            f'"{rspec["restartPolicy"]}": supported values: "Never", "OnFailure"')
            if rspec and not ((rspec.get("template") or {}).get("spec") or {}).get("containers"):
                errs.append(f"spec.mpiReplicaSpecs[{rtype}].template.spec.containers: Required value: "
                            "must define at least one container")
        policy = job["spec"].get("runPolicy") or {}
        if policy.get("cleanPodPolicy", "None") not in ("None", "Running", "All"):
            errs.append(f'spec.runPolicy.cleanPodPolicy: Unsupported value: "{policy["cleanPodPolicy"]}": '
                        'supported values: "None", "Running", "All"')
        for field in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
            if isinstance(policy.get(field), int) and policy[field] < 0:
                errs.append(f"spec.runPolicy.{field}: Invalid value: {policy[field]}: must be greater than or "
                            "equal to 0")
        name = (job.get("metadata") or {}).get("name", "")
        hostname = f"{name}-worker-{max((worker or {}).get('replicas', 1) - 1, 0)}"
        if len(hostname) > 63 or not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", hostname):
            errs.append(f'metadata.name: Invalid value: "{name}": will not able to create pod and service '
                        "with invalid DNS label")
        return ", ".join(errs) if len(errs) < 2 else "[" + ", ".join(errs) + "]"

    # kubelet logs: lines are timestamped when completed; a partial line waits for its newline
    def logs_open(self, pod):
        with self.store.lock:
            # Each log has a condition of its own: a write wakes that log's readers, not every one.
            self._logs.setdefault(pod["metadata"]["uid"], {"lines": [], "partial": bytearray(), "done": False,
                                                           "written": threading.Condition(self.store.lock)})

    def logs_write(self, pod, data):
        with self.store.lock:
            log = self._logs.get(pod["metadata"]["uid"])
            if log is None:
                return
            log["partial"].extend(data)
            while b"\n" in log["partial"]:
                i = log["partial"].index(b"\n")
                log["lines"].append((time.time_ns(), bytes(log["partial"][:i + 1])))
                del log["partial"][:i + 1]
            log["written"].notify_all()
            self.store.changed.notify_all()

    def logs_close(self, pod):
        with self.store.lock:
            log = self._logs.get(pod["metadata"]["uid"])
            if log is None:
                return
            if log["partial"]:
                log["lines"].append((time.time_ns(), bytes(log["partial"]) + b"\n"))
                log["partial"].clear()
            log["done"] = True
            log["written"].notify_all()
            self.store.changed.notify_all()

    # --- API operations -----------------------------------------------------------------------
    def _delete_mpijob(self, ns, name, policy, resource="mpijobs"):
        obj = self.store.get(resource, ns, name)
        if obj is None:
            raise not_found(resource, name)
        policy = policy or "Background"
        uid = obj["metadata"]["uid"]
        result = None
        if policy == "Foreground":
            result = self.store.update(resource, ns, name, lambda o: o["metadata"].update(
                deletionTimestamp=rfc3339(), deletionGracePeriodSeconds=0, finalizers=["foregroundDeletion"]))
            self._delete_dependents(ns, name, uid)
            self.store.delete(resource, ns, name, uid=uid)
        else:
            self.store.delete(resource, ns, name, uid=uid)
            if policy != "Orphan":
                self._delete_dependents(ns, name, uid)
        self.runners.pop((ns, name), None)
        return result

    def delete_trainjob(self, ns, name, propagation_policy="Background"):
        """A deletion behind the portal's back (kubectl delete trainjob): same as an API DELETE."""
        return self._delete_mpijob(ns, name, propagation_policy, "trainjobs")

    def _delete_dependents(self, ns, name, uid):
        for pod in self.store.list("pods", ns):
            owners = {o.get("uid") for o in pod["metadata"].get("ownerReferences", [])}
            labels = pod["metadata"].get("labels") or {}
            if labels.get(JOB_NAME) == name or labels.get(JOBSET_NAME) == name or uid in owners \
                    or self._job_uids.get(uid) in owners:
                self.delete_pod(ns, pod["metadata"]["name"])
        for cm in self.store.list("configmaps", ns):
            if any(o.get("uid") == uid for o in cm["metadata"].get("ownerReferences", [])):
                self.store.delete("configmaps", ns, cm["metadata"]["name"])

    def _admit_mpijob(self, ns, body, name_in_url=None, resource="mpijobs"):
        """Defaulting, pruning and validation of a create or replace. Returns (object, warnings)."""
        group, version, kind, _ = RESOURCES[resource]
        expected = f"{group}/{version}"
        if body.get("apiVersion") != expected or body.get("kind") != kind:
            raise bad_request(f"the API version in the data ({body.get('apiVersion')}) does not match the "
                              f"expected API version ({expected})"
                              if body.get("apiVersion") != expected
                              else f"Object 'Kind' is missing or wrong: {body.get('kind')!r}")
        meta = body.setdefault("metadata", {})
        if meta.get("namespace", ns) != ns:
            raise bad_request("the namespace of the provided object does not match the namespace sent on "
                              "the request")
        meta["namespace"] = ns
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        schema = self.schemas[resource]
        obj, pruned = schema.default_and_prune(body)
        causes = []
        name = obj["metadata"].get("name", "")
        if not name:
            causes.append({"reason": "FieldValueRequired", "field": "metadata.name",
                           "message": "Required value: name or generateName is required"})
        elif len(name) > 253 or not crd.DNS1123_SUBDOMAIN.match(name):
            causes.append({"reason": "FieldValueInvalid", "field": "metadata.name",
                           "message": f'Invalid value: "{name}": {crd.DNS1123_MESSAGE}'})
        if name_in_url and name != name_in_url:
            raise bad_request("the name of the object (%s) does not match the name on the URL (%s)"
                              % (name, name_in_url))
        causes += schema.errors(obj)
        if resource == "trainjobs":
            causes += _trainjob_rules(obj)
        if causes:
            message = f'{kind}.{group} "{name}" is invalid: ' + (
                f"{causes[0]['field']}: {causes[0]['message']}" if len(causes) == 1 else
                "[" + ", ".join(f"{c['field']}: {c['message']}" for c in causes) + "]")
            raise ApiError(422, "Invalid", message, {"name": name, "group": group, "kind": kind,
                                                      "causes": causes})
        return obj, [f'unknown field "{p}"' for p in pruned]

    def _start_runner(self, obj):
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        scenario = copy.copy(self.scenarios.get(name) or self.scenario)
        runner = (TrainJobRunner if obj["kind"] == "TrainJob" else JobRunner)(self, obj, scenario)
        self.runners[(ns, name)] = runner
        runner.start()


def _trainjob_rules(obj):
    """The TrainJob CRD's CEL rules (x-kubernetes-validations), which the JSON schema leaves out."""
    causes = []
    name = obj["metadata"].get("name", "")
    if name and not crd.DNS1035_LABEL.match(name):
        causes.append({"reason": "FieldValueInvalid", "field": "<nil>",
                       "message": "Invalid value: \"object\": metadata.name must match RFC 1035 DNS label format"})
    if len(name) > 63:
        causes.append({"reason": "FieldValueInvalid", "field": "<nil>",
                       "message": "Invalid value: \"object\": metadata.name must be no more than 63 characters"})
    trainer = (obj.get("spec") or {}).get("trainer") or {}
    if isinstance(trainer.get("numProcPerNode"), int) and trainer["numProcPerNode"] < 1:
        causes.append({"reason": "FieldValueInvalid", "field": "spec.trainer.numProcPerNode",
                       "message": f"Invalid value: {trainer['numProcPerNode']}: numProcPerNode must be greater "
                                  "than or equal to 1"})
    return causes


def _api_group(group, version):
    """An APIGroup entry of discovery with one version."""
    gv = {"groupVersion": f"{group}/{version}", "version": version}
    return {"name": group, "versions": [gv], "preferredVersion": gv}


def _drain(events):
    """What a queue holds now, without waiting."""
    taken = []
    while True:
        try:
            taken.append(events.get_nowait())
        except queue.Empty:
            return taken


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeKube = None

    def log_message(self, *args):
        pass

    def setup(self):
        super().setup()
        self.fake._sockets.add(self.connection)

    def finish(self):
        self.fake._sockets.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = lambda self: self.dispatch()

    # --- responses ----------------------------------------------------------------------------
    def send_json(self, code, body, headers=()):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
        self.fake.raw_requests.append((self.command, self.path, code))

    def start_chunked(self, content_type):
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.fake.raw_requests.append((self.command, self.path, 200))

    def chunk(self, data):
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    def end_chunked(self):
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def drop_connection(self):
        self.close_connection = True
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)

    def client_gone(self):
        try:       # (not select(): a fake serving hundreds of streams has descriptors past 1024)
            return self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    # --- routing ------------------------------------------------------------------------------
    def dispatch(self):
        fake = self.fake
        url = urllib.parse.urlsplit(self.path)
        self.query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            if self.headers.get("Authorization") != f"Bearer {fake.token}":
                raise ApiError(401, "Unauthorized", "Unauthorized")
            parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/") if p]
            if self.discovery(parts):
                return
            group, resource, ns, name, sub = self.route(parts)
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(self.command)
            if self.command == "GET":
                verb = "get" if name else ("watch" if _bool(self.query.get("watch")) else "list")
            elif self.command == "DELETE":
                verb = "delete" if name else "deletecollection"
            fake.requests.append((verb, group, resource, sub, ns or "", name or ""))
            if fake.faults.delay:
                time.sleep(fake.faults.delay)
            codes = fake.faults.errors.get((verb, resource))
            if codes:
                code = codes.pop(0)
                raise ApiError(code, HTTP_REASONS.get(code, "Unknown"), f"fake fault: {code}")
            body = json.loads(raw) if raw else None
            handler = getattr(self, f"op_{verb}", None)
            if handler is None:
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the "
                                                        "requested resource")
            handler(resource, ns, name, sub, body)
        except ApiError as err:
            self.send_json(err.code, err.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except json.JSONDecodeError as err:
            self.send_json(400, ApiError(400, "BadRequest", f"invalid JSON body: {err}").status())

    def discovery(self, parts):
        if parts == ["version"]:
            self.send_json(200, {"major": "1", "minor": "31", "emulationMajor": "1", "emulationMinor": "31",
                                 "minCompatibilityMajor": "1", "minCompatibilityMinor": "30",
                                 "gitVersion": "v1.31.0-fakekube", "gitCommit": "0" * 40, "gitTreeState": "clean",
                                 "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.23.0",
                                 "compiler": "gc", "platform": "linux/amd64"})
        elif parts == ["api"]:
            self.send_json(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": self.fake.url[len("http://"):]}]})
        elif parts == ["apis"]:
            kueue = [_api_group("kueue.x-k8s.io", "v1beta1")] if self.fake.kueue is not None else []
            self.send_json(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": kueue + [
                {"name": "kubeflow.org", "versions": [{"groupVersion": "kubeflow.org/v2beta1", "version": "v2beta1"}],
                 "preferredVersion": {"groupVersion": "kubeflow.org/v2beta1", "version": "v2beta1"}},
                {"name": "trainer.kubeflow.org",
                 "versions": [{"groupVersion": "trainer.kubeflow.org/v1alpha1", "version": "v1alpha1"}],
                 "preferredVersion": {"groupVersion": "trainer.kubeflow.org/v1alpha1", "version": "v1alpha1"}}]})
        elif parts == ["apis", "trainer.kubeflow.org", "v1alpha1"]:
            self.send_json(200, {"kind": "APIResourceList", "apiVersion": "v1",
                                 "groupVersion": "trainer.kubeflow.org/v1alpha1",
                                 "resources": [{"name": "trainjobs", "singularName": "trainjob", "namespaced": True,
                                                "kind": "TrainJob", "verbs": ["delete", "deletecollection", "get",
                                                "list", "patch", "create", "update", "watch"]},
                                               {"name": "trainjobs/status", "singularName": "", "namespaced": True,
                                                "kind": "TrainJob", "verbs": ["get", "patch", "update"]}]})
        elif parts == ["apis", "kubeflow.org", "v2beta1"]:
            self.send_json(200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "kubeflow.org/v2beta1",
                                 "resources": [{"name": "mpijobs", "singularName": "mpijob", "namespaced": True,
                                                "kind": "MPIJob", "verbs": ["delete", "deletecollection", "get",
                                                "list", "patch", "create", "update", "watch"]},
                                               {"name": "mpijobs/status", "singularName": "", "namespaced": True,
                                                "kind": "MPIJob", "verbs": ["get", "patch", "update"]}]})
        elif parts == ["apis", "kueue.x-k8s.io"] and self.fake.kueue is not None:
            self.send_json(200, {**_api_group("kueue.x-k8s.io", "v1beta1"), "kind": "APIGroup", "apiVersion": "v1"})
        elif parts == ["apis", "kueue.x-k8s.io", "v1beta1"] and self.fake.kueue is not None:
            self.send_json(200, {"kind": "APIResourceList", "apiVersion": "v1",
                                 "groupVersion": "kueue.x-k8s.io/v1beta1",
                                 "resources": [{"name": resource, "singularName": RESOURCES[resource][2].lower(),
                                                "namespaced": resource not in CLUSTER_SCOPED,
                                                "kind": RESOURCES[resource][2],
                                                "verbs": ["delete", "deletecollection", "get", "list", "patch",
                                                          "create", "update", "watch"]}
                                               for resource in KUEUE_RESOURCES]})
        elif (len(parts) == 8 and parts[:4] == ["apis", "visibility.kueue.x-k8s.io", "v1beta1", "namespaces"]
              and parts[5] == "localqueues" and parts[7] == "pendingworkloads" and self.fake.kueue is not None):
            self.fake.requests.append(("get", "visibility.kueue.x-k8s.io", "localqueues", "pendingworkloads",
                                       parts[4], parts[6]))
            self.send_json(200, self.fake.kueue.pending_workloads(parts[4], parts[6]))
        else:
            return False
        return True

    def route(self, parts):
        if parts[:2] == ["api", "v1"]:
            group, rest = "", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis" and parts[1:3] == ["kubeflow.org", "v2beta1"]:
            group, rest = "kubeflow.org", parts[3:]
        elif len(parts) >= 3 and parts[0] == "apis" and parts[1:3] == ["trainer.kubeflow.org", "v1alpha1"]:
            group, rest = "trainer.kubeflow.org", parts[3:]
        elif len(parts) >= 3 and parts[0] == "apis" and parts[1:3] == ["kueue.x-k8s.io", "v1beta1"] \
                and self.fake.kueue is not None:
            group, rest = "kueue.x-k8s.io", parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        ns = None
        if len(rest) >= 2 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        if not rest or rest[0] not in RESOURCES or RESOURCES[rest[0]][0] != group or len(rest) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        resource, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else "")
        if resource in CLUSTER_SCOPED:
            if ns is not None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            ns = ""
        if sub and (resource, sub) not in {("pods", "log"), ("pods", "status"), ("mpijobs", "status"),
                                           ("trainjobs", "status")}:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return group, resource, ns, name, sub

    def selector(self, resource):
        labels = parse_label_selector(self.query.get("labelSelector", ""))
        fields = parse_field_selector(self.query.get("fieldSelector", ""), resource)
        return lambda o: labels(o["metadata"].get("labels")) and fields(o)

    # --- verbs --------------------------------------------------------------------------------
    def op_get(self, resource, ns, name, sub, body):
        if sub == "log":
            return self.pod_log(ns, name)
        obj = self.fake.store.get(resource, ns, name)
        if obj is None:
            raise not_found(resource, name)
        self.send_json(200, obj)

    def op_list(self, resource, ns, name, sub, body):
        match = self.selector(resource)
        with self.fake.store.lock:
            items = self.fake.store.list(resource, ns, match)
            rv = str(self.fake.store.rv)
        group, version, kind, list_kind = RESOURCES[resource]
        self.send_json(200, {"kind": list_kind, "apiVersion": api_version(resource),
                             "metadata": {"resourceVersion": rv}, "items": items})

    def op_watch(self, resource, ns, name, sub, body):
        fake, store = self.fake, self.fake.store
        match = self.selector(resource)
        rv_text = self.query.get("resourceVersion", "")
        since = None if rv_text in ("", "0") else int(rv_text)
        timeout = float(self.query.get("timeoutSeconds") or DEFAULT_WATCH_SECONDS)
        bookmarks = _bool(self.query.get("allowWatchBookmarks"))
        deadline = time.monotonic() + timeout
        _, _, kind, _ = RESOURCES[resource]
        self.start_chunked("application/json")
        gone = None
        if resource in WORKLOADS and since is not None and fake.faults.watch_gone_once:
            fake.faults.watch_gone_once = False
            gone = ApiError(410, "Expired", f"too old resource version: {since} ({store.rv})")
        watcher = None
        try:
            if gone is None:
                try:
                    watcher, initial = store.open_watch(resource, ns, match, since)
                except ApiError as err:
                    gone = err
            if gone is not None:
                self.chunk(json.dumps({"type": "ERROR", "object": gone.status()}).encode() + b"\n")
                self.end_chunked()
                return
            for etype, obj in initial:
                self.chunk(json.dumps({"type": etype, "object": obj}).encode() + b"\n")
            while not fake.stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    etype, obj = watcher.queue.get(timeout=min(left, 0.5))
                except Exception:
                    if self.client_gone():
                        self.close_connection = True
                        return
                    continue
                self.chunk(json.dumps({"type": etype, "object": obj}).encode() + b"\n")
            if bookmarks and not fake.stopping.is_set():
                # As the API server's: every event up to the bookmark's version was sent first.
                # (A bookmark at the store's version with events still queued would make a
                # client that resumes from it skip them: a follower would never see its MPIJob run.)
                with store.lock:
                    pending, rv = _drain(watcher.queue), store.rv
                for etype, obj in pending:
                    self.chunk(json.dumps({"type": etype, "object": obj}).encode() + b"\n")
                self.chunk(json.dumps({"type": "BOOKMARK", "object": {
                    "kind": kind, "apiVersion": api_version(resource),
                    "metadata": {"resourceVersion": str(rv)}}}).encode() + b"\n")
            self.end_chunked()
        finally:
            if watcher is not None:
                store.close_watch(watcher)

    def op_create(self, resource, ns, name, sub, body):
        fake = self.fake
        if resource in WORKLOADS:
            if fake.faults.create_errors:
                code = fake.faults.create_errors.pop(0)
                raise ApiError(code, HTTP_REASONS.get(code, "Unknown"),
                               "Internal error occurred: fake fault" if code == 500 else f"fake fault: {code}")
            obj, warnings = fake._admit_mpijob(ns, body or {}, resource=resource)
            if warnings and self.query.get("fieldValidation") == "Strict":
                raise bad_request("strict decoding error: " + ", ".join(warnings))
            if resource == "trainjobs":
                fake._admit_trainjob_webhook(obj)
            if fake.kueue is not None:
                fake.kueue.default(resource, obj)
            obj.pop("status", None)    # the status subresource is not writable through create
            created = fake.store.create(resource, obj)
            fake._start_runner(created)
            if fake.faults.create_errors_after_store:
                code = fake.faults.create_errors_after_store.pop(0)
                raise ApiError(code, HTTP_REASONS.get(code, "Unknown"), "Internal error occurred: fake fault "
                                                                        "(after storing)")
            slow, fake.faults.create_slow_once = fake.faults.create_slow_once, 0.0
            if slow:
                time.sleep(slow)
            return self.send_json(201, created, [("Warning", f'299 - "{w}"') for w in warnings])
        if resource == "configmaps":
            meta = (body or {}).setdefault("metadata", {})
            if meta.get("namespace", ns) != ns:
                raise bad_request("the namespace of the provided object does not match the namespace sent on "
                                  "the request")
            meta["namespace"] = ns
            if not crd.DNS1123_SUBDOMAIN.match(meta.get("name", "")):
                raise ApiError(422, "Invalid", f'ConfigMap "{meta.get("name", "")}" is invalid: metadata.name: '
                                               f'Invalid value: "{meta.get("name", "")}": {crd.DNS1123_MESSAGE}')
            body.setdefault("apiVersion", "v1")
            body.setdefault("kind", "ConfigMap")
            return self.send_json(201, fake.store.create("configmaps", body))
        raise ApiError(405, "MethodNotAllowed", "create is not supported here by the fake")

    def op_delete(self, resource, ns, name, sub, body):
        fake = self.fake
        policy = (body or {}).get("propagationPolicy") or self.query.get("propagationPolicy")
        if resource in WORKLOADS:
            obj = fake.store.get(resource, ns, name)
            result = fake._delete_mpijob(ns, name, policy, resource)
            if result is not None:
                return self.send_json(200, result)
            return self.send_json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                        "details": {"name": name, "group": RESOURCES[resource][0], "kind": resource,
                                                    "uid": obj["metadata"]["uid"]}})
        if resource == "pods":
            obj = fake.delete_pod(ns, name)
            if obj is None:
                raise not_found(resource, name)
            return self.send_json(200, obj)
        obj = fake.store.delete(resource, ns, name)
        if obj is None:
            raise not_found(resource, name)
        self.send_json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                             "details": {"name": name, "kind": resource, "uid": obj["metadata"]["uid"]}})

    def _change_mpijob(self, ns, name, sub, new_of, resource="mpijobs"):
        """Patch or update: new_of(current) gives the new object; status only through /status."""
        fake = self.fake
        group = RESOURCES[resource][0]
        with fake.store.lock:
            current = fake.store.get(resource, ns, name)
            if current is None:
                raise not_found(resource, name)
            new = new_of(current)
            rv = (new.get("metadata") or {}).get("resourceVersion")
            if rv and rv != current["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {resource}.{group} "{name}": '
                               "the object has been modified; please apply your changes to the latest version "
                               "and try again", {"name": name, "group": group, "kind": resource})
            if sub == "status":
                new = dict(current, status=new.get("status", {}))
            else:
                new["status"] = current.get("status", {})
            new.setdefault("metadata", {})
            for key in ("uid", "creationTimestamp", "generation", "name", "namespace"):
                new["metadata"][key] = current["metadata"][key]
            new, _ = fake._admit_mpijob(ns, new, name, resource)

            def replace(obj):
                obj.clear()
                obj.update(new)
            return self.send_json(200, fake.store.update(resource, ns, name, replace))

    def op_patch(self, resource, ns, name, sub, body):
        if resource not in WORKLOADS:
            raise ApiError(405, "MethodNotAllowed", "patch is only supported on mpijobs and trainjobs by the fake")
        ctype = self.headers.get("Content-Type", "")
        if "json-patch" in ctype:
            return self._change_mpijob(ns, name, sub, lambda cur: json_patch(cur, body), resource)
        return self._change_mpijob(ns, name, sub, lambda cur: merge_patch(cur, body), resource)

    def op_update(self, resource, ns, name, sub, body):
        if resource not in WORKLOADS:
            raise ApiError(405, "MethodNotAllowed", "update is only supported on mpijobs and trainjobs by the fake")
        return self._change_mpijob(ns, name, sub, lambda cur: copy.deepcopy(body), resource)

    # --- pods/log -----------------------------------------------------------------------------
    def pod_log(self, ns, name):
        fake, store, q = self.fake, self.fake.store, self.query
        pod = store.get("pods", ns, name)
        if pod is None:
            raise not_found("pods", name)
        names = [c["name"] for c in pod["spec"]["containers"]]
        container = q.get("container") or (names[0] if len(names) == 1 else None)
        if container is None:
            raise bad_request(f"a container name must be specified for pod {name}, choose one of: "
                              f"[{' '.join(names)}]")
        if container not in names:
            raise bad_request(f"container {container} is not valid for pod {name}")
        if _bool(q.get("previous")):
            raise bad_request(f'previous terminated container "{container}" in pod "{name}" not found')
        follow = _bool(q.get("follow"))
        stamps = _bool(q.get("timestamps"))
        since_ns = None
        if q.get("sinceSeconds"):
            since_ns = time.time_ns() - int(q["sinceSeconds"]) * 1_000_000_000
        if q.get("sinceTime"):
            since_ns = int(_parse_time(q["sinceTime"]).timestamp()) * 1_000_000_000
        tail = int(q["tailLines"]) if q.get("tailLines") not in (None, "") else None
        limit = int(q["limitBytes"]) if q.get("limitBytes") else None
        if not pod["spec"].get("nodeName"):
            # not scheduled: the apiserver has no kubelet to ask and answers an empty body
            return self.send_json_text(b"")
        status = next((cs for cs in pod["status"].get("containerStatuses", []) if cs["name"] == container), None)
        waiting = (status or {}).get("state", {}).get("waiting")
        if status is None or waiting:
            reason = (waiting or {}).get("reason", "ContainerCreating")
            reason = {"ErrImagePull": "image can't be pulled",
                      "ImagePullBackOff": "trying and failing to pull image"}.get(reason, reason)
            raise bad_request(f'container "{container}" in pod "{name}" is waiting to start: {reason}')
        uid = pod["metadata"]["uid"]
        is_main = container == names[0]

        def snapshot(start=0):
            """(the lines from `start` on, how many there are in all, done, alive), under the lock."""
            log = fake._logs.get(uid) if is_main else None
            lines = log["lines"][start:] if log else []
            done = (log is None or log["done"]) if is_main else True
            alive = store.objects.get(("pods", ns, name), {}).get("metadata", {}).get("uid") == uid
            return lines, start + len(lines), done, alive

        def log_changed():
            log = fake._logs.get(uid) if is_main else None
            return log["written"] if log else store.changed

        with store.lock:
            lines, count, done, alive = snapshot()
        selected = [(t, line) for t, line in lines if since_ns is None or t >= since_ns]
        if tail is not None:
            selected = selected[-tail:] if tail > 0 else []
        sent = count

        def render(batch):
            return b"".join((_ts(t).encode() + b" " if stamps else b"") + line for t, line in batch)

        if not follow:
            data = render(selected)
            return self.send_json_text(data[:limit] if limit is not None else data)
        cut, fake.faults.cut_log_once_after = fake.faults.cut_log_once_after, None
        written = 0
        self.start_chunked("text/plain")
        batch = selected
        while True:
            for t, line in batch:
                data = render([(t, line)])
                if limit is not None:
                    data = data[:max(0, limit - written)]
                if cut is not None and written + len(data) >= cut:
                    self.chunk(data[:cut - written])
                    return self.drop_connection()
                self.chunk(data)
                written += len(data)
                if limit is not None and written >= limit:
                    return self.end_chunked()
            if not alive or fake.stopping.is_set():
                return self.end_chunked()
            if done and sent >= count:
                return self.end_chunked()
            with store.lock:
                lines, count, done, alive = snapshot(sent)
                if alive and not done and not lines:
                    log_changed().wait(0.5)
                    lines, count, done, alive = snapshot(sent)
            batch = [(t, line) for t, line in lines if since_ns is None or t >= since_ns]
            sent = count
            if not batch and self.client_gone():
                self.close_connection = True
                return

    def send_json_text(self, data):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.fake.raw_requests.append((self.command, self.path, 200))
