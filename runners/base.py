"""The Runner interface: how a job actually runs, whatever the backend.

A runner never sees the database. It gets a JobSpec (plain data) and reports through events:
launch() returns Started; follow() yields Output chunks of the launcher's combined output, and
finally Exited. Everything a runner does is idempotent and keyed by the job id, so a Celery task
that is retried, or a follower that re-attaches after a crash, never starts a job twice.
"""
import json
import selectors
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from .gpus import gpu_map_value


def job_name(installation, job_id):
    """A job's name outside the portal's database (JobSpec.name)."""
    return f"rm-{installation}-{job_id}" if installation else f"rm-job-{job_id}"


@dataclass(frozen=True)
class JobSpec:
    job_id: int
    gpus: int
    python: str                      # the interpreter (with Horovod) of the job's environment
    script_name: str                 # file name of the script inside the job directory
    script_content: str | None       # an uploaded script, or None to run script_path
    script_path: str | None          # a path inside the image
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    time_limit_seconds: int | None = None
    container_image: str = ""        # the Kubernetes backend's image
    installation: str = ""           # the portal's id: in every name it gives outside its database
    launcher: str = "horovod"        # what starts the ranks: a name of runners.launchers.LAUNCHERS
    # The GPU indices the job owns on each of its hosts, in host order (the first runs
    # horovodrun); () where it owns no GPUs of its own (CPU slots, Kubernetes' device plugin).
    gpu_binding: tuple[tuple[int, ...], ...] = ()
    # Elastic jobs: `gpus` is the size now, between min_gpus and max_gpus (None: a fixed size).
    min_gpus: int | None = None
    max_gpus: int | None = None
    # A rerun from a checkpoint, or a restart: (the folder on the portal's machine holding the old
    # job's artifacts, or the job's own, the checkpoint's name in it); the runner puts that file in
    # the job's folder and names it in RINGMASTER_CHECKPOINT (runners.artifacts).
    checkpoint: tuple[str, str] | None = None
    # A project (runners.projects.pack's archive) laid out in the job's folder, whose entry point
    # `script_name` is; None: a script (script_content or script_path).
    project: bytes | None = None
    # What the kernel lets the job use (runners.limits): its processes and threads together, and
    # its memory in MiB, on each host; None: no limit.
    max_processes: int | None = None
    memory_mib: int | None = None
    # Which run of the job this is (1, then one more per restart: jobs.domain.recovery). A runner
    # that restarts jobs launches an attempt it has not launched yet anew, in the job's folder.
    attempt: int = 1
    # Whether the image takes a project's extra packages (runners.packages); a runner that
    # installs them refuses a project that names some where it does not.
    extra_packages: bool = True

    @property
    def checkpoint_file(self):
        """The checkpoint's file name in the job's checkpoint folder (its last part), or None."""
        return self.checkpoint[1].rsplit("/", 1)[-1] if self.checkpoint is not None else None

    @property
    def name(self):
        """The name every backend derives from the portal's id and the job id (job folders,
        MPIJobs): unique per installation, and a valid DNS-1035 label."""
        return job_name(self.installation, self.job_id)

    def rank_argv(self):
        """What a rank runs after `python`: the script and the user's words."""
        ours = self.script_content is not None or self.project is not None
        return [self.script_name if ours else self.script_path, *self.args]

    def rank_command(self):
        """argv of one rank under horovodrun, which would parse the user's words as its own
        options: the rank launcher (job_python/ringmaster_rank.py) reads them from ARGV_FILE in
        the job folder (see argv_file) and binds the job's GPUs."""
        return [self.python, "-m", RANK_MODULE]

    def argv_file(self):
        """(name, content) of the file the rank launcher reads in the job folder."""
        return ARGV_FILE, json.dumps(self.rank_argv()).encode()

    @property
    def bound(self):
        return any(self.gpu_binding)

    @property
    def elastic(self):
        return self.max_gpus is not None

    def gpu_map(self, host_names):
        """RINGMASTER_GPU_MAP's value for hosts named as horovodrun names them (in host order)."""
        return gpu_map_value(dict(zip(host_names, self.gpu_binding)))

    def world_size_env(self):
        """{RINGMASTER_WORLD_SIZE: the number of ranks} for a job of one size, which its rank
        launcher holds the world its script makes to; {} for an elastic job, whose size changes."""
        return {} if self.elastic else {WORLD_SIZE_VAR: str(self.gpus)}

    def gpu_env(self, host_names):
        """{RINGMASTER_GPU_MAP: ...} for hosts named as horovodrun's -H names them (in host
        order), or {} for a job that owns no GPUs. An elastic job's GPUs change while it runs:
        its ranks read them from GPU_MAP_FILE in the job folder (Runner.resize rewrites it)."""
        if not self.bound:
            return {}
        if self.elastic:
            return {GPU_MAP_FILE_VAR: GPU_MAP_FILE}
        return {GPU_MAP: self.gpu_map(host_names)}


RANK_MODULE = "ringmaster_rank"
ARGV_FILE = "argv.json"
GPU_MAP = "RINGMASTER_GPU_MAP"
# A job's ranks: the rank launcher stops a rank whose script makes a world of another size.
WORLD_SIZE_VAR = "RINGMASTER_WORLD_SIZE"
GPU_MAP_FILE_VAR, GPU_MAP_FILE = "RINGMASTER_GPU_MAP_FILE", "gpu_map"
# Elastic jobs: horovodrun asks this script in the job folder which hosts and slots the job has
# now; it prints HOSTS_FILE, which the portal rewrites on every resize (Runner.resize).
DISCOVERY_SCRIPT, HOSTS_FILE = "discover_hosts.sh", "hosts"
DISCOVERY_SCRIPT_TEXT = '#!/bin/sh\nexec cat "$(dirname "$0")/hosts"\n'
# Horovod blacklists a host whose ranks failed (a lost instance, a deleted worker pod) for good
# unless given a cool-down; then a host listed again (healthy, or a replacement pod of the same
# name) is taken back in after 10 to 60 seconds.
BLACKLIST_COOLDOWN = ("--blacklist-cooldown-range", "10", "60")

# What every launcher wraps horovodrun in: record its exit code atomically (a reader sees no file
# or the whole code). User words never enter this string: they are positional parameters,
# expanded by "$@" without being parsed again.
EXIT_CODE_WRAPPER = '"$@"; code=$?; echo "$code" > exit_code.tmp && mv exit_code.tmp exit_code'
# Every process of a job carries its id, and its folder (unique per portal and host: what
# cancel finds them by, so another portal's job of the same number is never touched).
JOB_ID_VAR = "RINGMASTER_JOB_ID"
JOB_DIR_VAR = "RINGMASTER_JOB_DIR"
# The host a rank runs on, as the GPU map names it, for launchers that do not say it themselves
# (horovodrun does, in HOROVOD_HOSTNAME; torchrun does not).
HOST_NAME_VAR = "RINGMASTER_HOSTNAME"
# Where a launcher starts a host's ranks in more than one group (an elastic torchrun job: an agent
# per GPU), the position among the job's GPUs on that host of the group's first rank: its
# LOCAL_RANK 0.
SLOT_VAR = "RINGMASTER_SLOT"


def horovodrun_argv(launcher, spec, hosts, start_timeout, extra=(), wrapper=()):
    """horovodrun's argv for `spec` on `hosts` ("h1:2,h2:2"): Gloo, no cache, an explicit start
    timeout, then the rank launcher (no word of the user: those are in the job folder's argv
    file). `launcher` is how horovodrun is started (["horovodrun"] or [python, "-m",
    "horovod.runner.launch"]); `extra` are more options (ssh port and key, network interface),
    which must come before the training command; `wrapper` starts each rank (before the rank
    launcher's words)."""
    if spec.elastic:
        # The hosts come from the discovery script; no reset limit (every resize is a reset).
        where = ["--min-np", str(spec.min_gpus), "--max-np", str(spec.max_gpus),
                 "--host-discovery-script", f"./{DISCOVERY_SCRIPT}", *BLACKLIST_COOLDOWN]
    else:
        where = ["-H", hosts]
    return [
        *launcher, "--gloo", "-np", str(spec.gpus), *where, *extra,
        "--disable-cache", "--start-timeout", str(start_timeout),
        *wrapper, *spec.rank_command(),
    ]


@dataclass(frozen=True)
class Placement:
    """Where a job's ranks run over SSH, for its launcher (runners.launchers.*.over_ssh):
    each host as (the name its GPUs are mapped by, its address, its slots), the first one
    starting the others; how the first reaches them; the rank wrapper; and the variables every
    host's processes get from the first's environment."""
    hosts: tuple[tuple[str, str, int], ...]
    start_timeout: int
    ssh_port: int | None = None
    ssh_key: str = ""
    network_interface: str = ""
    wrapper: tuple[str, ...] = ()
    forward: tuple[str, ...] = ()


@dataclass(frozen=True)
class Started:
    detail: str
    already_running: bool = False


@dataclass(frozen=True)
class Output:
    data: bytes
    offset: int          # byte offset of data[0] in the launcher's output
    cursor: dict | None = None   # where a backend that cannot seek by offset resumes (stored with the data)


@dataclass(frozen=True)
class Running:
    """The job runs (for runners whose launch returns before it does: reports_running)."""
    detail: str = ""


@dataclass(frozen=True)
class Status:
    """Something the user should know while the job waits or runs (e.g. why it is not scheduled).
    `place`, where the job stands in the cluster's queue, is shown after the reason; a change of
    place alone records no job event."""
    reason: str
    place: str = ""


@dataclass(frozen=True)
class Requeued:
    """The running job was stopped by the cluster's queue (Kueue preempted or evicted it) and
    waits to be admitted again, when it starts over by itself (follow yields Running again)."""
    reason: str


class Bell:
    """What wakes a waiting follow when another thread has news for it (a watch saw its pods
    change, a log stream read its lines): ring() from any thread; the follower's driver listens.
    A ring before anyone listens is kept until the next listen()."""

    def __init__(self):
        self._lock = threading.Lock()
        self._rung = False
        self._listener = None

    def ring(self):
        with self._lock:
            listener, self._listener = self._listener, None
            self._rung = listener is None
        if listener is not None:
            listener()

    def listen(self, callback):
        """Call `callback` (once, from the ringing thread) at the next ring, or now if it rang
        since the last listen."""
        with self._lock:
            rung, self._rung = self._rung, False
            self._listener = None if rung else callback
        if rung:
            callback()

    def forget(self):
        """Stop listening (the follow woke for another reason); a ring meanwhile is kept."""
        with self._lock:
            self._listener = None


@dataclass(frozen=True)
class Waiting:
    """Nothing new yet: lets the follower check for cancel, time limit and heartbeat, and tells
    it what to wait on before it asks the runner's follow for more. A follow never blocks while it
    waits for output (one worker thread drives many follows): it yields Waiting, and is resumed
    once `fd` is readable, `bell` rings, or `seconds` have passed, whichever comes first (or
    sooner: a follow looks again and yields Waiting again if there is still nothing)."""
    seconds: float = 1.0
    fd: int | None = None
    bell: Bell | None = None


@dataclass(frozen=True)
class Exited:
    code: int | None      # None: the launcher vanished without reporting an exit code
    detail: str = ""
    cause: str = ""       # what the backend saw that explains a failure (an OOMKilled or evicted pod)
    # The job's limits that the kernel held with rlimits, where no cgroup counted what the job hit:
    # ((runners.limits.PROCESSES or MEMORY, the limit), ...); the job's lines tell (printed_hit).
    rlimits: tuple[tuple[str, int], ...] = ()


def waited(events):
    """A follow's events for a caller that has a thread to spend on it (a test, a command): each
    Waiting is yielded, then waited out here (its fd, bell or time) before the follow goes on."""
    for event in events:
        yield event
        if isinstance(event, Waiting):
            wait_out(event)


def wait_out(waiting):
    """Block until `waiting` is over: its fd readable, its bell rung or its time passed."""
    rung = threading.Event()
    if waiting.bell is not None:
        waiting.bell.listen(rung.set)
    try:
        if waiting.fd is None:
            rung.wait(waiting.seconds)
            return
        deadline = time.monotonic() + waiting.seconds
        with selectors.DefaultSelector() as selector:
            selector.register(waiting.fd, selectors.EVENT_READ)
            while not rung.is_set() and not selector.select(min(0.05, max(0.0, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    return
    finally:
        if waiting.bell is not None:
            waiting.bell.forget()


class Runner(ABC):
    name = "base"
    # False: the job runs once launch() returns. True: follow() yields Running when it does.
    reports_running = False

    @abstractmethod
    def launch(self, spec: JobSpec) -> Started:
        """Start the job unless it already started; never start it twice."""

    @abstractmethod
    def follow(self, spec: JobSpec, offset: int,
               cursor: dict | None = None) -> Iterator[Output | Running | Status | Requeued | Waiting | Exited]:
        """Yield the launcher's output from byte `offset` on, then Exited. `cursor` is the last
        Output's cursor that was stored, for runners that use one. It never blocks waiting for
        output: it yields Waiting (what to wake it on) and looks again when resumed. A caller that stops early
        (it lost its claim on the job) closes the generator: a runner frees what it holds
        (connections, threads) in `finally`."""

    @abstractmethod
    def cancel(self, spec: JobSpec) -> None:
        """Stop every process of the job and return once none is left."""

    def resize(self, spec: JobSpec) -> None:
        """Make an elastic job's hosts what `spec` says (spec.gpus, spec.gpu_binding) from now on;
        idempotent. Only runners of backends with `elastic` implement it."""
        raise NotImplementedError(f"{self.name} does not resize jobs")

    def system_probe(self, spec: JobSpec):
        """Something with sample() -> [runners.telemetry.Sample] and close(), that looks at the
        job's hosts while it runs; None where this runner cannot (the page says so)."""
        return None
