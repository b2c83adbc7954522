"""The capabilities an MPIJob's pods keep, tried on Debian's real sshd and ssh.

A worker pod runs the image's sshd as root, and the launcher's mpirun or horovodrun logs in to it
with ssh. Here each runs as root the way it would in a container with the securityContext that
runners/mpijob.py gives it: its capability bounding set holds only what the context adds back,
and no_new_privs stands for allowPrivilegeEscalation: false (setpriv sets both). sshd listens on
a port below 1024 and uses PAM, as in a Debian or Ubuntu training image; ssh runs a command
without a terminal, as mpirun's and horovodrun's do.
"""
import os
import shutil
import socket
import subprocess

import pytest

from runners import mpijob
from runners.base import JobSpec
from tests.sshd import SSHD, keygen

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or not os.access(SSHD, os.X_OK),
    reason="needs root, setpriv and Debian's sshd")

ADDRESS = "127.0.0.9"
# Bit numbers of linux/capability.h, for reading a process's CapEff.
CAPABILITY_BITS = {"SETGID": 6, "SETUID": 7, "NET_BIND_SERVICE": 10, "SYS_CHROOT": 18}


def security_contexts():
    """(launcher's, worker's) container securityContext of a built, validated MPIJob."""
    spec = JobSpec(job_id=1, gpus=2, python="python", script_name="", script_content=None,
                   script_path="/examples/train.py", container_image="registry.example/horovod:0.28.1")
    job, _ = mpijob.build(spec, mpijob.ClusterSpec(namespace="a", gpus_per_node=1))
    replicas = job["spec"]["mpiReplicaSpecs"]
    return tuple(replicas[kind]["template"]["spec"]["containers"][0]["securityContext"]
                 for kind in ("Launcher", "Worker"))


def confined(argv, context):
    """argv run as root in a container with this securityContext."""
    assert context["capabilities"]["drop"] == ["ALL"]
    bounding = ",".join(["-all", *(f"+{name.lower()}" for name in context["capabilities"].get("add", []))])
    wrapper = ["setpriv", "--inh-caps=-all", f"--bounding-set={bounding}"]
    if context.get("allowPrivilegeEscalation") is False:
        wrapper.append("--no-new-privs")
    return [*wrapper, *argv]


def privileged_port():
    """A port below 1024 free on ADDRESS (sshd's own 22 where it is free)."""
    for port in (22, 222, 622, 922):
        with socket.socket() as probe:
            try:
                probe.bind((ADDRESS, port))
            except OSError:
                continue
            return port
    pytest.skip(f"no privileged port free on {ADDRESS}")


@pytest.fixture
def keys(tmp_path):
    user_key = keygen(tmp_path / "id_ed25519")
    (tmp_path / "authorized_keys").write_text((tmp_path / "id_ed25519.pub").read_text())
    return tmp_path, user_key


def start_sshd(directory, context):
    """(process, port) of an sshd under `context`, once it has said where it listens; None if it
    exited first."""
    os.makedirs("/run/sshd", exist_ok=True)       # its privilege separation directory (the image has it)
    port = privileged_port()
    config = directory / "sshd_config"
    config.write_text("\n".join([
        f"ListenAddress {ADDRESS}:{port}", f"HostKey {keygen(directory / 'host_key')}",
        f"AuthorizedKeysFile {directory / 'authorized_keys'}", f"PidFile {directory / 'sshd.pid'}",
        "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "UsePAM yes", "StrictModes no", "PrintMotd no"]) + "\n")
    process = subprocess.Popen(confined([SSHD, "-D", "-e", "-f", str(config)], context), stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    for line in process.stderr:                    # ends if sshd exits
        if "Server listening on" in line:
            return process, port
    process.wait(timeout=30)
    process.stderr.close()
    return None


def ssh(key, port, context, command):
    argv = ["ssh", "-i", str(key), "-p", str(port), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
            f"root@{ADDRESS}", command]
    return subprocess.run(confined(argv, context), capture_output=True, text=True, timeout=60)


def stop(process):
    process.terminate()
    process.wait(timeout=30)
    process.stderr.close()


def test_the_launcher_logs_in_to_a_workers_sshd_and_the_rank_keeps_only_the_workers_capabilities(keys):
    directory, key = keys
    launcher, worker = security_contexts()
    started = start_sshd(directory, worker)
    assert started, "sshd does not start with the worker's capabilities"
    sshd, port = started
    try:
        answer = ssh(key, port, launcher, "grep CapEff /proc/self/status && id -u")
    finally:
        stop(sshd)
    assert answer.returncode == 0, answer.stderr
    effective_line, uid = answer.stdout.splitlines()[:2]
    kept = sum(1 << CAPABILITY_BITS[name] for name in worker["capabilities"]["add"])
    assert int(effective_line.split()[1], 16) == kept
    assert uid == "0"


def test_sshd_with_no_capability_serves_no_login(keys):
    """The confinement is real: given the launcher's context (no capability), the same sshd
    cannot bind its port or, where unprivileged ports start at 0, serve the login."""
    directory, key = keys
    launcher, _ = security_contexts()
    started = start_sshd(directory, launcher)
    if started is not None:
        sshd, port = started
        try:
            answer = ssh(key, port, launcher, "true")
        finally:
            stop(sshd)
        assert answer.returncode != 0
