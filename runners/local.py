"""The embedded default: `horovodrun --gloo` on this machine.

Each job gets a directory <jobs_dir>/<spec.name>/ (rm-<installation>-<id>) holding the script, `output.log` (launcher
stdout and stderr together, each line tagged with its rank by horovodrun), `pid`, and `exit_code`,
written when horovodrun ends. horovodrun runs detached in its own session, so a Celery worker
that dies or restarts does not take the training down; the next follower re-attaches by offset.

Where bubblewrap is installed, a job runs in a sandbox (runners.sandbox) that hides the portal's
processes, data folder and secrets from it.

A follower reads `output.log` as it grows and sleeps on inotify between writes (WriteWatch): a
line reaches it as soon as a rank prints it, and an idle job costs no 20 ms polling. The
launcher's end wakes it too (a pidfd, LauncherWatch), so a quiet job is not looked at in between.

A project with extra packages (runners.packages) has them installed before its ranks start, by
the supervisor (its --install step: a sandbox of its own on the site's install network, as the
job's user) into an environment shared by every job with the same image and requirements, in
`envs_dir`; the job's python is that environment's. The follower reports the install's progress
(Status), and a failed install as the job's end, with the installer's last lines. The job holds
its GPUs while it installs (only a first job with new requirements installs anything).

Every process of a job carries RINGMASTER_JOB_DIR (its folder) in its environment. cancel() uses
it to find and kill all of them, including ranks that horovodrun moved into process groups of
their own, and never another portal's job of the same number.
"""
import fcntl
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import psutil
from inotify_simple import INotify
from inotify_simple import flags as inotify_flags

from . import artifacts, gpus, launchers, limits, packages, projects, telemetry
from .base import (DISCOVERY_SCRIPT, DISCOVERY_SCRIPT_TEXT, GPU_MAP_FILE, HOST_NAME_VAR, HOSTS_FILE,
                   JOB_DIR_VAR, JOB_ID_VAR, Exited, Output, Runner, Started, Status, Waiting)
from .sandbox import job_uid

# What a job's python may import from Ringmaster (ringmaster_metrics), and nothing else.
JOB_PYTHON = Path(__file__).resolve().parent / "job_python"
READ_CHUNK = 1 << 20
# A follower of a job that prints nothing wakes this often (Waiting: cancel, time limit, resize;
# and is horovodrun still alive?) where the kernel cannot tell it that the launcher ended (no
# pidfd): what a launcher killed without an exit code costs to notice.
IDLE_WAKE_SECONDS = 0.25
# With a pidfd the end wakes the follower itself: its Waiting asks for no wake of the runner's
# own (the follower still looks at its heartbeat's news every few seconds, jobs.domain.follow).
QUIET_WAIT_SECONDS = 60.0
# The parent of every job here, outside its sandbox (its network, its exit code).
SUPERVISOR = Path(__file__).resolve().parent / "supervisor.py"
# The folder, in the jobs folder, of what the portal keeps of each job (LocalRunner.control_dir).
CONTROL = ".portal"
# The job's first process as the job (runners/job_python/ringmaster_start.py), and the file in
# the job's folder it reads the job's environment from.
START = JOB_PYTHON / "ringmaster_start.py"
ENV_FILE = ".ringmaster-env.json"
# The PATH of the portal's own processes of a job (LocalRunner.portal_environment).
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# In the control folder: the supervisor's install step (its plan), and how it goes (its status).
INSTALL_PLAN, INSTALL_STATUS = "install-plan.json", "install-status.json"
# In the control folder: the attempt of the job (JobSpec.attempt) that its pid and exit code are of.
ATTEMPT_FILE = "attempt"


class LocalRunner(Runner):
    name = "local"
    HOSTS = "localhost:{}"

    def __init__(self, jobs_dir, poll_interval=0.02, start_timeout=60, kill_grace=10, nvidia_smi="nvidia-smi",
                 sandbox=None, idle_wake=IDLE_WAKE_SECONDS, envs_dir=None, install_network=None, pip_index_url=""):
        self.jobs_dir = Path(jobs_dir)
        # Extra packages: the environments' folder (hidden from jobs by the sandbox's `hide`),
        # the network of the installs' sandbox (runners.sandbox.NETWORKS; None: the jobs'), and
        # the index pip asks ("": pip's own configuration).
        self.envs_dir = Path(envs_dir) if envs_dir is not None else self.jobs_dir.parent / "envs"
        self.install_network = install_network
        self.pip_index_url = pip_index_url
        self.idle_wake = idle_wake
        self.nvidia_smi = nvidia_smi
        self.sandbox = sandbox                 # runners.sandbox.Sandbox, or None: no isolation
        self.poll_interval = poll_interval
        self.start_timeout = start_timeout
        self.kill_grace = kill_grace

    def job_dir(self, spec):
        """The job's own folder: its working directory and home, owned by its user."""
        return self.jobs_dir / spec.name

    def output_dir(self, spec):
        """Where the job's ranks write their artifacts (RINGMASTER_OUTPUT_DIR): inside its folder,
        the one place its sandbox lets it write."""
        return self.output_dir_named(spec.name)

    def output_dir_named(self, name):
        """The output folder of the job named `name` (JobSpec.name)."""
        return self.jobs_dir / name / artifacts.OUTPUT_DIR

    def control_dir(self, spec):
        """What the portal keeps of a job and trusts (its output, launcher pid, exit code, launch
        lock): outside the job's folder, in a folder only the portal's user may open, so the job
        can neither write it nor point the portal at another file from it."""
        return self.jobs_dir / CONTROL / spec.name

    def runs_jobs_as_their_own_users(self):
        """Whether each job runs as a uid of its own (runners.sandbox.job_uid): in the sandbox,
        where the portal may switch users (root)."""
        return self.sandbox is not None and os.geteuid() == 0

    def command(self, spec):
        """The job's launcher's argv (one process per GPU slot on this machine), and the files
        it needs in the job's folder."""
        return launchers.of(spec.launcher).single_host_argv(spec, self.start_timeout)

    def portal_environment(self, spec):
        """The environment of the portal's own processes of a job (the supervisor; bubblewrap,
        setpriv, pasta, nsenter and ip under it; ringmaster_start until it becomes the job),
        which run as root where jobs run as users of their own: fixed, with none of the
        variables the job's user set. It names the job's folder, by which cancel finds them."""
        return {"PATH": SYSTEM_PATH, "LANG": "C.UTF-8", JOB_DIR_VAR: str(self.job_dir(spec).resolve())}

    def _base_path(self, spec):
        """The job's PATH before the user's: its interpreter's folder, then the system's."""
        bindir = str(Path(spec.python).parent) if os.sep in spec.python else ""
        return os.pathsep.join(p for p in (bindir, "/usr/local/bin", "/usr/bin", "/bin") if p)

    def environment(self, spec):
        """The job's environment, which only the job's own processes get (ringmaster_start):
        clean of the portal's own secrets (database URL, keys), with the user's variables."""
        env = {
            "PATH": self._base_path(spec),
            # In the sandbox only the job's folder is writable: it is the job's home there.
            "HOME": str(self.job_dir(spec).resolve()) if self.sandbox else os.environ.get("HOME", "/tmp"),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
        }
        env.update(spec.env)
        # ringmaster_metrics first; a PYTHONPATH the user set comes after it.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(JOB_PYTHON), spec.env.get("PYTHONPATH")) if p)
        env.update(spec.gpu_env(["localhost"]))
        env.update(launchers.of(spec.launcher).environment(spec))
        env[HOST_NAME_VAR] = "localhost"
        env[JOB_ID_VAR] = str(spec.job_id)
        env[JOB_DIR_VAR] = str(self.job_dir(spec).resolve())
        env[artifacts.OUTPUT_DIR_VAR] = str(self.output_dir(spec).resolve())
        if spec.project is not None:
            env[projects.PROJECT_DIR_VAR] = str((self.job_dir(spec) / projects.PROJECT_DIR).resolve())
        if spec.checkpoint is not None:
            env[artifacts.CHECKPOINT_VAR] = str(self._checkpoint_path(spec).resolve())
        return env

    def _checkpoint_path(self, spec):
        return self.job_dir(spec) / artifacts.CHECKPOINT_DIR / spec.checkpoint_file

    def _needs(self, spec):
        """What a job reads besides the machine's system folders: the installation of its
        interpreter (a virtual environment: bin/python's parent folder, and where that links to)
        and Ringmaster's job_python."""
        found = self._interpreter(spec)
        if found is None:
            return (str(JOB_PYTHON),)
        linked, real = Path(os.path.abspath(found)), Path(found).resolve()
        return tuple(dict.fromkeys([str(linked.parent.parent), str(real.parent.parent), str(JOB_PYTHON)]))

    def _interpreter(self, spec):
        """The job's interpreter, found on its PATH before the user's (None: not there)."""
        return shutil.which(spec.python, path=self._base_path(spec))

    def _start(self, spec, directory):
        """ringmaster_start's argv, up to the launcher's: the job's interpreter runs it, isolated
        (-I) and without site-packages (-S), with the job's environment in the job's folder."""
        python = self._interpreter(spec) or sys.executable
        return [python, "-I", "-S", str(START), str((directory / ENV_FILE).resolve()), str(directory.resolve()), "--"]

    @contextmanager
    def _launch_lock(self, control):
        with open(control / "launch.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def _prepare(self, spec, directory, files, keep_output=False):
        """The job's folder as it starts: made anew (what a launch cut short left there is not
        trusted), with its script, the rank launcher's argv, the launcher's `files` and, for an
        elastic job, the host discovery. `keep_output`: a restart keeps what the job's earlier
        attempts wrote in its output folder (its artifacts and checkpoints)."""
        output = directory / artifacts.OUTPUT_DIR
        if keep_output and _real_folder(directory) and _real_folder(output):
            for entry in os.listdir(directory):
                if entry != artifacts.OUTPUT_DIR:
                    artifacts.remove_tree(directory / entry)
        else:
            artifacts.remove_tree(directory)
            directory.mkdir(mode=0o700)
            output.mkdir(mode=0o700)
        if spec.checkpoint is not None:
            (directory / artifacts.CHECKPOINT_DIR).mkdir(mode=0o700)
            try:
                artifacts.copy_into(spec.checkpoint[0], spec.checkpoint[1], self._checkpoint_path(spec))
            except FileNotFoundError:
                raise FileNotFoundError(f"the checkpoint {spec.checkpoint[1]} this job starts from is gone "
                                        f"(deleted since, or never kept)") from None
        if spec.script_content is not None:
            (directory / spec.script_name).write_text(spec.script_content)
        if spec.project is not None:
            projects.lay_out(spec.project, directory / projects.PROJECT_DIR)
        name, content = spec.argv_file()
        (directory / name).write_bytes(content)
        env_file = directory / ENV_FILE
        env_file.touch(mode=0o600)
        env_file.write_text(json.dumps(self.environment(spec)))
        for name, content in files.items():
            (directory / name).write_bytes(content)
        if spec.elastic:
            script = directory / DISCOVERY_SCRIPT
            script.write_text(DISCOVERY_SCRIPT_TEXT)
            script.chmod(0o755)
            self.resize(spec)

    def launch(self, spec):
        directory, control = self.job_dir(spec), self.control_dir(spec)
        control.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        control.mkdir(mode=0o700, exist_ok=True)
        with self._launch_lock(control):
            pid_file = control / "pid"
            program = launchers.of(spec.launcher).PROGRAM
            restart = pid_file.exists() and _attempt_of(control) < spec.attempt
            if restart:
                self._forget_attempt(spec, control)
            elif pid_file.exists():
                return Started(f"{program} already started (pid {pid_file.read_text().split()[0]})", True)
            image, env = spec, self._environment_of(spec)
            if env is not None:
                spec = replace(spec, python=env[1].python)
            argv, files = self.command(spec)
            self._prepare(spec, directory, files, keep_output=spec.attempt > 1)
            (control / ATTEMPT_FILE).write_text(f"{spec.attempt}\n")
            supervise = [sys.executable, "-I", str(SUPERVISOR), "--exit-code", str(control.resolve() / "exit_code")]
            with self._user(directory) as uid, open(control / "output.log", "ab") as output:
                supervise += limits.supervisor_options(spec, uid is not None, control.resolve() / limits.HIT_FILE)
                if env is not None:
                    supervise += ["--install", str(self._install_plan(image, *env, control, uid).resolve())]
                if self.sandbox:
                    supervise += [*self.sandbox.supervise(), "--",
                                  *self.sandbox.argv(directory, keep=self._needs(image), uid=uid,
                                                     later=(env[1].path,) if env else ())]
                else:
                    supervise.append("--")
                process = subprocess.Popen(
                    [*supervise, *self._start(image, directory), *argv],
                    cwd=directory, env=self.portal_environment(spec), stdin=subprocess.DEVNULL,
                    stdout=output, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                )
            tmp = control / "pid.tmp"
            tmp.write_text(f"{process.pid} {start_ticks(process.pid)}\n")
            tmp.rename(pid_file)
            # Reap it when it ends, so no zombie lingers while this worker lives.
            threading.Thread(target=process.wait, daemon=True).start()
            elastic = f", elastic: {spec.min_gpus} to {spec.max_gpus}" if spec.elastic else ""
            return Started(f"{program} started on this machine with {spec.gpus} processes{elastic} (pid {process.pid})")

    def _forget_attempt(self, spec, control):
        """Make way for the job's next attempt: no process of the one before is left (its sandbox
        ends them with it; a job run without one may leave some), nor what the portal kept of it:
        how it ended, and its output (stored by the job's follower before the attempt ended; the
        next attempt's follower reads its own output from offset 0)."""
        self._end_processes(spec)
        for name in ("exit_code", "exit_code.tmp", limits.HIT_FILE, INSTALL_PLAN, INSTALL_STATUS, "output.log", "pid"):
            (control / name).unlink(missing_ok=True)

    def _environment_of(self, spec):
        """(Requirements, packages.Environment) of a project with extra packages; None without."""
        if spec.project is None:
            return None
        wanted = (packages.REQUIREMENTS_FILE, packages.PYPROJECT_FILE)
        reqs = packages.requirements({file.path: file.content for file in projects.unpack(spec.project)
                                      if file.path in wanted})
        if reqs is None:
            return None
        if not spec.extra_packages:
            raise packages.BadRequirements(f"the image takes no extra packages, and the project's {reqs.source} "
                                           f"names {reqs.packages}")
        python = self._interpreter(spec)
        if python is None:
            raise FileNotFoundError(f"the image's interpreter {spec.python} is not on this machine")
        return reqs, packages.environment(self.envs_dir.resolve(), os.path.abspath(python), reqs, self.pip_index_url)

    def _install_plan(self, image, reqs, env, control, uid):
        """The supervisor's install step for `env` (runners.supervisor.install), written in the
        control folder: the installer's sandbox (the site's install network; the environment's
        folder its only writable place) and where it reports."""
        self.envs_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        requirements_file = "ringmaster-requirements.txt"
        python = self._interpreter(image)
        command = [python, "-I", str(packages.INSTALLER), env.path, os.path.join(env.path, requirements_file),
                   self.pip_index_url]
        plan = {"env": env.path, "complete": env.complete, "lock": env.lock,
                "status": str((control / INSTALL_STATUS).resolve()), "owner": uid, "describe": reqs.describe(),
                "requirements": reqs.text(), "requirements_file": requirements_file, "argv": command}
        if self.sandbox:
            sandbox = replace(self.sandbox, network=self.install_network or self.sandbox.network)
            outbound = sandbox.supervise()
            plan["argv"] = [*sandbox.argv(env.path, keep=self._needs(image), uid=uid), *command]
            if outbound:
                plan.update(outbound=sandbox.pasta, tools={"nsenter": sandbox.nsenter, "ip": sandbox.ip})
        path = control / INSTALL_PLAN
        path.write_text(json.dumps(plan))
        return path

    @contextmanager
    def _user(self, directory):
        """The uid the job runs as (None: the portal's own), with the job's folder handed to it;
        held until the job's first process is started (runners.sandbox.job_uid)."""
        if not self.runs_jobs_as_their_own_users():
            yield None
            return
        with job_uid(str(directory.resolve())) as uid:
            for path in [directory, *directory.rglob("*")]:
                os.lchown(path, uid, uid)
            yield uid

    def resize(self, spec):
        directory = self.job_dir(spec)
        _replace(directory / HOSTS_FILE, self.HOSTS.format(spec.gpus) + "\n")
        if spec.bound:
            _replace(directory / GPU_MAP_FILE, spec.gpu_map(["localhost"]) + "\n")

    def _exit_code(self, directory):
        try:
            return int((directory / "exit_code").read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def follow(self, spec, offset, cursor=None):
        directory = self.control_dir(spec)
        log_path = directory / "output.log"
        while not log_path.exists():
            if not (directory / "pid").exists():
                yield Exited(None, "the job was never started on this machine")
                return
            yield Waiting(seconds=self.poll_interval)
        install = InstallWatch(directory)
        with open(log_path, "rb") as log, WriteWatch(directory, self.poll_interval) as watch, \
                LauncherWatch(directory) as launcher:
            log.seek(offset)
            while True:
                news = install.news()
                if news is not None:
                    yield news
                data = log.read(READ_CHUNK)
                if data:
                    yield Output(data, offset)
                    offset += len(data)
                    continue
                code = self._exit_code(directory)
                if code is None and launcher.alive():
                    # Where its end wakes the wait, nothing is left to look at until then.
                    yield watch.waiting(QUIET_WAIT_SECONDS if watch.wakes_on(launcher.fd) else self.idle_wake)
                    watch.drain()
                    continue
                # Ended: the exit code is written after the last output, so one more read drains.
                code = self._exit_code(directory)
                rest = log.read()
                if rest:
                    yield Output(rest, offset)
                    offset += len(rest)
                    continue
                program = launchers.of(spec.launcher).PROGRAM
                failed = install.failure()
                if failed is not None:
                    yield Exited(code, *failed)
                elif code is None:
                    yield Exited(None, f"{program} stopped without reporting an exit code")
                else:
                    hit, rlimits = limits.reported(directory / limits.HIT_FILE)
                    yield Exited(code, f"{program} exited with code {code}", cause=hit, rlimits=rlimits)
                return

    def _marker(self, spec):
        return str(self.job_dir(spec).resolve())

    def _processes(self, spec):
        """Every live process of this job: everything with the marker."""
        marker = self._marker(spec)
        return [process for process in psutil.process_iter(["pid", "status"])
                if process.info["status"] != psutil.STATUS_ZOMBIE and process.pid != os.getpid()
                and _marked(process, marker)]

    def system_probe(self, spec):
        return LocalProbe(self, spec)

    def _signal_all(self, processes, sig):
        for process in processes:
            try:
                process.send_signal(sig)
            except psutil.NoSuchProcess:
                pass

    def cancel(self, spec):
        directory = self.control_dir(spec)
        try:
            pgid = int((directory / "pid").read_text().split()[0])
            os.killpg(pgid, signal.SIGTERM)
        except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
            pass
        self._end_processes(spec)

    def _end_processes(self, spec):
        """SIGTERM every process of the job, SIGKILL those left after the grace period; return
        once none is left."""
        processes = self._processes(spec)
        self._signal_all(processes, signal.SIGTERM)
        _, alive = psutil.wait_procs(processes, timeout=self.kill_grace)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            alive = self._processes(spec)
            if not alive:
                return
            self._signal_all(alive, signal.SIGKILL)
            psutil.wait_procs(alive, timeout=1)
        raise RuntimeError(f"job {spec.job_id}: processes survived SIGKILL: {[p.pid for p in alive]}")


def _attempt_of(control):
    """The attempt of the job that its control folder's files are of (1 where none is written)."""
    try:
        return int((control / ATTEMPT_FILE).read_text().strip())
    except (FileNotFoundError, ValueError):
        return 1


def _real_folder(path):
    """Whether `path` is a folder itself, not a link to one (the job may have put either there)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


class InstallWatch:
    """How the supervisor's install of a job's extra packages goes (its status file in the
    control folder): news() is a Status for each new state, None without news; failure() the
    (detail, cause) of an install that failed, with the installer's last lines."""

    def __init__(self, directory):
        self.path, self.shown, self.done = directory / INSTALL_STATUS, None, False
        try:
            self.describe = json.loads((directory / INSTALL_PLAN).read_text())["describe"]
        except (FileNotFoundError, ValueError, KeyError):
            self.done = True                    # no install for this job
        self.last = {}

    def _read(self):
        try:
            self.last = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            pass
        return self.last.get("state")

    def news(self):
        if self.done:
            return None
        state = self._read()
        if state in ("cached", "installed", "failed"):
            self.done = True
        if state is None or state == self.shown or state == "failed":
            return None
        self.shown = state
        return Status(packages.status_message(state, self.describe))

    def failure(self):
        if self._read() != "failed":
            return None
        return packages.status_message("failed", self.describe), " / ".join(self.last.get("lines", []))


class WriteWatch:
    """What to wait on until a file in a job's folder is written or renamed into it (output.log
    grows, the exit code appears), or a timeout passes: inotify on the folder, set up before the
    first read so no write between a read and the wait is missed (its descriptor stays readable
    until drained), and the launcher's end where wakes_on() is given its pidfd (the two under
    one epoll descriptor, as a follow waits on one). Where inotify cannot be had (the user's
    max_user_instances used up), waits `fallback` seconds at a time: it polls."""

    MASK = inotify_flags.MODIFY | inotify_flags.MOVED_TO | inotify_flags.CLOSE_WRITE

    def __init__(self, directory, fallback):
        self.fallback = fallback
        self.epoll, self.also = None, set()
        try:
            self.inotify = INotify()
        except OSError:
            self.inotify = None
            return
        try:
            self.inotify.add_watch(str(directory), self.MASK)
        except OSError:
            self.close()

    def wakes_on(self, fd):
        """Whether a wait also ends once `fd` is readable (None: no descriptor to add)."""
        if fd is None or self.inotify is None:
            return False
        if fd not in self.also:
            if self.epoll is None:
                self.epoll = select.epoll()
                self.epoll.register(self.inotify.fileno(), select.EPOLLIN)
            self.epoll.register(fd, select.EPOLLIN)
            self.also.add(fd)
        return True

    def waiting(self, timeout):
        """The Waiting of a follow until the folder is written (or a descriptor given to
        wakes_on is readable), or `timeout` passes."""
        if self.inotify is None:
            return Waiting(seconds=min(self.fallback, timeout))
        return Waiting(seconds=timeout, fd=(self.epoll or self.inotify).fileno())

    def drain(self):
        """Forget the writes seen so far (read after this: a later write wakes the next wait)."""
        if self.inotify is not None:
            self.inotify.read(timeout=0)

    def close(self):
        if self.epoll is not None:
            self.epoll.close()
            self.epoll = None
        if self.inotify is not None:
            self.inotify.close()
            self.inotify = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def start_ticks(pid):
    """When process `pid` started, in clock ticks since boot (field 22 of /proc/PID/stat, proc(5)):
    with its pid, what tells it from a later process given the same pid. Not the wall-clock start
    time, which moves whenever the clock is stepped (psutil adds the boot time that /proc/stat
    gives at each call): a launcher would look gone. ProcessLookupError if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
    except FileNotFoundError:
        raise ProcessLookupError(pid) from None
    return int(fields[19])       # the fields after the name start at the third, state


class LauncherWatch:
    """Whether the job's launcher (its `pid` file: pid and start time) still runs, and once it
    is known to, a pidfd of it (`fd`): readable when it ends, so that a follower of a quiet job
    is woken by the end itself instead of looking every IDLE_WAKE_SECONDS. Without pidfds (Linux
    before 5.3, a seccomp filter that refuses pidfd_open) it reads the pid file and /proc each
    time it is asked."""

    def __init__(self, directory):
        self.directory = directory
        self.fd = None

    def alive(self):
        if self.fd is not None:
            poll = select.poll()
            poll.register(self.fd, select.POLLIN)
            return not poll.poll(0)                 # readable: it has ended
        try:
            pid, started = (self.directory / "pid").read_text().split()
            process = psutil.Process(int(pid))
            if start_ticks(process.pid) != int(started) or process.status() == psutil.STATUS_ZOMBIE:
                return False
        except (FileNotFoundError, ProcessLookupError, ValueError, psutil.NoSuchProcess):
            return False
        try:
            fd = os.pidfd_open(process.pid)
        except OSError:
            return True
        # Its pid may have been taken by another process between the look above and the open:
        # the descriptor is the launcher's only if the process there still started when it did.
        if process.is_running():
            self.fd = fd
        else:
            os.close(fd)
        return True

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _replace(path, text):
    """Write a file a running job reads whole, atomically (it sees the old text or the new), in
    the job's folder, as the folder's owner has it: a new file (never one the job put there, nor
    where a link of its points), given to the folder's owner, renamed over the old."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as out:
        owner = os.stat(path.parent)
        if (owner.st_uid, owner.st_gid) != (os.geteuid(), os.getegid()):
            os.fchown(out.fileno(), owner.st_uid, owner.st_gid)
        out.write(text)
    tmp.rename(path)


def _marked(process, marker):
    """Whether `process` is one of the job's: its environment names the job's folder. None while
    that cannot be told yet: a process in the middle of exec shows an empty environment (its
    parent's fork went on once the exec began; the new one is in place a moment later)."""
    try:
        environment = process.environ()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return environment.get(JOB_DIR_VAR) == marker if environment else None


class MarkedProcesses:
    """A job's processes, looked for again and again (its telemetry, every few seconds): each
    process's environment is read once it shows one, not at every look. Reading every
    environment of the machine at each look would be most of what a follower costs while its job
    trains quietly (BENCHMARKS.md, training). Called: the job's processes now, zombies and the ended
    among them included (the caller skips those). A pid is forgotten once it is gone from /proc; for it to
    name another process at the next look, the kernel would have to hand out every pid between."""

    def __init__(self, marker):
        self.marker = marker
        self.seen = {}                  # pid -> its psutil.Process if it is the job's, else None

    def __call__(self):
        seen, me = {}, os.getpid()
        for pid in psutil.pids():
            if pid in self.seen:
                seen[pid] = self.seen[pid]
            elif pid != me:
                try:
                    process = psutil.Process(pid)
                except psutil.NoSuchProcess:
                    continue
                marked = _marked(process, self.marker)
                if marked is not None:          # else looked at again next time
                    seen[pid] = process if marked else None
        self.seen = seen
        return [process for process in seen.values() if process is not None]


class LocalProbe:
    """This machine as a job sees it: its GPUs (nvidia-smi, only the job's indices), or the CPU
    and memory of its processes (psutil) when it owns no GPUs."""

    HOST = "localhost"

    def __init__(self, runner, spec):
        self.runner, self.spec = runner, spec
        self.rate = telemetry.CpuRate()
        self.processes = MarkedProcesses(runner._marker(spec))

    def sample(self):
        if self.spec.bound:
            out = gpus.run_local(gpus.sample_argv(self.spec.gpu_binding[0], self.runner.nvidia_smi))
            if out is None:
                raise gpus.GpuQueryError(f"{self.runner.nvidia_smi} is gone")
            return telemetry.gpu_samples(self.HOST, gpus.parse_samples(out))
        cpu_seconds, rss = 0.0, 0
        for process in self.processes():
            try:
                with process.oneshot():
                    if process.status() == psutil.STATUS_ZOMBIE:
                        continue
                    times = process.cpu_times()
                    cpu_seconds += times.user + times.system
                    rss += process.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        total = psutil.virtual_memory().total
        return [telemetry.Sample(self.HOST, "cpu", self.rate.percent(self.HOST, cpu_seconds), rss / 2**20,
                                 total / 2**20)]

    def close(self):
        pass
