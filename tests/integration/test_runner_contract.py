"""The runner contract, written once and run against every runner:

- `local`: runners.local.LocalRunner, real horovodrun (Gloo) on this machine;
- `ssh`: runners.ssh.SSHRunner, real horovodrun over two real sshd on 127.0.0.2 and 127.0.0.3
  (one slot each, so the two ranks run on two "instances" and horovodrun itself uses SSH);
- `kubernetes`: runners.kubernetes.KubernetesRunner with a real `kubernetes` ApiClient against the
  protocol-level fake API server (tests/fakekube), which plays the MPI operator and the kubelet.

What a job does is described once, as a `Plan` (lines per rank, a pause between lines, whether
the ranks hold after their first line until the test releases them, a rank that fails). For
local and ssh the plan is a real script that horovodrun runs on each rank (it reads
HOROVOD_RANK; a held rank polls for a release file). On the fake cluster nothing runs: the plan
becomes a fakekube Scenario, and the fake's launcher "container" prints the very lines mpirun
would (`[1,<rank>]<stdout>:rank=<r> line=<i>`, one chunk per line index, `step_seconds` apart),
holds after the first chunk until a threading.Event is set, and exits with 3 when a rank fails
(backoffLimit 0, so the operator marks the MPIJob Failed). The script is still uploaded (it
becomes the job's ConfigMap), only never executed.

The contract: launch is idempotent (from one runner object or another with the same settings,
even at the same moment); follow resumes from a byte offset (and the Kubernetes log cursor) with
nothing lost or repeated; cancel stops its own job and nothing else; a failing rank ends the job
with a non-zero exit code. Runners never touch the database, so neither does this module.
"""
import dataclasses
import itertools
import sys
import threading
import time
from pathlib import Path

import pytest

from runners.base import JOB_DIR_VAR, Exited, JobSpec, Output, waited
from runners.output import OutputSplitter
from tests import sshd
from tests.conftest import processes_marked, wait_for

pytestmark = pytest.mark.integration

NP = 2                     # ranks of every job here (2 "GPUs")
FAIL_CODE = 3
SCRIPT = """\
import os, sys, time

lines, interval, release, fail_rank = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], int(sys.argv[4])
rank = int(os.environ["HOROVOD_RANK"])
for i in range(lines):
    print(f"rank={rank} line={i}", flush=True)
    if i == 0 and release:                      # hold until the test releases the job (at most 120 s)
        deadline = time.monotonic() + 120
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)
    time.sleep(interval)
if rank == fail_rank:
    sys.exit(FAIL_CODE)
""".replace("FAIL_CODE", str(FAIL_CODE))
_job_ids = itertools.count(870001)


@dataclasses.dataclass(frozen=True)
class Plan:
    lines: int = 4                  # lines per rank: "rank=<r> line=<i>"
    interval: float = 0.05          # seconds between two lines of a rank
    hold: bool = False              # after line 0 every rank waits for Backend.release()
    fail_rank: int | None = None    # this rank exits FAIL_CODE after its lines

    def expected(self):
        return {rank: [f"rank={rank} line={i}" for i in range(self.lines)] for rank in range(NP)}


def job_spec(job_id, plan, python, release="", **extra):
    """The JobSpec that runs SCRIPT with `plan` (its arguments: lines, interval, release file, fail rank)."""
    fail_rank = -1 if plan.fail_rank is None else plan.fail_rank
    return JobSpec(job_id=job_id, gpus=NP, python=python, script_name="contract.py", script_content=SCRIPT,
                   script_path=None, args=(str(plan.lines), str(plan.interval), release, str(fail_rank)), **extra)


# --- one adapter per runner ---------------------------------------------------------------------

class Backend:
    """How the contract tests make a runner and a job spec, release a held job, and see what of a
    job is still there."""

    name = "base"

    def __init__(self):
        self.launched = []          # specs to clean up after the test

    def runner(self):
        """A new runner object with this backend's (same) settings."""
        raise NotImplementedError

    def spec(self, plan, job_id=None, installation=""):
        """A new job (or job `job_id` of portal `installation`) that runs `plan`."""
        raise NotImplementedError

    def release(self, spec):
        raise NotImplementedError

    def running(self, spec):
        """What of the job still runs: its processes, or its unfinished MPIJob and pods; [] when none."""
        raise NotImplementedError

    def launch(self, runner, spec):
        self.launched.append(spec)
        return runner.launch(spec)

    def cleanup(self):
        for spec in self.launched:
            if self.running(spec):
                self.release(spec)
                self.runner().cancel(spec)


class ScriptBackend(Backend):
    """local and ssh: horovodrun runs SCRIPT; a job's processes carry RINGMASTER_JOB_DIR."""

    def __init__(self, tmp_path):
        super().__init__()
        self.tmp_path = tmp_path

    def spec(self, plan, job_id=None, installation=""):
        job_id = job_id or next(_job_ids)
        release = str(self.tmp_path / f"release-{installation}-{job_id}") if plan.hold else ""
        return job_spec(job_id, plan, sys.executable, release, installation=installation)

    def release(self, spec):
        # The hold file spec() named, only: a test that gives the script words of its own (the
        # words test: horovodrun's options) must not have one of them made a file in the cwd.
        if spec.args[2] and Path(spec.args[2]).parent == self.tmp_path:
            Path(spec.args[2]).touch()

    def job_dir(self, spec):
        raise NotImplementedError

    def running(self, spec):
        return processes_marked(str(Path(self.job_dir(spec)).resolve()), JOB_DIR_VAR)


class LocalBackend(ScriptBackend):
    name = "local"

    def runner(self):
        from runners.local import LocalRunner

        return LocalRunner(self.tmp_path / "jobs", kill_grace=5)

    def job_dir(self, spec):
        return self.runner().job_dir(spec)


class SSHBackend(ScriptBackend):
    name = "ssh"

    def __init__(self, tmp_path, sshds):
        super().__init__(tmp_path)
        self.sshds = sshds

    def hosts(self):
        from runners.ssh import Host

        key = self.sshds["key"]
        return [Host(name=f"instance-{address}", address=address, port=self.sshds["port"], user="root",
                     private_key=key.read_text(), slots=1, work_dir=str(self.tmp_path / "work"),
                     peer_ssh_port=self.sshds["port"], peer_ssh_key=str(key), network_interface="lo")
                for address in ("127.0.0.2", "127.0.0.3")]

    def runner(self):
        from runners.ssh import SSHRunner

        return SSHRunner(self.hosts(), kill_grace=5, poll_interval=0.1)

    def job_dir(self, spec):
        return self.hosts()[0].job_dir(spec)


class KubernetesBackend(Backend):
    """The fake plays the job from a Scenario made of the plan (see the module docstring)."""

    name = "kubernetes"
    NS = "contract"

    def __init__(self, fake, kubeconfig):
        super().__init__()
        self.fake, self.kubeconfig = fake, kubeconfig
        self.holds = {}
        self.clients = []

    def runner(self):
        from kubernetes import config

        from runners.kubernetes import KubernetesRunner, Timings
        from runners.mpijob import ClusterSpec

        api_client = config.new_client_from_config(config_file=str(self.kubeconfig))
        self.clients.append(api_client)
        timings = Timings(request_seconds=5, retry_seconds=0.1, poll_seconds=0.2, drain_seconds=10,
                          cancel_seconds=30)
        return KubernetesRunner(api_client, ClusterSpec(namespace=self.NS, gpus_per_node=1), timings, "fake")

    def spec(self, plan, job_id=None, installation=""):
        from tests.fakekube import Scenario

        spec = job_spec(job_id or next(_job_ids), plan, "python", container_image="registry.example/horovod:0.28.1",
                        installation=installation)
        chunks = [b"".join(b"[1,%d]<stdout>:rank=%d line=%d\n" % (rank, rank, i) for rank in range(NP))
                  for i in range(plan.lines)]
        hold = self.holds[spec.name] = threading.Event()
        if not plan.hold:
            hold.set()
        self.fake.scenarios[spec.name] = Scenario(
            attempts=[(chunks, FAIL_CODE if plan.fail_rank is not None else 0)],
            step_seconds=plan.interval, hold=hold)
        return spec

    def release(self, spec):
        self.holds[spec.name].set()

    def running(self, spec):
        mpijob = self.fake.mpijob(self.NS, spec.name)
        pods = self.fake.pods(self.NS, selector=f"training.kubeflow.org/job-name={spec.name}")
        ended = mpijob and any(c["type"] in ("Succeeded", "Failed") and c["status"] == "True"
                               for c in mpijob.get("status", {}).get("conditions", []))
        return ([mpijob] if mpijob and not ended else []) + \
            [pod for pod in pods if pod["status"].get("phase") in ("Pending", "Running")]

    def cleanup(self):
        super().cleanup()
        for api_client in self.clients:
            api_client.close()


@pytest.fixture(scope="module")
def sshds(tmp_path_factory):
    """Two sshd on one free port, on 127.0.0.2 and 127.0.0.3, trusting one generated user key."""
    if not sshd.available():
        pytest.skip("needs Debian's openssh-server (/usr/sbin/sshd)")
    directory = tmp_path_factory.mktemp("contract-sshd")
    user_key = sshd.keygen(directory / "user_key")
    port = sshd.free_port_on(["127.0.0.2", "127.0.0.3"])
    servers = [sshd.Sshd(directory, address, port, f"{user_key}.pub").start() for address in ("127.0.0.2", "127.0.0.3")]
    yield {"port": port, "key": user_key}
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def fake_kube(tmp_path_factory):
    from tests.fakekube import FakeKube

    with FakeKube() as fake:
        path = fake.write_kubeconfig(tmp_path_factory.mktemp("contract-kube") / "kubeconfig",
                                     namespace=KubernetesBackend.NS)
        yield fake, path
        assert fake.errors == []


@pytest.fixture(params=["local", "ssh", "kubernetes"])
def backend(request, tmp_path):
    if request.param == "local":
        made = LocalBackend(tmp_path)
    elif request.param == "ssh":
        made = SSHBackend(tmp_path, request.getfixturevalue("sshds"))
    else:
        made = KubernetesBackend(*request.getfixturevalue("fake_kube"))
    yield made
    made.cleanup()


# --- reading a job ------------------------------------------------------------------------------

@dataclasses.dataclass
class Read:
    """What one or more follows gave: the output bytes, where the next follow starts, and the end."""
    data: bytes = b""
    offset: int = 0
    cursor: dict | None = None
    exited: Exited | None = None

    def __add__(self, later):
        assert later.data == b"" or self.exited is None, "output after Exited"
        return Read(self.data + later.data, later.offset, later.cursor, later.exited)


def follow(runner, spec, since=None, until=None, timeout=90):
    """Follow `spec` from where `since` stopped (from the start if None), until it exits or until(all
    output so far) is true; then break out of the loop (which closes the generator, as a follower
    that stops does)."""
    since = since or Read()
    read = Read(offset=since.offset, cursor=since.cursor)
    deadline = time.monotonic() + timeout
    for event in waited(runner.follow(spec, since.offset, cursor=since.cursor)):
        if isinstance(event, Output):
            assert event.offset == read.offset, "an Output that does not start where the last one ended"
            read.data += event.data
            read.offset += len(event.data)
            read.cursor = event.cursor
            if until is not None and until(since.data + read.data):
                break
        elif isinstance(event, Exited):
            read.exited = event
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"job {spec.job_id}: no end after {timeout} s; output so far: {read.data[-500:]!r}")
    return read


def rank_lines(data):
    """{rank: [text, ...]} of the ranks' stdout lines in a launcher's output. The launcher's own
    lines are left out, and so is stderr: an instance's login shell may write there (pyenv's rc
    files racing to rehash), and SCRIPT prints only to stdout."""
    splitter = OutputSplitter()
    lines = splitter.feed(data) + splitter.finish()
    found = {}
    for line in lines:
        if line.rank is not None and line.stream == "stdout":
            found.setdefault(line.rank, []).append(line.text)
    return found


def printed(*texts):
    """until= for follow(): every rank printed each of `texts` (e.g. "line=0")."""
    return lambda data: all(f"rank={rank} {text}\n".encode() in data for rank in range(NP) for text in texts)


# --- the contract -------------------------------------------------------------------------------

def test_launch_is_idempotent_from_one_runner_or_another(backend):
    plan = Plan(lines=3, hold=True)
    spec = backend.spec(plan)
    first, second = backend.runner(), backend.runner()
    results, barrier = [], threading.Barrier(2)

    def launch(runner):
        barrier.wait()
        results.append(backend.launch(runner, spec))

    threads = [threading.Thread(target=launch, args=(runner,)) for runner in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(results) == 2, "a launch raised (see the thread's traceback above)"
    start = follow(first, spec, until=printed("line=0"))     # the job is up, held
    results.append(backend.launch(first, spec))              # a retried task, while the job runs
    backend.release(spec)
    read = start + follow(second, spec, start)

    assert sorted(started.already_running for started in results) == [False, True, True], results
    assert read.exited is not None and read.exited.code == 0, read.exited
    assert rank_lines(read.data) == plan.expected()           # each line once: one job ran, not two
    wait_for(lambda: not backend.running(spec), timeout=30, message="nothing of the job to run")
    assert rank_lines(follow(first, spec).data) == plan.expected()   # nor did a second one start late
    if backend.name == "kubernetes":
        assert [j["metadata"]["name"] for j in backend.fake.mpijobs(backend.NS)].count(spec.name) == 1
        assert len(backend.fake.launcher_pods(backend.NS, spec.name)) == 1


def test_follow_resumes_from_an_offset_losing_and_repeating_nothing(backend):
    plan = Plan(lines=12, interval=0.05, hold=True)
    spec = backend.spec(plan)
    backend.launch(backend.runner(), spec)

    # Three follows, each a new runner object, each cut short by breaking out of the loop.
    read = follow(backend.runner(), spec, until=printed("line=0"))        # the ranks hold after line 0
    assert read.exited is None and read.offset == len(read.data) > 0
    backend.release(spec)
    read += follow(backend.runner(), spec, read, until=printed("line=4"))
    assert read.exited is None, "the job ended before the second follow was cut: nothing left to resume"
    read += follow(backend.runner(), spec, read)
    whole = follow(backend.runner(), spec)                                # one uninterrupted read

    assert read.exited is not None and read.exited.code == 0, read.exited
    assert whole.exited is not None and whole.exited.code == 0, whole.exited
    assert rank_lines(read.data) == plan.expected()                       # every line once, in order
    assert read.data == whole.data                                        # and every other byte


def test_cancel_stops_its_own_job_and_leaves_the_other_running(backend):
    plan = Plan(lines=3, hold=True)
    mine, other = backend.spec(plan), backend.spec(plan)
    runner = backend.runner()
    backend.launch(runner, mine)
    backend.launch(runner, other)
    mine_read = follow(runner, mine, until=printed("line=0"))
    other_read = follow(runner, other, until=printed("line=0"))
    assert backend.running(mine) and backend.running(other)

    backend.runner().cancel(mine)

    assert backend.running(mine) == []
    ended = follow(runner, mine, mine_read, timeout=60)
    assert ended.exited is not None and ended.exited.code != 0, ended.exited
    assert backend.running(other), "cancel stopped another job"
    backend.release(other)
    other_read += follow(runner, other, other_read)
    assert other_read.exited is not None and other_read.exited.code == 0, other_read.exited
    assert rank_lines(other_read.data) == plan.expected()


def test_a_failing_rank_fails_the_job_with_a_nonzero_code(backend):
    plan = Plan(lines=2, fail_rank=1)
    spec = backend.spec(plan)
    runner = backend.runner()
    backend.launch(runner, spec)

    read = follow(runner, spec)

    assert read.exited is not None and read.exited.code not in (0, None), read.exited
    assert rank_lines(read.data)[1] == plan.expected()[1]


def test_two_portals_job_of_the_same_number_never_meet(backend):
    """Two installations (staging beside production, or one portal after its database was reset)
    reach the same machine, instances or namespace, and each runs its job with the same number:
    each follows only its own output, and cancelling one leaves the other running."""
    job_id = next(_job_ids)
    ours, theirs = Plan(lines=3, hold=True), Plan(lines=2, hold=True)
    mine, other = backend.spec(ours, job_id, "aaaa1111"), backend.spec(theirs, job_id, "bbbb2222")
    assert mine.name != other.name
    runner = backend.runner()
    assert not backend.launch(runner, mine).already_running
    assert not backend.launch(runner, other).already_running, "the second portal adopted the first one's job"
    mine_read = follow(runner, mine, until=printed("line=0"))
    follow(runner, other, until=printed("line=0"))

    backend.runner().cancel(other)

    assert backend.running(other) == []
    assert backend.running(mine), "cancelling the other portal's job stopped this one"
    backend.release(mine)
    mine_read += follow(runner, mine, mine_read)
    assert mine_read.exited is not None and mine_read.exited.code == 0, mine_read.exited
    assert rank_lines(mine_read.data) == ours.expected()


def test_an_mpijob_of_another_portal_under_the_same_name_is_refused_not_adopted(fake_kube, tmp_path):
    """Adoption (after a create that failed but stored) checks the labels, not only the name."""
    from runners import mpijob
    from runners.kubernetes import KubernetesError

    backend = KubernetesBackend(*fake_kube)
    try:
        spec = backend.spec(Plan(lines=1), installation="aaaa1111")
        runner = backend.runner()
        foreign = dataclasses.replace(spec, installation="bbbb2222")
        document = mpijob.new_mpijob(foreign, runner.cluster)
        document["metadata"]["name"] = spec.name            # the other portal's MPIJob, under our name
        runner.custom.create_namespaced_custom_object(mpijob.GROUP, mpijob.VERSION, backend.NS, mpijob.PLURAL,
                                                      document)
        with pytest.raises(KubernetesError, match="not created by this portal"):
            runner.launch(spec)
        labels = backend.fake.mpijob(backend.NS, spec.name)["metadata"]["labels"]
        assert labels[mpijob.INSTALLATION_LABEL] == "bbbb2222"       # left as it was
    finally:
        backend.cleanup()


ARGV_SCRIPT = 'import json, sys\nprint("argv=" + json.dumps(sys.argv[1:]), flush=True)\n'


def horovodrun_option_words():
    """Every option horovodrun's own --help lists, whole and abbreviated (argparse accepts any
    unambiguous prefix), and the words it would take as the end of its options or as help."""
    import re
    import subprocess

    listed = subprocess.run([str(Path(sys.executable).parent / "horovodrun"), "--help"], capture_output=True,
                            text=True, timeout=60).stdout
    options = sorted(set(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", listed)))
    assert len(options) > 40 and "--network-interface" in options, listed[:500]
    prefixes = {option[:n] for option in options if option.startswith("--") for n in range(3, len(option))}
    return [*options, *sorted(prefixes), "--", "-", "-h", "$(id)", "a b", "", "--network", "resnet50"]


@pytest.mark.parametrize("backend", ["local", "ssh"], indirect=True)
def test_the_scripts_words_reach_it_as_given_and_never_horovodrun(backend):
    """horovodrun reads words it is given as abbreviations of its own options (`--network
    resnet50` would fail the job with its "ambiguous option"). Every such word of the script
    reaches every rank as given."""
    words = horovodrun_option_words()
    spec = dataclasses.replace(backend.spec(Plan()), script_name="argv.py", script_content=ARGV_SCRIPT,
                               args=tuple(words))
    runner = backend.runner()
    backend.launch(runner, spec)

    read = follow(runner, spec)

    assert read.exited is not None and read.exited.code == 0, (read.exited, read.data[-2000:])
    import json

    said = {rank: [json.loads(text[len("argv="):]) for text in texts if text.startswith("argv=")]
            for rank, texts in rank_lines(read.data).items()}
    assert said == {rank: [words] for rank in range(NP)}
