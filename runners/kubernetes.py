"""Jobs as Kubeflow MPIJobs (kubeflow.org/v2beta1), through the official kubernetes client.

- launch: create the MPIJob named after the job (spec.name: rm-<installation>-<id>); a 409 adopts the one a previous
  try created, so a retried task never makes a second job. 5xx answers and timeouts are
  retried. Then the uploaded script's ConfigMap, owned by the MPIJob.
- follow: two things at once. What the cluster says of the MPIJob, its pods and its events
  comes from the informer of its namespace (kubeinformer: one watch per kind for every job the
  worker process follows there), which gives its conditions and trouble a user can act on; the
  launcher pod's log (`follow`, `timestamps`) gives every rank's output. The log
  position (kubestatus.LogCursor) is stored with every batch, so a cut stream or a new
  follower resumes without losing or repeating a line, and a retried launcher (a new pod) is
  read after the old one.
- cancel: delete the MPIJob (foreground, so its pods go first) and the ConfigMap.
"""
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from . import kubeinformer, kubestatus, mpijob
from .base import Output, Runner, Started, Waiting

log = logging.getLogger(__name__)
_TRANSIENT = kubeinformer.TRANSIENT


@dataclass(frozen=True)
class Timings:
    request_seconds: float = 10         # any single API call
    create_attempts: int = 6            # creates retried on 5xx, 429 and timeouts
    retry_seconds: float = 0.5          # first back-off (doubles)
    watch_seconds: int = 30             # a watch request's server-side timeout
    poll_seconds: float = 2             # pods and events
    log_idle_seconds: float = 60        # a log stream silent this long is reopened
    image_pull_grace_seconds: float = 300
    drain_seconds: float = 30           # after the end: how long to wait for the log's last lines
    cancel_seconds: float = 120         # cancel waits this long for the pods to go


class KubernetesError(Exception):
    pass


def _transient(exc):
    if isinstance(exc, ApiException):
        return exc.status in (429, 500, 502, 503, 504) or exc.status == 0
    return isinstance(exc, _TRANSIENT)


def _message(exc):
    """What went wrong, in a line a user can act on (an API server's own message where it gave one)."""
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        return f"cannot reach the API server: {str(exc.reason).rpartition('): ')[2]}"
    if isinstance(exc, ApiException):
        try:
            return json.loads(exc.body).get("message") or exc.reason
        except (TypeError, ValueError):
            return f"{exc.status} {exc.reason}"
    return str(exc) or type(exc).__name__


def _items(response):
    """The items of a list answered as raw JSON (_preload_content=False): the API's own field
    names, as sanitize_for_serialization gives them, without building the client's models first
    (most of a poll's cost when a worker follows hundreds of jobs)."""
    try:
        return json.loads(response.data).get("items") or []
    finally:
        response.release_conn()


class KubernetesRunner(Runner):
    name = "kubernetes"
    reports_running = True

    def __init__(self, api_client, cluster, timings=Timings(), cluster_name="", connection=None):
        self.api_client = api_client
        # Who this client is at which API server: the follows of runners with the same share one
        # informer per namespace (kubeinformer). None: this runner's own.
        self.connection = connection if connection is not None else ("client", id(api_client))
        self.cluster = cluster
        self.timings = timings
        self.cluster_name = cluster_name or "the cluster"
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)

    @property
    def namespace(self):
        return self.cluster.namespace

    # --- launch ------------------------------------------------------------------------

    def launch(self, spec):
        body, configmap = mpijob.build(spec, self.cluster)
        created, adopted = self._create_mpijob(spec, body)
        if configmap is not None:
            configmap = mpijob.new_script_configmap(spec, self.cluster, owner=created)
            self._retrying(lambda: self._create_ignoring_conflict(
                lambda: self.core.create_namespaced_config_map(
                    self.namespace, configmap, _request_timeout=self.timings.request_seconds)))
        where = f"{self.namespace}/{spec.name} on {self.cluster_name}"
        return Started(detail=f"adopted the MPIJob {where}" if adopted else f"created the MPIJob {where}",
                       already_running=adopted)

    def _create_mpijob(self, spec, body):
        """(the MPIJob, adopted?). A 409 means an earlier try created it: take that one, if it
        is this job's."""
        def create():
            try:
                return self.custom.create_namespaced_custom_object(
                    mpijob.GROUP, mpijob.VERSION, self.namespace, mpijob.PLURAL, body, field_validation="Strict",
                    _request_timeout=self.timings.request_seconds), False
            except ApiException as exc:
                if exc.status == 404:
                    raise KubernetesError(
                        f"{self.cluster_name}: {_message(exc)} (is mpi-operator v0.8 installed, serving "
                        f"{mpijob.API_VERSION}, and does namespace {self.namespace} exist?)") from exc
                if exc.status != 409:
                    raise
            existing = self._get_mpijob(spec)
            if existing is None:
                raise KubernetesError(f"MPIJob {spec.name} exists and vanished again; retrying")
            if not mpijob.made_for(existing, spec):
                raise KubernetesError(f"an MPIJob named {spec.name} already exists in {self.namespace} "
                                      "and was not created by this portal")
            return existing, True
        return self._retrying(create)

    def _create_ignoring_conflict(self, create):
        try:
            return create()
        except ApiException as exc:
            if exc.status != 409:
                raise

    def _retrying(self, call):
        delay = self.timings.retry_seconds
        for attempt in range(self.timings.create_attempts):
            try:
                return call()
            except Exception as exc:
                last = attempt == self.timings.create_attempts - 1
                if last or not (_transient(exc) or isinstance(exc, KubernetesError) and "retrying" in str(exc)):
                    if isinstance(exc, ApiException):
                        raise KubernetesError(f"{self.cluster_name}: {_message(exc)}") from exc
                    raise
                log.warning("kubernetes call failed (%s), retrying in %.1f s", _message(exc), delay)
                time.sleep(delay)
                delay = min(delay * 2, 10)

    def _get_mpijob(self, spec):
        try:
            return self.custom.get_namespaced_custom_object(
                mpijob.GROUP, mpijob.VERSION, self.namespace, mpijob.PLURAL, spec.name,
                _request_timeout=self.timings.request_seconds)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    # --- resize (elastic jobs) -----------------------------------------------------------

    def resize(self, spec):
        """Set the MPIJob's Worker replicas to the job's size now: the operator adds or deletes
        worker pods and lists the Running ones in the discovery script horovodrun reads."""
        patch = mpijob.scale_patch(spec, self.cluster)
        self._retrying(lambda: self.custom.patch_namespaced_custom_object(
            mpijob.GROUP, mpijob.VERSION, self.namespace, mpijob.PLURAL, spec.name, patch,
            _request_timeout=self.timings.request_seconds))

    def replace_worker(self, spec, pod):
        """Delete a failed worker pod of an elastic job, so the operator makes it again (on a node
        that can hold it) and Horovod takes it back in; gone already is fine."""
        try:
            self.core.delete_namespaced_pod(pod, self.namespace, _request_timeout=self.timings.request_seconds)
        except ApiException as exc:
            if exc.status != 404:
                raise

    # --- cancel ------------------------------------------------------------------------

    def cancel(self, spec):
        """Delete the MPIJob (its pods first) and the script's ConfigMap; return once the MPIJob
        and its pods are gone (or after Timings.cancel_seconds)."""
        self.delete(spec)
        deadline = time.monotonic() + self.timings.cancel_seconds
        while time.monotonic() < deadline:
            if self._get_mpijob(spec) is None and not self.pods(spec):
                return
            time.sleep(min(self.timings.poll_seconds, 1))
        log.warning("job %s: the MPIJob's pods were still there %s s after the delete",
                    spec.job_id, self.timings.cancel_seconds)

    def delete(self, spec):
        """Ask for the MPIJob (foreground: its pods go first) and the ConfigMap to be deleted."""
        options = client.V1DeleteOptions(propagation_policy="Foreground")
        for delete in (
            lambda: self.custom.delete_namespaced_custom_object(
                mpijob.GROUP, mpijob.VERSION, self.namespace, mpijob.PLURAL, spec.name, body=options,
                _request_timeout=self.timings.request_seconds),
            lambda: self.core.delete_namespaced_config_map(
                mpijob.script_configmap_name(spec), self.namespace, _request_timeout=self.timings.request_seconds),
        ):
            try:
                self._retrying(delete)
            except KubernetesError as exc:
                if not isinstance(exc.__cause__, ApiException) or exc.__cause__.status != 404:
                    raise

    # --- follow ------------------------------------------------------------------------

    def pods(self, spec):
        selector = f"{mpijob.JOB_NAME_LABEL}={spec.name}"
        return _items(self.core.list_namespaced_pod(self.namespace, label_selector=selector, _preload_content=False,
                                                    _request_timeout=self.timings.request_seconds))

    def follow(self, spec, offset, cursor=None):
        follower = _Follow(self, spec, offset, kubestatus.LogCursor.from_json(cursor))
        try:
            yield from follower.run()
        finally:
            follower.stop.set()


class _Follow:
    """One follow of one MPIJob: what the cluster says of it comes from the informer of its
    namespace (kubeinformer, shared by every follow of this process there), its launcher's log
    from a reader thread; both report to `events`, and run() (the caller's thread) decides what
    the job's state is."""

    def __init__(self, runner, spec, offset, cursor):
        self.runner, self.spec, self.offset = runner, spec, offset
        self.timings = runner.timings
        self.cursor = cursor
        self.events = queue.Queue()
        self.stop = threading.Event()
        self.ended = threading.Event()       # the MPIJob finished or is gone: read the logs out
        self.pods_changed = threading.Event()
        self.mpijob = None
        self.deleted = False
        self.view = None

    def _changed(self):
        """Called by the informer's threads when the job's MPIJob, pods or events changed."""
        self.events.put(("changed", None))
        self.pods_changed.set()

    def run(self):
        self.view = kubeinformer.subscribe(self.runner.connection, self.runner.api_client, self.runner.namespace,
                                           self.spec.installation, self.spec.name, self._changed, self.timings)
        try:
            yield from self._run()
        finally:
            self.view.close()

    def _look(self):
        """The MPIJob as the informer has it; the first time it has not seen it (just created,
        or gone before this follow began), as the API server answers."""
        if self.view.deleted():
            self.deleted = True
        found = self.view.mpijob()
        if found is not None:
            self.mpijob = found
        elif self.mpijob is None and not self.deleted:
            self.mpijob = self.runner._get_mpijob(self.spec)
            self.deleted = self.mpijob is None

    def _run(self):
        reader = threading.Thread(target=self._guard, args=(self._read_logs,), daemon=True, name="k8s-read-logs")
        reader.start()
        observation, next_poll = kubestatus.Observation(), 0.0
        kind, payload = "changed", None           # look at once
        while True:
            if kind == "log":
                data, cursor = payload
                start = self.offset
                self.offset += len(data)
                yield Output(data, start, cursor)
                if time.monotonic() < next_poll:
                    kind, payload = self._next()
                    continue
                kind = "tick"             # a launcher that prints all the time still gets its pods looked at
            if kind == "error":
                raise payload
            now = time.monotonic()
            polled = kind == "changed" or now >= next_poll
            if polled:
                next_poll = now + self.timings.poll_seconds
                self._look()
                if self.deleted:
                    self.ended.set()
            pods = self.view.pods()
            events = self.view.events() if polled and not observation.running_told else ()
            decision = kubestatus.observe(
                observation,
                kubestatus.Seen(mpijob=self.mpijob, deleted=self.deleted, pods=pods, events=events, polled=polled,
                                drained=kind == "drained", now=now, min_gpus=self.spec.min_gpus),
                self.timings.image_pull_grace_seconds, self.timings.drain_seconds)
            observation = decision.observation
            if observation.ended_at is not None:
                self.ended.set()                  # the log reader reads what is left, then says "drained"
                self.pods_changed.set()
            if decision.delete:
                self.runner.delete(self.spec)
            for pod in decision.replace:
                self.runner.replace_worker(self.spec, pod)
            yield from decision.tell
            if decision.done:
                return
            yield Waiting()
            kind, payload = self._next()

    def _next(self):
        try:
            return self.events.get(timeout=1)
        except queue.Empty:
            return "tick", None

    def _guard(self, body):
        try:
            body()
        except Exception as exc:   # reaches the follower, which fails or re-attaches
            if not self.stop.is_set():
                log.exception("job %s: %s stopped", self.spec.job_id, body.__name__)
                self.events.put(("error", exc))

    # --- the launcher's log ------------------------------------------------------------

    def _read_logs(self):
        """Read each launcher pod's log to its end, oldest pod first, resuming at the cursor."""
        cursor = self.cursor
        while not self.stop.is_set():
            if not cursor.pod:
                self.pods_changed.clear()
                fresh = [p for p in kubestatus.launcher_pods(self.view.pods()) if p["metadata"]["name"] not in cursor.done]
                if not fresh:
                    if self.ended.is_set():
                        self.events.put(("drained", None))
                        return
                    self.pods_changed.wait(self.timings.poll_seconds)
                    continue
                cursor.start(fresh[0]["metadata"]["name"])
            state = self._read_pod_log(cursor)
            if state == "done":
                cursor.finish()
                self.events.put(("log", (b"", cursor.to_json())))
            elif state == "waiting":
                self.stop.wait(self.timings.poll_seconds)

    def _read_pod_log(self, cursor):
        """Stream one pod's log from the cursor. Returns "done" (the pod finished and its log
        was read to the end, or the pod is gone), "waiting" (not started yet) or "again"."""
        reader = kubestatus.LogReader(cursor)
        since = cursor.since_seconds(time.time())
        try:
            response = self.runner.core.read_namespaced_pod_log(
                cursor.pod, self.runner.namespace, container=mpijob.LAUNCHER, follow=True, timestamps=True,
                _preload_content=False, _request_timeout=(self.timings.request_seconds, self.timings.log_idle_seconds),
                **({"since_seconds": since} if since else {}))
        except ApiException as exc:
            if exc.status == 404:
                return "done"
            if exc.status == 400:           # the container is not running yet
                return "waiting"
            if _transient(exc):
                return "waiting"
            raise
        except _TRANSIENT:
            return "waiting"
        clean = False
        try:
            for chunk in response.stream(64 * 1024, decode_content=False):
                data = reader.feed(chunk)
                if data:
                    self.events.put(("log", (data, cursor.to_json())))
                if self.stop.is_set():
                    return "again"
            clean = True
        except _TRANSIENT as exc:             # cut, or silent for too long: resume at the cursor
            log.info("job %s: launcher log of %s interrupted (%s), resuming", self.spec.job_id, cursor.pod, exc)
        finally:
            response.release_conn()
        pod = self._pod(cursor.pod)
        if pod is None:
            return "done"
        if clean and kubestatus.is_finished(pod):
            data = reader.finish()
            if data:
                self.events.put(("log", (data, cursor.to_json())))
            return "done"
        return "again"

    def _pod(self, name):
        try:
            pod = self.runner.core.read_namespaced_pod(name, self.runner.namespace,
                                                      _request_timeout=self.timings.request_seconds)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return self.runner.api_client.sanitize_for_serialization(pod)
