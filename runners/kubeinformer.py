"""What a worker process sees of one namespace: one watch per kind, shared by every job it follows.

Following each MPIJob with a watch of its own and a list of its pods every 2 s would cost a thread
and 250 requests a second per 500 jobs, at the worker and at the API server. So, as client-go's
shared informers do for a controller, a worker process keeps, per cluster, namespace and portal,
one list-then-watch of each kind the follow looks at:

- the portal's MPIJobs (or TrainJobs) and their pods (label selector: made by this portal);
- the events of MPIJobs (the operator's ValidationError), which carry no labels.

A workload is the builder module of its kind (runners.mpijob, runners.trainjob): its GROUP,
VERSION, PLURAL and KIND, and JOB_NAME_LABEL, the pod label naming the job a pod belongs to.
Each workload has informers of its own.

Each keeps a cache of the objects by the job they belong to (the namespace's, as any informer
does: an object made before its job's follow subscribed is there too); a follow subscribes to its
job's name and is called back when one of its objects changes. A watch that expires (410 Gone) lists
again; an object missing from the new list was deleted. The informer stops when the last follow
of its namespace unsubscribes.
"""
import json
import logging
import threading
from dataclasses import dataclass

import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from . import mpijob

log = logging.getLogger(__name__)
TRANSIENT = (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError)   # a cut or slow connection


@dataclass(frozen=True)
class Kind:
    name: str
    owner: object            # obj -> the name of the MPIJob it belongs to ("" if none)


def _own_name(obj):
    return obj.get("metadata", {}).get("name", "")


def _event_job(obj):
    return (obj.get("involvedObject") or {}).get("name", "")


def kinds(workload):
    """(the workload's kind, its pods, its events) as the informer of `workload` keeps them."""
    def pod_job(obj):
        return (obj.get("metadata", {}).get("labels") or {}).get(workload.JOB_NAME_LABEL, "")
    return Kind(workload.PLURAL, _own_name), Kind("pods", pod_job), Kind("events", _event_job)


def selector(installation):
    """The label selector of what this portal made (MPIJobs and, through their templates, pods)."""
    labels = [f"{key}={value}" for key, value in mpijob.MANAGED_BY.items()]
    if installation:
        labels.append(f"{mpijob.INSTALLATION_LABEL}={installation}")
    return ",".join(labels)


class Informer:
    """The cache of one namespace's workloads (MPIJobs or TrainJobs), their pods and events,
    kept by three watches."""

    def __init__(self, api_client, namespace, label_selector, timings, workload=mpijob):
        self.namespace, self.label_selector, self.timings = namespace, label_selector, timings
        custom, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
        self.jobs, pods, events = kinds(workload)
        # Plain functions without the client's docstring: the watch then hands over the API's
        # JSON as it came instead of building the client's models from it.
        self._lists = {
            self.jobs: lambda **kw: custom.list_namespaced_custom_object(
                workload.GROUP, workload.VERSION, namespace, workload.PLURAL, label_selector=label_selector, **kw),
            pods: lambda **kw: core.list_namespaced_pod(namespace, label_selector=label_selector, **kw),
            events: lambda **kw: core.list_namespaced_event(
                namespace, field_selector=f"involvedObject.kind={workload.KIND}", **kw),
        }
        self._pods, self._events = pods, events
        self._lock = threading.Lock()
        self._objects = {kind: {} for kind in self._lists}     # kind -> {job name: {object name: obj}}
        self._gone = set()                                     # followed MPIJobs seen deleted
        self._subscribers = {}                                 # job name -> {token: callback}
        self._synced = {kind: threading.Event() for kind in self._lists}
        self.stop = threading.Event()
        self._threads = [threading.Thread(target=self._keep, args=(kind,), daemon=True,
                                          name=f"k8s-informer-{namespace}-{kind.name}") for kind in self._lists]

    def start(self):
        for thread in self._threads:
            thread.start()

    # --- what a follow reads ---------------------------------------------------------------

    def wait_synced(self, timeout):
        """True once every kind was listed (what the cache says is then what the API said)."""
        return all(self._synced[kind].wait(timeout) for kind in self._lists)

    def workload(self, name):
        with self._lock:
            return self._objects[self.jobs].get(name, {}).get(name)

    def deleted(self, name):
        """The workload was seen deleted (a DELETED event, or missing from a new list)."""
        with self._lock:
            return name in self._gone

    def pods(self, name):
        with self._lock:
            return tuple(self._objects[self._pods].get(name, {}).values())

    def events(self, name):
        with self._lock:
            return tuple(self._objects[self._events].get(name, {}).values())

    def subscribe(self, name, callback):
        token = object()
        with self._lock:
            self._subscribers.setdefault(name, {})[token] = callback
        return token

    def unsubscribe(self, name, token):
        """Forget a subscription; True when none is left."""
        with self._lock:
            callbacks = self._subscribers.get(name, {})
            callbacks.pop(token, None)
            if not callbacks:
                self._subscribers.pop(name, None)
                self._gone.discard(name)
            return not self._subscribers

    # --- keeping the cache -----------------------------------------------------------------

    def _apply(self, kind, etype, obj):
        """Put one watch event in the cache; the name of the job it concerns, if followed."""
        job, name = kind.owner(obj), _own_name(obj)
        if not job:
            return None
        with self._lock:
            if etype == "DELETED":
                objects = self._objects[kind].get(job, {})
                objects.pop(name, None)
                if not objects:
                    self._objects[kind].pop(job, None)
                if kind is self.jobs and job in self._subscribers:
                    self._gone.add(job)
            else:
                self._objects[kind].setdefault(job, {})[name] = obj
                if kind is self.jobs:
                    self._gone.discard(job)
            return job if job in self._subscribers else None

    def _relist(self, kind):
        """List the kind anew; its resourceVersion. Jobs whose objects changed are told."""
        response = self._lists[kind](_preload_content=False, _request_timeout=self.timings.request_seconds)
        try:
            data = json.loads(response.data)
        finally:
            response.release_conn()
        fresh = {}
        for obj in data.get("items") or []:
            job = kind.owner(obj)
            if job:
                fresh.setdefault(job, {})[_own_name(obj)] = obj
        with self._lock:
            before = self._objects[kind]
            followed = set(self._subscribers)
            changed = {job for job in followed if before.get(job) != fresh.get(job)}
            self._objects[kind] = fresh
            if kind is self.jobs:
                self._gone |= {job for job in followed if job in before and job not in fresh}
                self._gone -= set(fresh)
        self._synced[kind].set()
        self._tell(changed)
        return data.get("metadata", {}).get("resourceVersion")

    def _tell(self, jobs):
        for job in jobs:
            with self._lock:
                callbacks = list(self._subscribers.get(job, {}).values())
            for callback in callbacks:
                callback()

    def _keep(self, kind):
        version, delay = None, self.timings.retry_seconds
        while not self.stop.is_set():
            try:
                if version is None:
                    version = self._relist(kind)
                for event in watch.Watch().stream(
                        self._lists[kind], resource_version=version, timeout_seconds=self.timings.watch_seconds,
                        allow_watch_bookmarks=True, _request_timeout=self.timings.watch_seconds + 10):
                    obj = event["raw_object"]
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        job = self._apply(kind, event["type"], obj)
                        if job:
                            self._tell((job,))
                    if self.stop.is_set():
                        return
                delay = self.timings.retry_seconds
            except ApiException as exc:
                if exc.status == 410:                # our resourceVersion is too old: list again
                    log.info("%s watch in %s expired (410), relisting", kind.name, self.namespace)
                    version = None
                    continue
                log.warning("%s watch in %s failed (%s %s), retrying in %.1f s",
                            kind.name, self.namespace, exc.status, exc.reason, delay)
                self.stop.wait(delay)
                delay = min(delay * 2, 10)
            except TRANSIENT as exc:
                log.info("%s watch in %s interrupted (%s), resuming", kind.name, self.namespace, exc)
                self.stop.wait(delay)
                delay = min(delay * 2, 10)
            except Exception:                        # never the end of every follow of the namespace
                log.exception("%s watch in %s failed, retrying in %.1f s", kind.name, self.namespace, delay)
                version = None
                self.stop.wait(delay)
                delay = min(delay * 2, 10)


_lock = threading.Lock()
_informers = {}


class Subscription:
    """A follow's view of its job through the shared informer of its namespace."""

    def __init__(self, key, informer, name, token):
        self.key, self.informer, self.name, self._token = key, informer, name, token

    def workload(self):
        return self.informer.workload(self.name)

    mpijob = workload

    def deleted(self):
        return self.informer.deleted(self.name)

    def pods(self):
        return self.informer.pods(self.name)

    def events(self):
        return self.informer.events(self.name)

    def close(self):
        with _lock:
            if self.informer.unsubscribe(self.name, self._token) and _informers.get(self.key) is self.informer:
                del _informers[self.key]
                self.informer.stop.set()


def subscribe(connection, api_client, namespace, installation, name, callback, timings, workload=mpijob):
    """Follow the workload `name` (an MPIJob, or a TrainJob: `workload` is its builder module)
    through the informer of its namespace (started if none runs for `connection`, the cluster's
    identity, yet); `callback()` is called on every change to it."""
    label_selector = selector(installation)
    key = (connection, namespace, label_selector, workload.KIND)
    with _lock:
        informer = _informers.get(key)
        if informer is None:
            informer = _informers[key] = Informer(api_client, namespace, label_selector, timings, workload)
            informer.start()
        token = informer.subscribe(name, callback)
    informer.wait_synced(timings.request_seconds)
    return Subscription(key, informer, name, token)
