"""Real OpenSSH servers for the SSH backend's tests: Debian's sshd, on loopback addresses
(127.0.0.2, 127.0.0.3: two "instances" on one free port), with generated host and user keys.

Each sshd runs as the current user (root here: `PermitRootLogin prohibit-password`), trusts
only the generated user key, and gives every session a PATH whose first entry is this venv's
bin, so `python` and `horovodrun` on the "instance" are the test environment's.
"""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
SSHD = "/usr/sbin/sshd"


def keygen(path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ringmaster-test", "-f", str(path)],
                   check=True)
    return path


def free_port_on(addresses):
    """A TCP port free on every one of `addresses`."""
    for _ in range(100):
        with socket.socket() as first:
            first.bind((addresses[0], 0))
            port = first.getsockname()[1]
            try:
                for address in addresses[1:]:
                    with socket.socket() as other:
                        other.bind((address, port))
            except OSError:
                continue
            return port
    raise RuntimeError("no port free on all of " + ", ".join(addresses))


class Sshd:
    def __init__(self, directory, address, port, user_public_key, sftp=True, path_first=None):
        self.directory, self.address, self.port = Path(directory), address, port
        self.host_key = keygen(self.directory / f"host_key_{address}")
        authorized = self.directory / "authorized_keys"
        authorized.write_text(Path(user_public_key).read_text())
        # A HOME of its own, empty as on a fresh instance: root's own ~/.bashrc (which bash reads
        # for every ssh command) may run `pyenv rehash`, whose lock file a login killed mid-way (a
        # host the tests kill, a job they cancel) leaves behind, and every later login waits 60 s.
        self.home = self.directory / "home"
        self.home.mkdir(exist_ok=True)
        self.config = self.directory / f"sshd_config_{address}"
        self.config.write_text("\n".join([
            f"ListenAddress {address}",
            f"Port {port}",
            f"HostKey {self.host_key}",
            f"AuthorizedKeysFile {authorized}",
            f"PidFile {self.directory / f'sshd_{address}.pid'}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "PrintMotd no",
            "MaxStartups 100:30:200",
            "MaxSessions 100",
            # path_first: a folder of commands that stand in for the host's own (another tail...)
            f"SetEnv PATH={f'{path_first}:' if path_first else ''}{VENV_BIN}:/usr/local/bin:/usr/bin:/bin "
            f"HOME={self.home}",
            *(["Subsystem sftp internal-sftp"] if sftp else []),   # off: an sshd that offers exec only
            "LogLevel ERROR",
        ]) + "\n")
        self.log_path = self.directory / f"sshd_{address}.log"
        self.process = None

    def host_key_line(self):
        kind, blob = Path(f"{self.host_key}.pub").read_text().split()[:2]
        return f"{kind} {blob}"

    def start(self):
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)   # sshd's privilege separation dir
        self.log = open(self.log_path, "ab")
        self.process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)], stdout=self.log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"sshd on {self.address}:{self.port} exited: {self.log_path.read_text()}")
            try:
                with socket.create_connection((self.address, self.port), timeout=1) as sock:
                    if sock.recv(4).startswith(b"SSH-"):
                        return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"sshd on {self.address}:{self.port} did not come up")

    def kill(self):
        """The host goes away: the listener and every connection it serves (each in a process of
        its own) die at once, as when a machine loses power."""
        import psutil

        listener = psutil.Process(self.process.pid)
        for process in [*listener.children(recursive=True), listener]:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        self.process.wait(timeout=30)

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


def available():
    return os.path.exists(SSHD) and os.access(SSHD, os.X_OK)
