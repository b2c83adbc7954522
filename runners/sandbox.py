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
import glob
import os
import shutil
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

    def supervise(self):
        """runners.supervisor's options for the network."""
        if self.network != "outbound":
            return []
        if not self.pasta:
            raise SandboxError("RINGMASTER_JOB_NETWORK=outbound, but pasta is not installed "
                               "(apt-get install passt)")
        return ["--outbound", self.pasta]

    def argv(self, job_dir, keep=()):
        """bwrap's options for a job in `job_dir`; `keep`: folders the job needs (its interpreter's
        installation, what it may import of Ringmaster) shown read-only even where they lie in a
        hidden place (a checkout under /tmp)."""
        if not self.bwrap:
            raise SandboxError("RINGMASTER_LOCAL_SANDBOX=bwrap, but bwrap is not installed "
                               "(apt-get install bubblewrap)")
        job_dir = str(Path(job_dir).resolve())
        argv = [self.bwrap, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
                "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--cap-drop", "ALL", "--tmpfs", "/tmp", "--tmpfs", "/dev/shm"]
        if self.network != "host":
            argv.append("--unshare-net")
        for device in sorted(glob.glob("/dev/nvidia*")):
            argv += ["--dev-bind", device, device]
        hidden = ["/tmp"]
        for folder in self.hide:
            if Path(folder).is_dir():
                hidden.append(str(Path(folder).resolve()))
                argv += ["--tmpfs", hidden[-1]]
        for path in [*HIDDEN_FILES, *(os.path.join(self.home, name) for name in HIDDEN_IN_HOME if self.home)]:
            if os.path.isdir(path):
                argv += ["--tmpfs", path]
            elif os.path.lexists(path):
                argv += ["--ro-bind", "/dev/null", path]
            else:
                continue
            hidden.append(path)
        for folder in keep:
            # Never a folder that holds something hidden ("/" for a python in /bin): that would show it again.
            if Path(folder).is_dir() and not any(Path(h).is_relative_to(folder) for h in hidden):
                argv += ["--ro-bind", str(folder), str(folder)]
        return [*argv, "--bind", job_dir, job_dir, "--chdir", job_dir, "--"]


def find(setting, hide, home, network="none"):
    """The Sandbox for RINGMASTER_LOCAL_SANDBOX: "bwrap" (required), "auto" (bwrap where it is
    installed), "none" (no sandbox: jobs can read the portal's secrets). None for no sandbox.
    `network`: one of NETWORKS."""
    if setting == "none":
        return None
    path = shutil.which("bwrap")
    if path is None and setting != "bwrap":
        return None                     # "auto" without bwrap; a launch with "bwrap" says what is missing
    return Sandbox(path or "", tuple(str(h) for h in hide), str(home or ""), network, shutil.which("pasta") or "")
