"""Reading what a cluster says about an MPIJob or a TrainJob: pure functions over the API's
JSON (dicts). What differs between the two is a Reading (MPIJOB, TRAINJOB).

- conditions -> where the job is (created, running, succeeded, failed);
- pods -> trouble a user can act on (not schedulable, image pull errors, OOMKilled, evicted);
- observe(): everything seen so far -> what the portal tells (Status, Running, Exited) and does
  (delete the MPIJob), the way mpi-operator's updateMPIJobStatus turns pods into conditions;
- the launcher's log lines (`timestamps=true`) -> a cursor that resumes a cut stream without
  losing or repeating a line.
"""
import re
from dataclasses import dataclass, field, replace
from datetime import datetime

from typing import Callable

from .base import Exited, Requeued, Running, Status
from .kueuestatus import eviction as kueue_eviction, waiting as kueue_waiting
from .mpijob import JOB_ROLE_LABEL, LAUNCHER
from .trainjob import CONTAINER as TRAINER_CONTAINER

EVICTED = "MPIJobEvicted"            # mpi-operator's Failed reason while a worker is evicted
PULL_ERRORS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}


def condition(mpijob, kind):
    """The condition `kind` of an MPIJob if its status is "True", else None."""
    for cond in (mpijob or {}).get("status", {}).get("conditions", []) or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


@dataclass(frozen=True)
class Outcome:
    succeeded: bool
    detail: str


def outcome(mpijob):
    """The MPIJob's end (Succeeded or Failed, with reason and message), or None while it runs."""
    done = condition(mpijob, "Succeeded")
    if done:
        return Outcome(True, done.get("message") or "MPIJob succeeded")
    failed = condition(mpijob, "Failed")
    if failed and failed.get("reason") == EVICTED and not mpijob.get("status", {}).get("completionTime"):
        # The operator says so as soon as one worker is evicted, while the launcher runs on: it
        # decides (mpirun fails without that worker; an elastic job goes on without it).
        return None
    if failed:
        # The operator writes "BackoffLimitExceeded/<pod reason>", the pod reason often empty.
        reason = (failed.get("reason") or "Failed").rstrip("/")
        message = (failed.get("message") or "").strip().rstrip(":").strip()
        return Outcome(False, f"MPIJob failed: {reason}" + (f": {message}" if message else ""))
    return None


def is_running(mpijob):
    return condition(mpijob, "Running") is not None and not suspended(mpijob)


def suspended(job):
    """Whether the MPIJob (runPolicy.suspend) or TrainJob (suspend) is suspended: by Kueue, which
    creates a labelled job so and unsuspends it on admission."""
    spec = (job or {}).get("spec") or {}
    return bool((spec.get("runPolicy") or {}).get("suspend") or spec.get("suspend"))


def _role(pod):
    return pod.get("metadata", {}).get("labels", {}).get("training.kubeflow.org/job-role", "")


def _name(pod):
    return pod.get("metadata", {}).get("name", "")


def _statuses(pod):
    status = pod.get("status", {}) or {}
    return (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])


def _memory_limit(pod, container):
    for spec in pod.get("spec", {}).get("containers", []):
        if spec.get("name") == container:
            return spec.get("resources", {}).get("limits", {}).get("memory")
    return None


def launcher_pods(pods):
    """Launcher pods, oldest first (a retried launcher is a new pod)."""
    return sorted((p for p in pods if _role(p) == "launcher"),
                  key=lambda p: (p.get("metadata", {}).get("creationTimestamp") or "", _name(p)))


def exit_code(pod):
    """The launcher container's exit code, if it terminated."""
    for status in _statuses(pod):
        terminated = (status.get("state") or {}).get("terminated")
        if terminated and status.get("name") != "init":
            return terminated.get("exitCode")
    return None


def is_finished(pod):
    return (pod.get("status", {}) or {}).get("phase") in ("Succeeded", "Failed")


# --- TrainJobs ---------------------------------------------------------------------------------

def trainjob_outcome(trainjob):
    """The TrainJob's end (Complete or Failed, with reason and message), or None while it runs."""
    done = condition(trainjob, "Complete")
    if done:
        return Outcome(True, done.get("message") or "TrainJob completed")
    failed = condition(trainjob, "Failed")
    if failed:
        reason = failed.get("reason") or "Failed"
        message = (failed.get("message") or "").strip()
        return Outcome(False, f"TrainJob failed: {reason}" + (f": {message}" if message else ""))
    return None


def trainer_pods(pods):
    """The trainer nodes' pods in node order (`<job>-node-0-<index>-<suffix>`)."""
    def index(pod):
        labels = pod.get("metadata", {}).get("labels") or {}
        found = labels.get("batch.kubernetes.io/job-completion-index", "")
        return (int(found) if found.isdigit() else 0, pod.get("metadata", {}).get("creationTimestamp") or "",
                _name(pod))
    return sorted(pods, key=index)


def trainjob_running(trainjob, pods):
    """Every node of the TrainJob has its pod running (or already finished), unsuspended."""
    if trainjob is None or condition(trainjob, "Suspended") or suspended(trainjob):
        return False
    nodes = ((trainjob.get("spec") or {}).get("trainer") or {}).get("numNodes") or 1
    started = [p for p in pods if (p.get("status") or {}).get("phase") in ("Running", "Succeeded", "Failed")]
    return len(started) >= nodes


def trainjob_waiting(trainjob):
    """Why a TrainJob that has no pod trouble waits (suspended until Kueue admits it), or ""."""
    suspended = condition(trainjob, "Suspended")
    if suspended:
        return f"suspended: {suspended.get('message') or 'TrainJob is suspended'} (waiting for admission)"
    return ""


STOPPED_CODE = 143                   # 128 + SIGTERM: a node stopped because another failed


def _finished_at(pod):
    for status in _statuses(pod):
        terminated = (status.get("state") or {}).get("terminated")
        if terminated:
            return terminated.get("finishedAt") or ""
    return ""


def first_failed_exit_code(pods):
    """The exit code of the node whose container failed first (one stopped by SIGTERM after
    another failed comes after it), or of the last that ended."""
    ended = [(p, exit_code(p)) for p in trainer_pods(pods) if exit_code(p) is not None]
    failed = sorted(((_finished_at(p), code == STOPPED_CODE), code) for p, code in ended if code != 0)
    return failed[0][1] if failed else (ended[-1][1] if ended else None)


@dataclass(frozen=True)
class Reading:
    """How to read one kind of workload: its end, whether it runs, why it waits, which pods'
    logs carry the ranks' output (in the order they are read) and in which container."""

    kind: str
    outcome: Callable
    running: Callable               # (workload, pods) -> bool
    running_detail: Callable        # pods -> what Running says
    waiting: Callable               # workload -> a reason while it waits without pod trouble ("")
    log_pods: Callable              # pods -> the pods whose logs to read, oldest first
    log_container: str
    exit_code: Callable             # pods -> the job's exit code, or None
    logs: str                       # what the logs are called
    # False: each pod's log is read to its end before the next one's (a retried launcher after
    # the one before it); True: every pod's log at once, as their lines come (a TrainJob's nodes).
    concurrent_logs: bool = False


def _workers_detail(pods):
    workers = sum(1 for p in pods if p.get("metadata", {}).get("labels", {}).get(JOB_ROLE_LABEL) == "worker")
    return f"MPIJob running ({workers or 'all'} workers)"


def _launcher_exit_code(pods):
    launchers = launcher_pods(pods)
    return exit_code(launchers[-1]) if launchers else None


MPIJOB = Reading("MPIJob", outcome, lambda job, pods: is_running(job), _workers_detail, lambda job: "",
                 launcher_pods, LAUNCHER, _launcher_exit_code, "the launcher's log")
TRAINJOB = Reading("TrainJob", trainjob_outcome, trainjob_running,
                   lambda pods: f"TrainJob running ({len(pods)} nodes)", trainjob_waiting,
                   trainer_pods, TRAINER_CONTAINER, first_failed_exit_code, "the nodes' logs", concurrent_logs=True)


@dataclass
class Trouble:
    """What the pods say now. `waiting`: why the job is not running yet; `notes`: things that
    explain a failure (OOMKilled, evicted); `pull_error`: an image that cannot be pulled."""

    waiting: str = ""
    notes: list = field(default_factory=list)
    pull_error: str = ""


def pod_trouble(pods):
    trouble = Trouble()
    for pod in sorted(pods, key=_name):
        status = pod.get("status", {}) or {}
        name = _name(pod)
        if status.get("reason") == "Evicted":
            trouble.notes.append(f"pod {name} was evicted: {status.get('message', '')}".rstrip(": "))
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and not trouble.waiting:
                if cond.get("reason") == "Unschedulable":
                    trouble.waiting = f"not schedulable yet: {cond.get('message', '')}".rstrip(": ")
        for cstatus in _statuses(pod):
            state = cstatus.get("state") or {}
            waiting, terminated = state.get("waiting"), state.get("terminated")
            last = (cstatus.get("lastState") or {}).get("terminated")
            if waiting and waiting.get("reason") in PULL_ERRORS:
                image = cstatus.get("image") or ""
                message = waiting.get("message") or waiting["reason"]
                trouble.pull_error = trouble.pull_error or f"cannot pull image {image}: {message}".replace(" : ", ": ")
            for term in (terminated, last):
                if term and term.get("reason") == "OOMKilled":
                    limit = _memory_limit(pod, cstatus.get("name"))
                    note = f"{cstatus.get('name')} in pod {name} was OOMKilled" + (
                        f" (memory limit {limit})" if limit else "")
                    if note not in trouble.notes:
                        trouble.notes.append(note)
    if trouble.pull_error and not trouble.waiting:
        trouble.waiting = f"waiting for the image: {trouble.pull_error}"
    return trouble


def validation_error(events):
    """The operator's complaint about a spec it will not run (a `ValidationError` event)."""
    for event in events:
        if event.get("reason") == "ValidationError":
            return event.get("message") or "ValidationError"
    return None


# --- The launcher's log, with timestamps -------------------------------------------------

_TS = re.compile(rb"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)\Z")


def parse_log_timestamp(raw):
    """(seconds since the epoch, nanoseconds) of a kubelet timestamp such as
    2026-11-23T13:39:08.123456789Z (RFC3339Nano, trailing zeros trimmed), or None."""
    match = _TS.match(raw)
    if not match:
        return None
    whole, fraction, zone = match.groups()
    moment = datetime.fromisoformat(whole.decode() + ("+00:00" if zone == b"Z" else zone.decode()))
    nanos = int((fraction or b"0").ljust(9, b"0"))
    return int(moment.timestamp()), nanos


@dataclass
class LogCursor:
    """Where the follower is in the launcher pods' logs: the pod being read, the timestamp of
    the last line taken and how many lines carried exactly that timestamp, and the pods read to
    the end. Stored with every batch of output, so a new follower resumes exactly there."""

    pod: str = ""
    ts: tuple | None = None
    same: int = 0
    done: list = field(default_factory=list)

    def to_json(self):
        return {"pod": self.pod, "ts": list(self.ts) if self.ts else None, "same": self.same, "done": list(self.done)}

    @classmethod
    def from_json(cls, data):
        data = data or {}
        ts = data.get("ts")
        return cls(pod=data.get("pod", ""), ts=tuple(ts) if ts else None, same=data.get("same", 0),
                   done=list(data.get("done", [])))

    def start(self, pod):
        self.pod, self.ts, self.same = pod, None, 0

    def finish(self):
        if self.pod and self.pod not in self.done:
            self.done.append(self.pod)
        self.pod, self.ts, self.same = "", None, 0

    def since_seconds(self, now, margin=300):
        """How far back to ask for lines when resuming: since the last line taken, plus a margin
        for clocks that disagree (lines before the cursor are skipped anyway)."""
        if not self.ts:
            return None
        return max(1, int(now - self.ts[0]) + margin)


class LogReader:
    """Turns a `timestamps=true` log stream into the launcher's output bytes, skipping lines the
    cursor has already taken. Only whole lines are taken: a stream cut mid-line is resumed from
    the start of that line."""

    def __init__(self, cursor):
        self.cursor = cursor
        self.buffer = bytearray()
        self._skipping_ts, self._seen_at_ts = cursor.ts, 0

    def feed(self, data):
        """Output bytes of the complete lines in `data` that the cursor has not taken yet."""
        self.buffer += data
        out = bytearray()
        while True:
            end = self.buffer.find(b"\n")
            if end < 0:
                break
            line = bytes(self.buffer[:end + 1])
            del self.buffer[:end + 1]
            out += self._take(line)
        return bytes(out)

    def finish(self):
        """At the end of a finished container's log: a last line without a newline."""
        if not self.buffer:
            return b""
        line = bytes(self.buffer) + b"\n"
        self.buffer.clear()
        return self._take(line)

    def _take(self, line):
        raw_ts, space, content = line.partition(b" ")
        ts = parse_log_timestamp(raw_ts) if space else None
        if ts is None:               # no timestamp: take it as it is
            return line
        if self._skipping_ts is not None:
            if ts < self._skipping_ts:
                return b""
            if ts == self._skipping_ts:
                self._seen_at_ts += 1
                if self._seen_at_ts <= self.cursor.same:
                    return b""
            self._skipping_ts = None
        if ts == self.cursor.ts:
            self.cursor.same += 1
        else:
            self.cursor.ts, self.cursor.same = ts, 1
        return content


# --- from what was seen to what to tell ------------------------------------------------------

@dataclass(frozen=True)
class Seen:
    """What the follower has seen of one MPIJob by `now` (time.monotonic() seconds)."""

    mpijob: dict | None             # the latest MPIJob from the watch (None: not yet)
    deleted: bool                   # the watch saw it deleted, or a list found none
    pods: tuple = ()                # the latest pods of the job
    events: tuple = ()              # its events from the latest poll
    polled: bool = False            # pods and events were read just now
    drained: bool = False           # the log reader has read every launcher's log to its end
    now: float = 0.0
    min_gpus: int | None = None     # an elastic job's minimum (None: a job of one size)
    reading: "Reading" = None       # what kind it is (None: an MPIJob)
    queue: object = None            # Kueue's view of it (runners.kueue.QueueView; None: no queue, or not read)


@dataclass(frozen=True)
class Observation:
    """What the follower has told so far, and what it keeps between two looks."""

    running_told: bool = False
    told: str = ""                  # the last Status reason told
    pull_since: float | None = None
    ended_at: float | None = None   # when the MPIJob was first seen finished or gone
    notes: tuple = ()               # pod trouble seen while running (OOMKilled, evicted)
    last_code: int | None = None    # the newest launcher's exit code

    def notes_text(self):
        return "; ".join(self.notes)


@dataclass(frozen=True)
class Decision:
    observation: Observation
    tell: tuple = ()                # runner events to yield, in order
    delete: bool = False            # delete the MPIJob (it will never run)
    replace: tuple = ()             # failed worker pods of an elastic job to delete (the operator remakes them)
    done: bool = False              # the follow is over (the last of `tell` is Exited)


def observe(before, seen, pull_grace_seconds, drain_seconds):
    """The next Observation from the previous one and what was `seen`, with what to tell and do."""
    now, tell = seen.now, []
    after = before
    reading = seen.reading or MPIJOB
    if seen.polled:
        rejected = validation_error(seen.events)
        if rejected:
            return Decision(after, (Exited(None, f"the MPI operator rejected the MPIJob: {rejected}"[:500]),),
                            delete=True, done=True)
        lost = lost_workers(seen) if after.running_told and reading.outcome(seen.mpijob) is None else {}
        trouble = pod_trouble([pod for pod in seen.pods if _name(pod) not in lost])
        trouble.notes += list(lost.values())
        after, pulled = _look_at_pods(after, seen, trouble, pull_grace_seconds, reading)
        if pulled is not None:
            return Decision(after, (pulled,), delete=True, done=True)
        if after.running_told and suspended(seen.mpijob):
            # Kueue took the job's quota back (the portal never suspends a job): its pods go;
            # it runs again once re-admitted.
            after = replace(after, running_told=False, told="", notes=(), last_code=None)
            tell.append(Requeued((kueue_eviction(seen.queue) or "suspended by Kueue")[:500]))
        held = None if after.running_told or trouble.waiting else _queued(seen)
        reason = after.notes_text() if after.running_told else (
            trouble.waiting or (held.words if held else "") or reading.waiting(seen.mpijob))
        place = held.place if held and held.words else ""
        if reason + place != after.told and (reason + place or after.told):
            after = replace(after, told=reason + place)
            tell.append(Status(reason[:500 - len(place)], place))
        if lost:
            return Decision(after, tuple(tell), replace=tuple(lost))
    if not after.running_told and reading.running(seen.mpijob, seen.pods):
        after = replace(after, running_told=True, told="")
        tell.append(Running(reading.running_detail(seen.pods)))
    end = reading.outcome(seen.mpijob)
    if end is not None or seen.deleted:
        after = replace(after, ended_at=after.ended_at if after.ended_at is not None else now)
        if seen.drained or now - after.ended_at > drain_seconds:
            tell.append(_end(end, after, seen.drained, reading))
            return Decision(after, tuple(tell), done=True)
    return Decision(after, tuple(tell))


def _queued(seen):
    """Why Kueue holds a suspended job and its place (a kueuestatus.Held), or None."""
    if seen.queue is None or not suspended(seen.mpijob):
        return None
    return kueue_waiting(seen.queue)


def _gpus(pod):
    return sum(int((c.get("resources", {}).get("limits") or {}).get("nvidia.com/gpu", 0) or 0)
               for c in pod.get("spec", {}).get("containers", []))


def _why_failed(pod):
    status = pod.get("status", {}) or {}
    if status.get("reason"):
        return f"{status['reason'].lower()}: {status.get('message', '')}".rstrip(": ")
    for cstatus in _statuses(pod):
        terminated = (cstatus.get("state") or {}).get("terminated")
        if terminated:
            return f"{terminated.get('reason') or 'exited'}, exit code {terminated.get('exitCode')}"
    return "failed"


def lost_workers(seen):
    """{pod name: what to say} of an elastic job's worker pods that failed (evicted, killed)
    while it runs: Horovod goes on with the Running ones (the operator's discovery script lists
    only those) when they hold the job's minimum; the portal has each failed pod made again."""
    if seen.min_gpus is None:
        return {}
    workers = [pod for pod in seen.pods if _role(pod) == "worker" and not pod["metadata"].get("deletionTimestamp")]
    failed = [pod for pod in workers if pod.get("status", {}).get("phase") == "Failed"]
    if not failed:
        return {}
    left = sum(_gpus(pod) for pod in workers if pod.get("status", {}).get("phase") == "Running")
    then = (f"continuing on {left} GPUs while Kubernetes replaces it" if left >= seen.min_gpus else
            f"{left} GPUs left, fewer than the {seen.min_gpus} the job needs: Horovod waits for its replacement")
    return {_name(pod): f"lost {_name(pod)} ({_why_failed(pod)}): {then}" for pod in sorted(failed, key=_name)}


def _look_at_pods(before, seen, trouble, pull_grace_seconds, reading):
    """Notes and exit code from the pods, and the Exited of an image that could not be pulled
    for the whole grace period (None while it may still be)."""
    notes = before.notes + tuple(note for note in dict.fromkeys(trouble.notes) if note not in before.notes)
    code = reading.exit_code(seen.pods)
    after = replace(before, notes=notes, last_code=code if code is not None else before.last_code)
    if not trouble.pull_error:
        return replace(after, pull_since=None), None
    after = replace(after, pull_since=before.pull_since if before.pull_since is not None else seen.now)
    if seen.now - after.pull_since >= pull_grace_seconds and not after.running_told:
        return after, Exited(None, f"image pull failed for {pull_grace_seconds:.0f} s: {trouble.pull_error}"[:500])
    return after, None


def _end(end, observation, drained, reading):
    """The Exited of an MPIJob or TrainJob that finished (or was deleted)."""
    if end is None:
        return Exited(None, f"the {reading.kind} was deleted outside Ringmaster")
    detail = end.detail if drained else f"{end.detail} ({reading.logs} may be incomplete)"
    if end.succeeded:
        return Exited(0, detail[:500])
    code = observation.last_code
    return Exited(code if code not in (None, 0) else None, detail[:500], cause=observation.notes_text()[:300])
