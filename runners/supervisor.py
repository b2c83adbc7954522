"""The parent of a job on this machine: it starts the job's sandbox, gives the sandbox's network
namespace its way out where the site allows one, and records the job's exit code where the job
cannot write.

Run by runners.local as `python -I supervisor.py --exit-code FILE [--outbound PASTA --nsenter
NSENTER --ip IP] -- ARGV`, outside the sandbox, as the portal's user (root where jobs run as
users of their own), with the job's output as stdout and the fixed environment of the portal's
own processes (runners.local.portal_environment: none of the variables the job's user set, but
the job's folder, by which cancel finds it). Every tool it runs is named by its absolute path.
It imports nothing but the standard library and prints only why a step of its own failed.

- ARGV is bubblewrap's command line for the job (runners.sandbox). With --outbound, bubblewrap
  is asked for the pid of the sandbox (--info-fd) and to hold the job (--block-fd) until the
  namespace is connected: pasta (Debian's `passt`) attaches a tap device there and NATs its
  traffic through this machine's sockets, with no port forwarded in either direction and the
  gateway not mapped to this machine's loopback. Every address of this machine, and the
  clouds' instance-metadata addresses, are then given a `prohibit` route inside the namespace,
  so a job reaches none of its services by any of them, nor the machine's cloud credentials
  (the job has no capability to change the routes).
- pasta outlives the namespace it serves: it is this process's child and ends with the job.
- The exit code is written as `FILE.tmp`, then renamed to FILE.
- With --max-processes or --memory-mib, the job's limits (Limits): where this process may make a
  cgroup (root, a pids or memory controller mounted: cgroup v2 where the controller is enabled
  there, else v1), the sandbox starts in a cgroup of its own under this process's (on cgroup v2,
  where this one holds processes, under JOBS_CGROUP at the root), with pids.max or the memory
  limit (swap included where the kernel counts it); else the kernel's rlimits:
  RLIMIT_NPROC (per uid: only with --own-uid, a job whose uid is its own) and RLIMIT_DATA (per
  process). Once the job has failed, --hit FILE says for runners.limits what it hit (the cgroup's
  pids.events "max", or its OOM kills), a line "processes N" or "memory MIB" each, and which
  limits rlimits held, "rlimit processes N" or "rlimit memory MIB" (the job's lines tell whether
  it ran into them).
- With `--install PLAN` (a JSON file in the control folder, runners.local), the project's extra
  packages are installed first (install). Their environment (runners.packages.Environment) is
  shared by every job with the same image and requirements: under a lock of its own, one that is
  complete is used as it is ("cached"); else what is there (an install cut short) is removed, the
  folder made anew and handed to the job's user, and the plan's sandbox (PLAN's argv: bubblewrap
  on the site's install network, the folder its only writable place, running
  job_python/ringmaster_install.py as the job) installs into it. Once it succeeds the folder is
  given to the portal's user and made read-only, and only then marked complete, by a file
  beside it that no job can write. The step's progress goes to PLAN's status file (a JSON
  object: state, and the installer's last lines where it failed) for runners.local's follow,
  and the installer's output to the job's. A failed install ends the job with the installer's
  exit code before its sandbox starts.
"""
import argparse
import collections
import fcntl
import ipaddress
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

SETUP_SECONDS = 10
# Addresses where clouds answer a machine with its credentials (instance metadata: AWS, GCP,
# Azure, OpenStack; and AWS's IPv6 one): another way to the machine's secrets.
METADATA_ADDRESSES = (ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254"))


# The absolute paths of nsenter and ip (main sets them from the command line).
TOOLS = {"nsenter": "nsenter", "ip": "ip"}


def machine_addresses():
    """Every address of this machine's interfaces, less loopback (the namespace has its own)."""
    found = set()
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        names = []
    output = subprocess.run([TOOLS["ip"], "-o", "addr", "show"], capture_output=True, text=True).stdout
    for line in output.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[2] in ("inet", "inet6") and fields[1] in names:
            address = ipaddress.ip_interface(fields[3]).ip
            if not address.is_loopback:
                found.add(address)
    return sorted(found, key=lambda a: (a.version, a))


def read_child_pid(fd):
    """The pid of the sandbox's first process, from bubblewrap's --info-fd JSON."""
    data = b""
    with os.fdopen(fd, "rb") as info:
        while True:
            chunk = info.read1(4096)
            if not chunk:
                break
            data += chunk
            try:
                return json.loads(data)["child-pid"]
            except ValueError:
                continue
    raise RuntimeError("the sandbox ended before it started")


def in_namespace(pid, argv, **kwargs):
    """`ip ARGV` in the network namespace of `pid`."""
    return subprocess.run([TOOLS["nsenter"], f"--net=/proc/{pid}/ns/net", TOOLS["ip"], *argv], capture_output=True,
                          text=True, **kwargs)


def connect(pid, pasta):
    """Attach pasta to the namespace of `pid`, wait for its interface to be configured, and
    prohibit this machine's addresses there. Returns the pasta process. As root only
    (runners.sandbox.Sandbox.supervise): pasta opens /dev/net/tun, and the routes are set from
    outside the namespace."""
    # pasta opens the namespace once it has given up its capabilities: it gets a descriptor of
    # it, opened here.
    namespace = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    said = tempfile.TemporaryFile()
    try:
        process = subprocess.Popen(
            [pasta, "--foreground", "--quiet", "--config-net", "--runas", "0", "--no-map-gw",
             "-t", "none", "-u", "none", "-T", "none", "-U", "none", "--netns", f"/proc/self/fd/{namespace}"],
            pass_fds=(namespace,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=said)
    finally:
        os.close(namespace)
    deadline = time.monotonic() + SETUP_SECONDS
    while "default" not in in_namespace(pid, ["route", "show", "default"]).stdout:
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            said.seek(0)
            why = " ".join(line for line in said.read().decode(errors="replace").splitlines() if "syslog" not in line)
            raise RuntimeError(f"pasta could not connect the job's network namespace ({why.strip() or 'no reason given'})")
        time.sleep(0.005)
    said.close()
    batch = "".join(f"route add prohibit {address}{'/128' if address.version == 6 else '/32'}\n"
                    for address in [*machine_addresses(), *METADATA_ADDRESSES])
    if batch:
        done = in_namespace(pid, ["-force", "-batch", "-"], input=batch)
        if done.returncode != 0:
            process.kill()
            raise RuntimeError(f"could not keep the job away from this machine's addresses: {done.stderr.strip()}")
    return process


def cgroup_mounts():
    """(the cgroup2 mount point or None, {v1 controller: its mount point}), from mountinfo."""
    unified, v1 = None, {}
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:
            left, _, right = line.partition(" - ")
            where, (kind, _source, options) = left.split()[4], right.split()[:3]
            if kind == "cgroup2":
                unified = where
            elif kind == "cgroup":
                for option in options.split(","):
                    v1.setdefault(option, where)
    return unified, v1


def own_cgroups():
    """{controller: this process's cgroup path}; "" for its cgroup v2 one."""
    own = {}
    with open("/proc/self/cgroup") as groups:
        for line in groups:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                own[controller] = path
    return own


# Where cgroup v2 gives the jobs' cgroups a parent at its root (see Limits.make).
JOBS_CGROUP = "ringmaster-jobs"


def controllers(folder):
    """The cgroup v2 controllers a cgroup folder may enable for its children."""
    try:
        with open(os.path.join(folder, "cgroup.controllers")) as found:
            return set(found.read().split())
    except OSError:
        return set()


def delegate(parent, root, controller):
    """Enable `controller` for the children of the cgroup v2 folder `parent`, and on the way down to
    it from `root` (OSError where that is refused)."""
    path = os.path.relpath(parent, root)
    folders = [root] + [os.path.join(root, *path.split(os.sep)[:depth + 1])
                        for depth in range(len(path.split(os.sep))) if path != "."]
    for folder in folders:
        if controller not in controllers(folder):
            raise OSError(f"{controller} is not available in {folder}")
        with open(os.path.join(folder, "cgroup.subtree_control")) as enabled:
            if controller in enabled.read().split():
                continue
        write(os.path.join(folder, "cgroup.subtree_control"), f"+{controller}")


def read_counts(path):
    """{"key": count} of a flat keyed cgroup file (pids.events, memory.events, memory.oom_control)."""
    try:
        with open(path) as counts:
            return {key: int(value) for key, value in (line.split() for line in counts if len(line.split()) == 2)}
    except (OSError, ValueError):
        return {}


class Limits:
    """The job's pids and memory limits: a cgroup per controller where one can be made, else rlimits."""

    def __init__(self, name, max_processes=None, memory_mib=None, own_uid=False):
        self.name, self.own_uid = name, own_uid
        self.wanted = {"pids": max_processes, "memory": memory_mib}
        self.folders = {}                          # controller -> (the job's cgroup folder, "v1" or "v2")

    def make(self):
        """Make the job's cgroups (as many as this machine allows; the rest fall back to rlimits)."""
        if not any(self.wanted.values()):
            return
        try:
            unified, v1 = cgroup_mounts()
            own = own_cgroups()
        except OSError:
            return
        for controller, value in self.wanted.items():
            if not value:
                continue
            parents = []
            if unified is not None and controller in controllers(unified):
                # Under this process's own cgroup where it may enable the controller for its
                # children (cgroup v2 allows that only to a cgroup with no process of its own, or
                # the root), else under a cgroup of Ringmaster's jobs at the root.
                parents = [(os.path.join(unified, own.get("", "/").lstrip("/")), "v2"),
                           (os.path.join(unified, JOBS_CGROUP), "v2")]
            elif controller in v1:
                parents = [(os.path.join(v1[controller], own.get(controller, "/").lstrip("/")), "v1")]
            for parent, version in parents:
                folder = os.path.join(parent, f"ringmaster-{self.name}")
                try:
                    if version == "v2":
                        os.makedirs(parent, exist_ok=True)
                        delegate(parent, unified, controller)
                    if os.path.isdir(folder):
                        os.rmdir(folder)           # a launch cut short left it: its counts are not this one's
                    os.makedirs(folder)
                    self._limit(folder, controller, version, value)
                except OSError:
                    continue                       # not root, or not delegated: the next, else the rlimit
                self.folders[controller] = (folder, version)
                break

    @staticmethod
    def _limit(folder, controller, version, value):
        if controller == "pids":
            write(os.path.join(folder, "pids.max"), str(value))
            return
        size = str(value << 20)
        write(os.path.join(folder, "memory.max" if version == "v2" else "memory.limit_in_bytes"), size)
        # Swap counts too where the kernel accounts it (else a job would swap past its limit).
        try:
            if version == "v2":
                write(os.path.join(folder, "memory.swap.max"), "0")
            else:
                write(os.path.join(folder, "memory.memsw.limit_in_bytes"), size)
        except OSError:
            pass

    def enter(self):
        """In the sandbox's process before it starts (preexec_fn): into the job's cgroups, and the
        rlimits of what has none."""
        for folder, _ in dict.fromkeys(self.folders.values()):
            write(os.path.join(folder, "cgroup.procs"), str(os.getpid()))
        for kind, limit in self.rlimits():
            if kind == "processes":
                resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))
            else:
                resource.setrlimit(resource.RLIMIT_DATA, (limit << 20, limit << 20))

    def rlimits(self):
        """[(kind, limit)] held by rlimits (enter)."""
        processes, memory = self.wanted["pids"], self.wanted["memory"]
        return ([("processes", processes)] if processes and "pids" not in self.folders and self.own_uid else []) + \
            ([("memory", memory)] if memory and "memory" not in self.folders else [])

    def hit(self):
        """[(kind, limit)] the job ran into: the processes it could not fork, its OOM kills."""
        found = []
        if "pids" in self.folders and read_counts(os.path.join(self.folders["pids"][0], "pids.events")).get("max"):
            found.append(("processes", self.wanted["pids"]))
        if "memory" in self.folders:
            folder, version = self.folders["memory"]
            events = "memory.events" if version == "v2" else "memory.oom_control"
            if read_counts(os.path.join(folder, events)).get("oom_kill"):
                found.append(("memory", self.wanted["memory"]))
        return found

    def remove(self):
        """Remove the job's cgroups once its last process is gone (the sandbox's PID namespace
        ends with its first process; the kernel lets a cgroup go a moment after its last task)."""
        deadline = time.monotonic() + SETUP_SECONDS
        for folder, _ in dict.fromkeys(self.folders.values()):
            while True:
                try:
                    os.rmdir(folder)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.02)


def write(path, text):
    with open(path, "w") as out:
        out.write(text)


def run(argv, pasta=None, limits=None, stdout=None):
    """Run bubblewrap's `argv`; with `pasta`, connected to the outside first; within `limits`
    (Limits). Its exit code. `stdout`: a descriptor for its output (and errors) instead of this
    process's."""
    enter = limits.enter if limits is not None else None
    streams = {} if stdout is None else {"stdout": stdout, "stderr": stdout}
    if pasta is None:
        return subprocess.run(argv, preexec_fn=enter, **streams).returncode
    info_read, info_write = os.pipe()
    block_read, block_write = os.pipe()
    separator = argv.index("--")
    argv = [*argv[:separator], "--info-fd", str(info_write), "--block-fd", str(block_read), *argv[separator:]]
    job = subprocess.Popen(argv, pass_fds=(info_write, block_read), preexec_fn=enter, **streams)
    os.close(info_write)
    os.close(block_read)
    network, sandbox = None, None
    try:
        sandbox = read_child_pid(info_read)
        network = connect(sandbox, pasta)
        os.write(block_write, b"1")
    except Exception as exc:                       # the job never starts: say why in its output
        print(f"ringmaster: the job's network could not be set up: {exc}", file=sys.stderr, flush=True)
        # Killed while it is held (the end of the hold's pipe would let it go on): the first
        # process of its PID namespace, and with it the namespace, then bubblewrap.
        if sandbox is not None:
            os.kill(sandbox, signal.SIGKILL)
        job.kill()
        job.wait()
    finally:
        os.close(block_write)
    try:
        return job.wait()
    finally:
        if network is not None:
            network.terminate()
            try:
                network.wait(timeout=5)
            except subprocess.TimeoutExpired:
                network.kill()


# The installer's last lines kept for the job's reason when it fails.
TAIL_LINES, TAIL_CHARS = 8, 300
LOCK_POLL_SECONDS = 0.2
# Set by SIGTERM (a cancel): a wait for another job's install gives up.
STOPPING = threading.Event()


def report(path, state, **more):
    """The install's state, for the job's follower (written whole: a new file renamed over)."""
    with open(path + ".tmp", "w") as out:
        json.dump({"state": state, **more}, out)
    os.rename(path + ".tmp", path)


def _locked(path, waiting):
    """The lock file `path`, held (None: a cancel came while another job held it); `waiting()`
    is called once if another job holds it now."""
    handle = open(path, "a")
    told = False
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            if not told:
                waiting()
                told = True
            if STOPPING.wait(LOCK_POLL_SECONDS):
                handle.close()
                return None


def _copy(source, tail):
    """Copy the installer's output to this process's (the job's output), keeping its last lines."""
    pending = b""
    with os.fdopen(source, "rb") as stream:
        while chunk := stream.read1(1 << 16):
            os.write(1, chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            tail.extend(line.decode(errors="replace").rstrip() for line in lines if line.strip())
    if pending.strip():
        tail.append(pending.decode(errors="replace").rstrip())


def _hand_over(folder, uid):
    """Every file under `folder` (not following links) to `uid` (None: left as they are), and
    none of them writable."""
    for parent, folders, files in os.walk(folder):
        for name in [None, *folders, *files]:
            path = parent if name is None else os.path.join(parent, name)
            info = os.lstat(path)
            if uid is not None:
                os.lchown(path, uid, os.getegid())
            if not os.path.islink(path):
                os.chmod(path, info.st_mode & 0o7555)


def _remove(folder):
    """Remove what an install cut short left (made read-only where it was cut after the install)."""
    if not os.path.lexists(folder):
        return
    for parent, folders, _ in os.walk(folder):
        for name in [None, *folders]:
            path = parent if name is None else os.path.join(parent, name)
            if not os.path.islink(path):
                os.chmod(path, 0o700)
    shutil.rmtree(folder)


def install(plan, limits=None):
    """The plan's environment made ready (0), or the installer's exit code (run within `limits`)."""
    status, env, owner = plan["status"], plan["env"], plan["owner"]
    TOOLS.update(plan.get("tools", {}))
    if os.path.exists(plan["complete"]):
        report(status, "cached")
        return 0
    lock = _locked(plan["lock"], lambda: report(status, "waiting"))
    if lock is None:
        report(status, "failed", lines=["cancelled while waiting for another job's install"])
        return 143
    with lock:
        if os.path.exists(plan["complete"]):
            report(status, "cached")
            return 0
        report(status, "installing")
        _remove(env)
        os.mkdir(env, 0o755)
        requirements = os.path.join(env, plan["requirements_file"])
        with open(requirements, "w") as out:
            out.write(plan["requirements"])
        if owner is not None:
            os.chown(env, owner, owner)
            os.chown(requirements, owner, owner)
        tail = collections.deque(maxlen=TAIL_LINES)
        read_fd, write_fd = os.pipe()
        copier = threading.Thread(target=_copy, args=(read_fd, tail))
        copier.start()
        try:
            code = run(plan["argv"], plan.get("outbound"), limits, stdout=write_fd)
        finally:
            os.close(write_fd)
            copier.join()
        if code != 0:
            _remove(env)
            lines = list(tail)
            while len(" / ".join(lines)) > TAIL_CHARS and len(lines) > 1:
                lines.pop(0)
            report(status, "failed", code=code, lines=lines)
            print(f"ringmaster: the installer exited with code {code}; the job was not started", flush=True)
            return code
        _hand_over(env, os.geteuid() if owner is not None else None)
        with open(plan["complete"] + ".tmp", "w") as out:
            json.dump({"requirements": plan["requirements"]}, out)
        os.rename(plan["complete"] + ".tmp", plan["complete"])
        report(status, "installed")
        return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--exit-code", required=True)
    parser.add_argument("--install", metavar="PLAN")
    parser.add_argument("--outbound", metavar="PASTA")
    parser.add_argument("--nsenter", default=TOOLS["nsenter"])
    parser.add_argument("--ip", default=TOOLS["ip"])
    parser.add_argument("--cgroup", default=str(os.getpid()), help="the job's cgroups' name")
    parser.add_argument("--max-processes", type=int)
    parser.add_argument("--memory-mib", type=int)
    parser.add_argument("--own-uid", action="store_true")
    parser.add_argument("--hit", metavar="FILE")
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    argv = options.argv[1:] if options.argv[:1] == ["--"] else options.argv
    TOOLS.update(nsenter=options.nsenter, ip=options.ip)
    # A cancel sends SIGTERM to every process of the job, this one included: it outlives the
    # sandbox, to end pasta and record the exit code. (A handler, not SIG_IGN, which the sandbox
    # would inherit.)
    signal.signal(signal.SIGTERM, lambda *_: STOPPING.set())
    limits = Limits(options.cgroup, options.max_processes, options.memory_mib, options.own_uid)
    limits.make()
    try:
        code = 0
        if options.install:                 # the installer runs code of the project's packages: within the limits too
            with open(options.install) as plan:
                code = install(json.load(plan), limits)
        if code == 0:
            code = run(argv, options.outbound, limits)
    finally:
        said = [f"{kind} {limit}\n" for kind, limit in limits.hit()] + \
            [f"rlimit {kind} {limit}\n" for kind, limit in limits.rlimits()]
        limits.remove()
    code = code if code >= 0 else 128 - code
    if code and said and options.hit:
        with open(options.hit, "w") as out:
            out.write("".join(said))
    with open(options.exit_code + ".tmp", "w") as out:
        out.write(f"{code}\n")
    os.rename(options.exit_code + ".tmp", options.exit_code)
    return code


if __name__ == "__main__":
    sys.exit(main())
