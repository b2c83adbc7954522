"""The sandbox a job on the portal's own machine runs in (bubblewrap, Debian's `bubblewrap`).

The local backend runs users' code on the machine that holds the portal's secrets: the secret
key and the Fernet keys in its processes' environments and in its data folder, the database
file, the admin's home. In the sandbox a job sees the machine's files read-only, less what is
hidden (the portal's data folder, every other job's folder, the login secrets named below),
writes only its own folder and a private /tmp, has its own PID namespace and /proc (the portal's
processes, and their environments, do not exist there), a minimal /dev plus the NVIDIA devices,
and no capabilities (root in the sandbox cannot read what its owner bits do not allow, mount,
or trace). Its network is the site's choice (RINGMASTER_JOB_NETWORK, NETWORKS): a namespace of
its own with its loopback only, the same with a way out through pasta (runners.supervisor), or
the machine's network, where a database that trusts every local connection is not hidden.
"""
import fcntl
import glob
import os
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path

# Files of the machine a job never needs: hidden behind an empty file or folder where they exist.
HIDDEN_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers")
HIDDEN_IN_HOME = (".ssh", ".config", ".kube", ".pgpass", ".netrc", ".docker", ".aws", ".bash_history",
                  ".python_history", ".psql_history", ".rediscli_history")


# What a job's network is. Every rank of a job shares the one namespace, so Gloo and
# torch.distributed talk over its loopback.
NETWORKS = {
    "none": "a network namespace of its own: its loopback only",
    "outbound": "a network namespace of its own, with outbound connections through pasta (NAT); "
                "the machine's loopback and its addresses unreachable",
    "host": "the machine's network: a job reaches every service of this machine, the portal's included",
}


class SandboxError(Exception):
    pass


@dataclass(frozen=True)
class Sandbox:
    """bwrap's argv for a job: `hide` are folders of the portal (its data folder, the jobs
    folder) that the job's own folder is shown inside of again."""

    bwrap: str
    hide: tuple[str, ...]
    home: str = ""
    network: str = "none"
    pasta: str = ""               # runners.supervisor connects the namespace with it ("outbound")
    setpriv: str = "setpriv"      # the tools the portal runs as root, by their absolute paths (find)
    nsenter: str = "nsenter"
    ip: str = "ip"

    def supervise(self):
        """runners.supervisor's options for the network."""
        if self.network != "outbound":
            return []
        if os.geteuid() != 0:
            raise SandboxError("RINGMASTER_JOB_NETWORK=outbound needs a portal that runs as root; "
                               "set it to none (no network) or run the worker as root")
        if not self.pasta:
            raise SandboxError("RINGMASTER_JOB_NETWORK=outbound, but pasta is not installed "
                               "(apt-get install passt)")
        return ["--outbound", self.pasta, "--nsenter", self.nsenter, "--ip", self.ip]

    def argv(self, job_dir, keep=(), uid=None, later=()):
        """bwrap's options for a job in `job_dir`, up to and including the `--` before its command;
        `keep`: folders the job needs (its interpreter's installation, what it may import of
        Ringmaster) shown read-only even where they lie in a hidden place (a checkout under
        /tmp). With `uid`, the job runs as that user and group, with no supplementary groups: the
        sandbox keeps only the capability to switch to it, which setpriv gives up before the
        job's first instruction (bwrap sets no_new_privs, so no setuid program gives it back),
        and folders on the way to its own that this user could not pass (a checkout under
        /root) are replaced by empty ones holding only what is shown again. `later`: folders
        shown read-only like `keep`'s that may be made only after this argv (a project's
        environment of extra packages, which the supervisor installs before bwrap starts).

        The command after the `--` starts as the job (its user where `uid` is given) with the
        environment bwrap was given, which is the fixed one of the portal's own processes: it
        is runners/job_python/ringmaster_start.py, which changes to the job's folder and only
        then takes on the user's environment."""
        if not self.bwrap:
            raise SandboxError("RINGMASTER_LOCAL_SANDBOX=bwrap, but bwrap is not installed "
                               "(apt-get install bubblewrap)")
        job_dir = str(Path(job_dir).resolve())
        caps = ["--cap-drop", "ALL"] + (["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if uid is not None else [])
        argv = [self.bwrap, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
                "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                *caps, "--perms", "01777", "--tmpfs", "/tmp", "--perms", "01777", "--tmpfs", "/dev/shm"]
        if self.network != "host":
            argv.append("--unshare-net")
        if os.geteuid() != 0:
            argv.append("--unshare-user")     # the namespaces of a portal that is not root belong to one of its own
        for device in sorted(glob.glob("/dev/nvidia*")):
            argv += ["--dev-bind", device, device]
        hidden = ["/tmp"]
        if uid is not None:
            for folder in closed_on_the_way([job_dir, *keep, *later]):
                if not any(Path(folder).is_relative_to(h) for h in hidden):
                    argv += ["--tmpfs", folder]
                    hidden.append(folder)
        # Outer folders first; one inside another of them is hidden with it (a tmpfs of its own
        # would leave its name showing there, as the mount point bwrap makes for it).
        folders = {str(Path(folder).resolve()) for folder in self.hide if Path(folder).is_dir()}
        emptied = []
        for folder in sorted(folders, key=lambda folder: len(Path(folder).parts)):
            hidden.append(folder)
            if not any(Path(folder).is_relative_to(outer) for outer in emptied):
                emptied.append(folder)
                argv += ["--tmpfs", folder]
        for path in [*HIDDEN_FILES, *(os.path.join(self.home, name) for name in HIDDEN_IN_HOME if self.home)]:
            if os.path.isdir(path):
                argv += ["--tmpfs", path]
            elif os.path.lexists(path):
                argv += ["--ro-bind", "/dev/null", path]
            else:
                continue
            hidden.append(path)
        shown = [str(folder) for folder in keep
                 # Never a folder that holds something hidden ("/" for a python in /bin): that would show it again.
                 if Path(folder).is_dir() and not any(Path(h).is_relative_to(folder) for h in hidden)]
        shown += [str(folder) for folder in later if not any(Path(h).is_relative_to(folder) for h in hidden)]
        if uid is not None:
            # bwrap makes the folders on the way to what it shows again 0700: its user could not pass.
            argv += [option for folder in passable_on_the_way([*shown, job_dir], hidden)
                     for option in ("--perms", "0755", "--dir", folder)]
        for folder in shown:
            argv += ["--ro-bind", folder, folder]
        argv += ["--bind", job_dir, job_dir]
        if uid is None:
            return [*argv, "--chdir", job_dir, "--"]
        # Into its folder only as its user (ringmaster_start): the sandbox's root has no right to open it.
        return [*argv, "--", self.setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                "--"]


def passable_on_the_way(folders, hidden):
    """The folders between each hidden (emptied) folder and the folders of `folders` inside it,
    top down."""
    between = []
    for folder in folders:
        for above in reversed(Path(folder).parents):
            if any(above != Path(h) and above.is_relative_to(h) for h in hidden) and str(above) not in between:
                between.append(str(above))
    return between


def closed_on_the_way(folders):
    """The folders above `folders` (not "/") that other users cannot pass through (no o+x)."""
    closed = []
    for folder in folders:
        for above in reversed(Path(folder).resolve().parents[:-1]):
            try:
                if not os.stat(above).st_mode & 0o001 and str(above) not in closed:
                    closed.append(str(above))
            except OSError:
                pass
    return closed


# Job users: a uid of their own for every running job on this machine, from a range no
# distribution hands out (useradd stops at 60000, systemd's dynamic users at 65519; container
# runtimes map 65536 and up per container, below 2^30).
UID_BASE, UID_SPAN = 1 << 30, 1 << 24


def job_uid(marker, lock_dir="/run/lock"):
    """A uid for the job whose folder is `marker`, that no process on the machine runs as:
    derived from the folder (unique per installation and job), the next free one where taken.
    A context manager that holds a machine-wide lock while the caller starts the job's first
    process, so that portals on one machine pick uids one at a time."""
    return _UidClaim(marker, lock_dir if os.path.isdir(lock_dir) else "/tmp")


class _UidClaim:
    def __init__(self, marker, lock_dir):
        self.marker, self.path = marker, os.path.join(lock_dir, "ringmaster-job-uids.lock")

    def __enter__(self):
        self.handle = open(self.path, "a")
        fcntl.flock(self.handle, fcntl.LOCK_EX)
        taken = set()
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    taken.add(entry.stat().st_uid)
                except OSError:
                    pass
        offset = zlib.crc32(self.marker.encode()) % UID_SPAN
        while UID_BASE + offset in taken:
            offset = (offset + 1) % UID_SPAN
        return UID_BASE + offset

    def __exit__(self, *exc):
        self.handle.close()


def find(setting, hide, home, network="none"):
    """The Sandbox for RINGMASTER_LOCAL_SANDBOX: "bwrap" (required), "auto" (bwrap where it is
    installed), "none" (no sandbox: jobs can read the portal's secrets). None for no sandbox.
    `network`: one of NETWORKS."""
    if setting == "none":
        return None
    path = shutil.which("bwrap")
    if path is None and setting != "bwrap":
        return None                     # "auto" without bwrap; a launch with "bwrap" says what is missing
    tools = {name: shutil.which(name) or name for name in ("setpriv", "nsenter", "ip")}
    return Sandbox(path or "", tuple(str(h) for h in hide), str(home or ""), network, shutil.which("pasta") or "",
                   **tools)
