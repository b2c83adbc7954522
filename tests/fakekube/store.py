"""The fake apiserver's storage: objects by (resource, namespace, name), one global resourceVersion,
a bounded history of watch events, live watchers, selectors, Status errors."""
import collections
import copy
import datetime
import queue
import re
import threading
import time
import uuid

# resource -> (group, version, kind, listKind)
RESOURCES = {
    "mpijobs": ("kubeflow.org", "v2beta1", "MPIJob", "MPIJobList"),
    "trainjobs": ("trainer.kubeflow.org", "v1alpha1", "TrainJob", "TrainJobList"),
    "pods": ("", "v1", "Pod", "PodList"),
    "configmaps": ("", "v1", "ConfigMap", "ConfigMapList"),
    "events": ("", "v1", "Event", "EventList"),
    # Kueue (tests/fakekube/kueue.py): served only where the fake plays it.
    "workloads": ("kueue.x-k8s.io", "v1beta1", "Workload", "WorkloadList"),
    "localqueues": ("kueue.x-k8s.io", "v1beta1", "LocalQueue", "LocalQueueList"),
    "clusterqueues": ("kueue.x-k8s.io", "v1beta1", "ClusterQueue", "ClusterQueueList"),
    "resourceflavors": ("kueue.x-k8s.io", "v1beta1", "ResourceFlavor", "ResourceFlavorList"),
}
KUEUE_RESOURCES = ("workloads", "localqueues", "clusterqueues", "resourceflavors")
CLUSTER_SCOPED = {"clusterqueues", "resourceflavors"}     # stored with namespace ""
WORKLOADS = ("mpijobs", "trainjobs")     # custom resources the fake's controllers run
# Field selectors the real apiserver supports per resource (others answer 400).
FIELD_LABELS = {
    "mpijobs": {"metadata.name", "metadata.namespace"},
    "trainjobs": {"metadata.name", "metadata.namespace"},
    "configmaps": {"metadata.name", "metadata.namespace"},
    "pods": {"metadata.name", "metadata.namespace", "spec.nodeName", "spec.restartPolicy",
             "spec.schedulerName", "spec.serviceAccountName", "spec.hostNetwork", "status.phase",
             "status.podIP", "status.podIPs", "status.nominatedNodeName"},
    "events": {"metadata.name", "metadata.namespace", "involvedObject.kind", "involvedObject.namespace",
               "involvedObject.name", "involvedObject.uid", "involvedObject.apiVersion",
               "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason",
               "reportingComponent", "source", "type"},
    **{resource: {"metadata.name", "metadata.namespace"} for resource in KUEUE_RESOURCES},
}


def now():
    return datetime.datetime.now(datetime.timezone.utc)


def rfc3339(t=None):
    return (t or now()).strftime("%Y-%m-%dT%H:%M:%SZ")


def api_version(resource):
    group, version, _, _ = RESOURCES[resource]
    return f"{group}/{version}" if group else version


def resource_ref(resource):
    group = RESOURCES[resource][0]
    return f"{resource}.{group}" if group else resource


class ApiError(Exception):
    """Raised by handlers; rendered as a Status object."""

    def __init__(self, code, reason, message, details=None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self):
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}
        if self.details is not None:
            body["details"] = self.details
        return body


def not_found(resource, name):
    return ApiError(404, "NotFound", f'{resource_ref(resource)} "{name}" not found',
                    {"name": name, "group": RESOURCES[resource][0], "kind": resource})


def already_exists(resource, name):
    return ApiError(409, "AlreadyExists", f'{resource_ref(resource)} "{name}" already exists',
                    {"name": name, "group": RESOURCES[resource][0], "kind": resource})


def bad_request(message):
    return ApiError(400, "BadRequest", message)


# --- selectors -----------------------------------------------------------------------------------

_SET_RE = re.compile(r"^\s*(!?)([A-Za-z0-9._/-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")


def _split_selector(text):
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def parse_label_selector(text):
    """Returns a predicate on a labels dict. Supports =, ==, !=, in, notin, key, !key."""
    tests = []
    for part in _split_selector(text or ""):
        m = re.match(r"^([A-Za-z0-9._/-]+)\s*(==|=|!=)\s*([A-Za-z0-9._-]*)$", part)
        if m:
            key, op, val = m.groups()
            if op == "!=":
                tests.append(lambda l, k=key, v=val: l.get(k) != v)
            else:
                tests.append(lambda l, k=key, v=val: l.get(k) == v)
            continue
        m = _SET_RE.match(part)
        if not m:
            raise bad_request(f"unable to parse requirement: {part!r}")
        neg, key, op, values = m.groups()
        if op:
            vals = {v.strip() for v in values.split(",") if v.strip()}
            if op == "in":
                tests.append(lambda l, k=key, vs=vals: l.get(k) in vs)
            else:
                tests.append(lambda l, k=key, vs=vals: l.get(k) not in vs)
        elif neg:
            tests.append(lambda l, k=key: k not in l)
        else:
            tests.append(lambda l, k=key: k in l)
    return lambda labels: all(t(labels or {}) for t in tests)


def _field(obj, path):
    node = obj
    for part in path.split("."):
        if not isinstance(node, dict):
            return ""
        node = node.get(part)
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    if isinstance(node, dict) and path == "source":
        return node.get("component", "")
    return str(node)


def parse_field_selector(text, resource):
    tests = []
    for part in _split_selector(text or ""):
        m = re.match(r"^([A-Za-z.]+)\s*(==|=|!=)\s*(.*)$", part)
        if not m:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        key, op, val = m.groups()
        if key not in FIELD_LABELS[resource]:
            raise bad_request(f'"{key}" is not a known field selector: only "metadata.name", '
                              f'"metadata.namespace"' if resource in WORKLOADS
                              else f"field label not supported: {key}")
        if op == "!=":
            tests.append(lambda o, k=key, v=val: _field(o, k) != v)
        else:
            tests.append(lambda o, k=key, v=val: _field(o, k) == v)
    return lambda obj: all(t(obj) for t in tests)


# --- the store -----------------------------------------------------------------------------------

class Watcher:
    def __init__(self, resource, namespace, match):
        self.resource, self.namespace, self.match = resource, namespace, match
        self.queue = queue.Queue()

    def wants(self, resource, obj):
        return (resource == self.resource
                and (self.namespace is None or obj["metadata"].get("namespace", "") == self.namespace)
                and self.match(obj))


class Store:
    def __init__(self, history_limit=1000):
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.rv = 100
        self.objects = {}          # (resource, ns, name) -> dict
        self.kinds = collections.defaultdict(dict)   # resource -> {(ns, name): dict}: a list reads one kind
        self.history = collections.deque(maxlen=history_limit)   # (rv, resource, type, obj)
        self.oldest_rv = self.rv   # watches from an RV older than this get 410 Expired
        self.watchers = set()

    # reads
    def get(self, resource, ns, name):
        with self.lock:
            obj = self.objects.get((resource, ns, name))
            return copy.deepcopy(obj) if obj is not None else None

    def list(self, resource, ns=None, match=None):
        with self.lock:
            items = [copy.deepcopy(o) for (n, _), o in self.kinds[resource].items()
                     if (ns is None or n == ns) and (match is None or match(o))]
        items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        return items

    # writes
    def _record(self, resource, etype, obj):
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        snapshot = copy.deepcopy(obj)
        if len(self.history) == self.history.maxlen:
            self.oldest_rv = self.history[0][0]
        self.history.append((self.rv, resource, etype, snapshot))
        for w in list(self.watchers):
            if w.wants(resource, snapshot):
                w.queue.put((etype, copy.deepcopy(snapshot)))
        self.changed.notify_all()

    def create(self, resource, obj):
        with self.lock:
            meta = obj["metadata"]
            key = (resource, meta.get("namespace", ""), meta["name"])
            if key in self.objects:
                raise already_exists(resource, meta["name"])
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", rfc3339())
            meta.setdefault("generation", 1)
            self.objects[key] = obj
            self.kinds[resource][key[1:]] = obj
            self._record(resource, "ADDED", obj)
            return copy.deepcopy(obj)

    def update(self, resource, ns, name, mutate, uid=None):
        """Apply mutate(obj) in place under the lock; bumps RV and emits MODIFIED if anything
        changed. Returns the new object, or None when the object is gone (or replaced: uid)."""
        with self.lock:
            obj = self.objects.get((resource, ns, name))
            if obj is None or (uid and obj["metadata"]["uid"] != uid):
                return None
            before = copy.deepcopy(obj)
            mutate(obj)
            if obj != before:
                if obj.get("spec") != before.get("spec"):
                    obj["metadata"]["generation"] = before["metadata"].get("generation", 1) + 1
                self._record(resource, "MODIFIED", obj)
            return copy.deepcopy(obj)

    def delete(self, resource, ns, name, uid=None):
        with self.lock:
            obj = self.objects.get((resource, ns, name))
            if obj is None or (uid and obj["metadata"]["uid"] != uid):
                return None
            del self.objects[(resource, ns, name)]
            del self.kinds[resource][(ns, name)]
            self._record(resource, "DELETED", obj)
            return copy.deepcopy(obj)

    def compact(self):
        """Forget the watch history, like etcd compaction: older RVs now answer 410 Expired."""
        with self.lock:
            self.history.clear()
            self.oldest_rv = self.rv

    # watches
    def open_watch(self, resource, ns, match, since):
        """Register a watcher. since: None for 'current objects as ADDED, then changes', or an int RV.
        Returns (watcher, initial events) or raises ApiError 410 when since is too old."""
        with self.lock:
            watcher = Watcher(resource, ns, match)
            if since is None:
                initial = [("ADDED", o) for o in self.list(resource, ns, match)]
            else:
                if since < self.oldest_rv:
                    raise ApiError(410, "Expired", f"too old resource version: {since} ({self.oldest_rv})")
                initial = [(t, copy.deepcopy(o)) for rv, r, t, o in self.history
                           if rv > since and watcher.wants(r, o)]
            self.watchers.add(watcher)
            return watcher, initial

    def close_watch(self, watcher):
        with self.lock:
            self.watchers.discard(watcher)

    def wait(self, predicate, timeout):
        """Wait until predicate() (called under the lock) is truthy; returns its value or None."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                value = predicate()
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.changed.wait(min(left, 0.2))
