"""Jobs as Kubeflow MPIJobs (kubeflow.org/v2beta1) or Kubeflow Trainer TrainJobs
(trainer.kubeflow.org/v1alpha1), through the official kubernetes client. The job's launcher
names the builder of its kind (runners.launchers: `KUBERNETES`, runners.mpijob for horovod,
runners.trainjob for torchrun); kubestatus reads each kind (MPIJOB, TRAINJOB). Below, "the
MPIJob" stands for either.

- launch: create the MPIJob named after the job (spec.name: rm-<installation>-<id>); a 409 adopts the one a previous
  try created, so a retried task never makes a second job. 5xx answers and timeouts are
  retried. Then the uploaded script's ConfigMap, owned by the MPIJob.
- follow: two things at once. What the cluster says of the MPIJob, its pods and its events
  comes from the informer of its namespace (kubeinformer: one watch per kind for every job the
  worker process follows there), which gives its conditions and trouble a user can act on; the
  launcher pod's log (`follow`, `timestamps`) gives every rank's output (a TrainJob's: every
  node's pod's log at once, whole lines as they come). The log position (kubestatus.LogCursor,
  one per pod of a TrainJob) is stored with every batch, so a cut stream or a new follower
  resumes without losing or repeating a line, and a retried launcher (a new pod) is read after
  the old one.
- cancel: delete the MPIJob (foreground, so its pods go first) and the ConfigMap.
"""
import collections
import importlib
import json
import logging
import threading
import time
from dataclasses import dataclass

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from . import kubeinformer, kubelogs, kubestatus, kueue, launchers, mpijob, trainjob
from .base import Bell, Output, Runner, Started, Waiting

log = logging.getLogger(__name__)
_TRANSIENT = kubeinformer.TRANSIENT
RETRIED_STATUSES = (429, 500, 502, 503, 504)
REOPEN_SECONDS = 0.2            # a cut log stream is opened again after this


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
    kueue_seconds: float = 10           # a job Kueue holds: its Workload and place are read this often


class KubernetesError(Exception):
    pass


def _transient(exc):
    if isinstance(exc, ApiException):
        return exc.status in RETRIED_STATUSES or exc.status == 0
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


READINGS = {mpijob: kubestatus.MPIJOB, trainjob: kubestatus.TRAINJOB}


def builder_for(spec):
    """The builder module of the Kubernetes object `spec`'s launcher runs as."""
    return importlib.import_module(launchers.of(spec.launcher).KUBERNETES)


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
        builder = builder_for(spec)
        body, configmap = builder.build(spec, self.cluster)
        created, adopted = self._create_mpijob(spec, body)
        if configmap is not None:
            configmap = builder.new_script_configmap(spec, self.cluster, owner=created)
            self._retrying(lambda: self._create_ignoring_conflict(
                lambda: self.core.create_namespaced_config_map(
                    self.namespace, configmap, _request_timeout=self.timings.request_seconds)))
        where = f"{self.namespace}/{spec.name} on {self.cluster_name}"
        done = "adopted" if adopted else "created"
        return Started(detail=f"{done} the {builder.KIND} {where}", already_running=adopted)

    def _create_mpijob(self, spec, body):
        """(the MPIJob or TrainJob, adopted?). A 409 means an earlier try created it: take that
        one, if it is this job's."""
        builder = builder_for(spec)

        def create():
            try:
                return self.custom.create_namespaced_custom_object(
                    builder.GROUP, builder.VERSION, self.namespace, builder.PLURAL, body, field_validation="Strict",
                    _request_timeout=self.timings.request_seconds), False
            except ApiException as exc:
                if exc.status == 404:
                    raise KubernetesError(
                        f"{self.cluster_name}: {_message(exc)} (is {builder.OPERATOR} installed, serving "
                        f"{builder.API_VERSION}, and does namespace {self.namespace} exist?)") from exc
                if exc.status != 409:
                    raise
            existing = self._get_mpijob(spec)
            if existing is None:
                raise KubernetesError(f"{builder.KIND} {spec.name} exists and vanished again; retrying")
            if not mpijob.made_for(existing, spec):
                raise KubernetesError(f"a {builder.KIND} named {spec.name} already exists in {self.namespace} "
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
        """The job's MPIJob or TrainJob, or None."""
        builder = builder_for(spec)
        try:
            return self.custom.get_namespaced_custom_object(
                builder.GROUP, builder.VERSION, self.namespace, builder.PLURAL, spec.name,
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
        """Ask for the MPIJob or TrainJob (foreground: its pods go first) and the ConfigMap to be
        deleted."""
        builder = builder_for(spec)
        options = client.V1DeleteOptions(propagation_policy="Foreground")
        for delete in (
            lambda: self.custom.delete_namespaced_custom_object(
                builder.GROUP, builder.VERSION, self.namespace, builder.PLURAL, spec.name, body=options,
                _request_timeout=self.timings.request_seconds),
            lambda: self.core.delete_namespaced_config_map(
                builder.script_configmap_name(spec), self.namespace, _request_timeout=self.timings.request_seconds),
        ):
            try:
                self._retrying(delete)
            except KubernetesError as exc:
                if not isinstance(exc.__cause__, ApiException) or exc.__cause__.status != 404:
                    raise

    # --- follow ------------------------------------------------------------------------

    def pods(self, spec):
        selector = f"{builder_for(spec).JOB_NAME_LABEL}={spec.name}"
        return _items(self.core.list_namespaced_pod(self.namespace, label_selector=selector, _preload_content=False,
                                                    _request_timeout=self.timings.request_seconds))

    def follow(self, spec, offset, cursor=None):
        follower = _Follow(self, spec, offset, cursor)
        try:
            yield from follower.run()
        finally:
            follower.logs.close()


class _Follow:
    """One follow of one MPIJob: what the cluster says of it comes from the informer of its
    namespace (kubeinformer, shared by every follow of this process there), its launcher's log
    from a stream on kubelogs' loop (_LauncherLogs); both ring the follow's bell, and run() (the
    follower's steps) decides what the job's state is."""

    def __init__(self, runner, spec, offset, cursor):
        self.runner, self.spec, self.offset = runner, spec, offset
        self.builder = builder_for(spec)
        self.reading = READINGS[self.builder]
        self.timings = runner.timings
        self.bell = Bell()
        self.changed = threading.Event()     # the informer saw the MPIJob, its pods or events change
        self.ended = False                   # the MPIJob finished or is gone: read the logs out
        self.mpijob = None
        self.deleted = False
        self.view = None
        self.queue = None                    # Kueue's view of the job (kueue.QueueView), where it is queued
        self.next_queue_look = 0.0
        if self.reading.concurrent_logs:
            self.logs = _EveryPodsLogs(self, cursor)
        else:
            self.logs = _LauncherLogs(self, kubestatus.LogCursor.from_json(cursor))

    def _changed(self):
        """Called by the informer's threads when the job's MPIJob, pods or events changed."""
        self.changed.set()
        self.bell.ring()

    def run(self):
        self.view = kubeinformer.subscribe(self.runner.connection, self.runner.api_client, self.runner.namespace,
                                           self.spec.installation, self.spec.name, self._changed, self.timings,
                                           self.builder)
        try:
            yield from self._run()
        finally:
            self.view.close()

    def _look(self):
        """The MPIJob as the informer has it; the first time it has not seen it (just created,
        or gone before this follow began), as the API server answers."""
        if self.view.deleted():
            self.deleted = True
        found = self.view.workload()
        if found is not None:
            self.mpijob = found
        elif self.mpijob is None and not self.deleted:
            self.mpijob = self.runner._get_mpijob(self.spec)
            self.deleted = self.mpijob is None

    def _look_at_queue(self, now, changed, running):
        """Read what Kueue says of a job labelled for one of its queues: when the job changed
        (Kueue unsuspends it on admission and suspends it on preemption), and every
        Timings.kueue_seconds while it is held. A failed read keeps the last view."""
        if not kueue.queue_of(self.mpijob) or self.deleted:
            self.queue = None
            return
        held = not running or kubestatus.suspended(self.mpijob)
        if not held or not (changed or now >= self.next_queue_look):
            return
        self.next_queue_look = now + self.timings.kueue_seconds
        try:
            self.queue = kueue.look(self.runner.api_client, self.runner.namespace, self.mpijob,
                                    self.timings.request_seconds)
        except Exception as exc:            # never the end of the follow: Kueue's words wait
            log.info("job %s: reading its Kueue workload failed (%s)", self.spec.job_id, _message(exc))

    def _run(self):
        observation, next_poll, next_tick = kubestatus.Observation(), 0.0, 0.0
        self.changed.set()                    # look at once
        while True:
            now = time.monotonic()
            printed = False
            for data, cursor in self.logs.take(now):
                start = self.offset
                self.offset += len(data)
                printed = True
                yield Output(data, start, cursor)
            now = time.monotonic()
            changed = self.changed.is_set()
            if changed:                       # what changed meanwhile is in the informer already
                self.changed.clear()
            # A launcher that prints all the time still gets its pods looked at now and then.
            if changed or now >= next_tick or (self.logs.drained and not printed):
                next_tick = now + min(1.0, self.timings.poll_seconds)
                polled = changed or now >= next_poll
                if polled:
                    next_poll = now + self.timings.poll_seconds
                    self._look()
                    if self.deleted:
                        self.ended = True
                pods = self.view.pods()
                events = self.view.events() if polled and not observation.running_told else ()
                if polled:
                    self._look_at_queue(now, changed, observation.running_told)
                decision = kubestatus.observe(
                    observation,
                    kubestatus.Seen(mpijob=self.mpijob, deleted=self.deleted, pods=pods, events=events, polled=polled,
                                    drained=self.logs.drained, now=now, min_gpus=self.spec.min_gpus,
                                    reading=self.reading, queue=self.queue),
                    self.timings.image_pull_grace_seconds, self.timings.drain_seconds)
                observation = decision.observation
                if observation.ended_at is not None:
                    self.ended = True         # the logs are read to their end, then drained
                if decision.delete:
                    self.runner.delete(self.spec)
                for pod in decision.replace:
                    self.runner.replace_worker(self.spec, pod)
                yield from decision.tell
                if decision.done:
                    return
            if self.logs.has_news() or (self.ended and not self.logs.drained and self.logs.idle()):
                continue                       # more has come, or the next launcher's log is due
            yield Waiting(seconds=max(0.0, min(next_tick, self.logs.due()) - time.monotonic()), bell=self.bell)


class _LauncherLogs:
    """Each launcher pod's log to its end, oldest pod first, resuming at the cursor: one stream
    at a time, read on kubelogs' loop, which queues what arrives and rings the follow's bell;
    take() (the follow's steps) turns it into the launcher's output and opens the next stream.
    `only`: read that pod's log alone (one of _EveryPodsLogs' parts)."""

    def __init__(self, follow, cursor, only=None):
        self.follow, self.cursor, self.only = follow, cursor, only
        self.arrived = collections.deque()    # ("data", bytes) and ("end", exception or None), from the loop
        self.stream = self.reader = None
        self.open_at = 0.0                    # no stream before this (a refused or cut one: not at once)
        self.drained = False                  # every launcher's log was read to its end, and the job ended

    def _arrive(self, kind, value):
        self.arrived.append((kind, value))
        self.follow.bell.ring()

    def has_news(self):
        return bool(self.arrived)

    def idle(self):
        return self.stream is None and time.monotonic() >= self.open_at

    def due(self):
        """When take() should be called again without a ring: a stream to open then."""
        return self.open_at if self.stream is None and not self.drained else float("inf")

    def take(self, now):
        """[(output bytes, cursor json)] for what arrived (what arrived together: one piece, up to
        a stream's end); opens the next stream where one is due."""
        taken, data = [], bytearray()
        while self.arrived:
            kind, value = self.arrived.popleft()
            if kind == "data":
                data += self.reader.feed(value)
                continue
            if data:
                taken.append((bytes(data), self.cursor.to_json()))
                data.clear()
            self.stream = None
            taken += self._ended(value, now)
        if data:
            taken.append((bytes(data), self.cursor.to_json()))
        if self.stream is None and not self.drained and now >= self.open_at:
            self._open(now)
        return taken

    def _open(self, now):
        cursor = self.cursor
        if not cursor.pod:
            done = cursor.done
            fresh = [p for p in self.follow.reading.log_pods(self.follow.view.pods())
                     if p["metadata"]["name"] not in done and self.only in (None, p["metadata"]["name"])]
            if not fresh:
                self.drained = self.follow.ended
                return                         # the informer rings when a launcher pod appears
            cursor.start(fresh[0]["metadata"]["name"])
        runner, timings = self.follow.runner, self.follow.timings
        self.reader = kubestatus.LogReader(cursor)
        self.stream = kubelogs.open_stream(
            runner.api_client, runner.namespace, cursor.pod, self.follow.reading.log_container,
            cursor.since_seconds(time.time()),
            (timings.request_seconds, timings.log_idle_seconds),
            on_data=lambda data: self._arrive("data", data), on_end=lambda error: self._arrive("end", error))

    def _ended(self, error, now):
        """The stream of the cursor's pod ended (`error`: None where it ended cleanly)."""
        cursor = self.cursor
        if isinstance(error, kubelogs.LogStreamError):
            if error.status == 404:
                return self._pod_done()
            if error.status in (0, 400, *RETRIED_STATUSES):   # unreachable, not started yet, or busy
                self.open_at = now + self.follow.timings.poll_seconds
                return []
            raise KubernetesError(f"cannot read the launcher's log of {cursor.pod}: {error}")
        if error is not None:                 # cut, or silent for too long: resume at the cursor
            log.info("job %s: launcher log of %s interrupted (%s), resuming", self.follow.spec.job_id, cursor.pod,
                     str(error) or type(error).__name__)
        self.open_at = now + REOPEN_SECONDS   # a stream that keeps ending is not reopened in a spin
        pod = self._pod(cursor.pod)
        if pod is None:
            return self._pod_done()
        if error is None and kubestatus.is_finished(pod):
            data = self.reader.finish()
            return ([(data, cursor.to_json())] if data else []) + self._pod_done()
        return []

    def _pod_done(self):
        self.cursor.finish()
        return [(b"", self.cursor.to_json())]

    def close(self):
        if self.stream is not None:
            self.stream.cancel()
            self.stream = None

    def _pod(self, name):
        runner = self.follow.runner
        try:
            pod = runner.core.read_namespaced_pod(name, runner.namespace, _request_timeout=runner.timings.request_seconds)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return runner.api_client.sanitize_for_serialization(pod)


class _EveryPodsLogs:
    """Every pod's log at once (Reading.concurrent_logs: a TrainJob's nodes run together, and a
    line of node 1 must not wait for node 0's end): a _LauncherLogs of its own per pod, their
    whole lines taken as they come. The cursor is each pod's LogCursor by name."""

    def __init__(self, follow, cursor):
        self.follow = follow
        self.parts = {}
        for name, saved in _every_pods_cursor(cursor).items():
            self._add(name, kubestatus.LogCursor.from_json(saved))

    def _add(self, name, cursor):
        self.parts[name] = _LauncherLogs(self.follow, cursor, only=name)

    def cursor_json(self, taken=None):
        """Every part's cursor; `taken`: (pod, the cursor of what that part just gave)."""
        every = {name: part.cursor.to_json() for name, part in self.parts.items()}
        if taken is not None:
            every[taken[0]] = taken[1]
        return {"every": every}

    @property
    def drained(self):
        return self.follow.ended and all(part.drained for part in self.parts.values())

    def has_news(self):
        return any(part.has_news() for part in self.parts.values())

    def idle(self):
        return all(part.idle() for part in self.parts.values())

    def due(self):
        return min((part.due() for part in self.parts.values()), default=float("inf"))

    def take(self, now):
        """[(output bytes, cursor json)] of what every pod's log gave (whole lines), after
        adding a part for each pod that appeared."""
        if self.follow.view is not None:
            for pod in self.follow.reading.log_pods(self.follow.view.pods()):
                if pod["metadata"]["name"] not in self.parts:
                    self._add(pod["metadata"]["name"], kubestatus.LogCursor())
        taken = []
        for name, part in self.parts.items():
            for data, cursor in part.take(now):
                taken.append((data, self.cursor_json((name, cursor))))
        return taken

    def close(self):
        for part in self.parts.values():
            part.close()


def _every_pods_cursor(cursor):
    """{pod: LogCursor json} of a stored cursor: _EveryPodsLogs' own, or that of a reading of one
    pod at a time, whose pods each become a part."""
    cursor = cursor or {}
    if "every" in cursor:
        return dict(cursor["every"])
    every = {name: {"done": [name]} for name in cursor.get("done", [])}
    if cursor.get("pod"):
        every[cursor["pod"]] = {**cursor, "done": []}
    return every
