"""Jobs on an instance keep apart as they do on the portal's machine (runners.ssh): where the
instance's account is root or may run `sudo -n`, each job runs under a uid of its own, in a
folder of mode 0700 that is that uid's, and cannot read another job's files, signal its
processes, or write what the portal reads back (output.log, exit_code). Where the account can do
neither, jobs run under the account, and the health check records that for the admin page and
the job form.

The instances are this machine, behind real sshd on loopback (tests/sshd.py); the accounts that
are not root are made here with useradd, one of them allowed `sudo -n` by a sudoers file.
"""
import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.backends.instances.backend import check
from jobs.backends.instances.models import Instance
from runners import ssh
from runners.base import Exited, JobSpec, waited
from tests import sshd
from tests.conftest import processes_marked, run_to_end, wait_for
from tests.integration.test_instances import add_instance, sshds  # noqa: F401 (the sshd fixture)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sshd.available() or os.geteuid() != 0,
                       reason="needs Debian's openssh-server, and root to make the instances' accounts"),
]
SUDOERS = Path("/etc/sudoers.d/ringmaster-tests")

FIRST = """
import json, os, sys, time
open("results.txt", "w").write("the first job's results")
tries = {}
for path in sys.argv[1:]:               # what the portal reads back (to write), a root-only file (to read)
    mode = "a" if path.endswith((".log", "exit_code")) else "rb"
    try:
        open(path, mode).close()
        tries[path] = "opened"
    except OSError as exc:
        tries[path] = type(exc).__name__
here = os.stat(".")
print("FIRST " + json.dumps({"uid": os.getuid(), "pid": os.getpid(), "mode": oct(here.st_mode & 0o777),
                             "owner": here.st_uid, "home": os.environ.get("HOME"), "tries": tries}), flush=True)
while not os.path.exists("go"):
    time.sleep(0.05)
"""
SECOND = """
import json, os, sys
results, pid = sys.argv[1], int(sys.argv[2])
tries = {}
for name, attempt in (("read", lambda: open(results).read()),
                      ("environ", lambda: open(f"/proc/{pid}/environ", "rb").read()),
                      ("signal", lambda: os.kill(pid, 0))):
    try:
        attempt()
        tries[name] = "done"
    except OSError as exc:
        tries[name] = type(exc).__name__
print("SECOND " + json.dumps({"uid": os.getuid(), "tries": tries}), flush=True)
"""
SLEEPS = """
import os, time
print("UID", os.getuid(), flush=True)
time.sleep(600)
"""


def reachable(path):
    """Search permission on every folder above `path`: an instance's Python must be one that its
    account can run (this venv's is under /root)."""
    for folder in Path(path).parents:
        if folder != Path("/") and not folder.stat().st_mode & 0o001:
            folder.chmod(folder.stat().st_mode | 0o001)


@pytest.fixture
def account(request, sshds):  # noqa: F811
    """An account on the instance (this machine) that sshd lets in with the test key (sshd
    reads the keys file as the account); with `sudo -n` where the test's parameter says so.
    Removed afterwards."""
    name = f"rm{request.param}"
    subprocess.run(["userdel", "-r", name], capture_output=True)
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True)
    subprocess.run(["usermod", "-p", "*", name], check=True)      # no password, not locked: key logins
    if request.param == "sudo":
        SUDOERS.write_text(f"{name} ALL=(ALL) NOPASSWD: ALL\n")
        SUDOERS.chmod(0o440)
    for path in (sys.executable, os.path.realpath(sys.executable), sshds["servers"][0].directory / "authorized_keys"):
        reachable(path)
    yield name, Path(pwd.getpwnam(name).pw_dir)
    SUDOERS.unlink(missing_ok=True)
    subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
    subprocess.run(["userdel", "-r", name], capture_output=True)


def host(sshds, address, user, work_dir, peer_ssh_key=None, slots=1):  # noqa: F811
    return ssh.Host(name=f"instance-{address}", address=address, port=sshds["port"], user=user,
                    private_key=sshds["key"].read_text(), slots=slots, work_dir=str(work_dir),
                    peer_ssh_port=sshds["port"], peer_ssh_key=str(peer_ssh_key or sshds["key"]),
                    network_interface="lo")


def spec(job_id, script, *args, gpus=1):
    return JobSpec(job_id=job_id, gpus=gpus, python=sys.executable, script_name="job.py", script_content=script,
                   script_path=None, args=tuple(args), installation="isolation")


def said(path, word):
    """The JSON that a rank printed after `word` in output.log at `path`, once it is there."""
    for line in path.read_text(errors="replace").splitlines():
        if word in line:
            return json.loads(line.split(word, 1)[1])
    return None


def test_on_a_root_instance_each_job_has_a_uid_that_no_other_job_and_nothing_of_the_portal_shares(
        sshds, tmp_path):  # noqa: F811
    work = tmp_path / "work"
    runner = ssh.SSHRunner([host(sshds, "127.0.0.2", "root", work)], kill_grace=5, poll_interval=0.1)
    assert ssh.check(runner.first, build=False)[2] == "uid+bwrap"
    first = spec(1, FIRST)
    control = work / ".portal" / first.name
    host_key = next(Path("/etc/ssh").glob("ssh_host_*_key"))
    first = spec(1, FIRST, str(control / "output.log"), str(control / "exit_code"), str(host_key))
    started = runner.launch(first)
    assert "as uid" in started.detail, started.detail
    try:
        seen = wait_for(lambda: said(control / "output.log", "FIRST "), timeout=120, message="the first job")
        results = work / first.name / "results.txt"
        lines, exited = run_to_end(runner, spec(2, SECOND, str(results), str(seen["pid"])))
        second = json.loads(next(line.text for line in lines if "SECOND " in line.text).split("SECOND ", 1)[1])
        assert exited.code == 0
    finally:
        (work / first.name / "go").touch()
    assert [e.code for e in waited(runner.follow(first, 0)) if isinstance(e, Exited)] == [0]

    # Each job: a uid of its own, neither root nor the other's, that owns a folder nobody else opens.
    assert 0 not in (seen["uid"], second["uid"]) and seen["uid"] != second["uid"]
    assert (seen["owner"], seen["mode"], seen["home"]) == (seen["uid"], "0o700", str(work / first.name))
    assert results.stat().st_uid == seen["uid"] and int((control / "uid").read_text()) == seen["uid"]
    # What the portal reads back, and the machine's host keys, are out of the job's reach...
    assert set(seen["tries"].values()) == {"PermissionError"}, seen["tries"]
    assert (control.stat().st_uid, control.stat().st_mode & 0o777) == (0, 0o700)
    # ...and so are the other job's files, its processes' environment, and its processes.
    assert second["tries"] == {"read": "PermissionError", "environ": "PermissionError",
                               "signal": "PermissionError"}, second["tries"]


@pytest.mark.parametrize("account", ["sudo"], indirect=True)
def test_an_account_that_may_sudo_runs_each_job_under_a_uid_of_its_own_and_cancel_stops_them_all(
        sshds, account):  # noqa: F811
    name, home = account
    work = home / "jobs"
    peer_key = home / "peer_key"                      # how horovodrun, as the account, reaches the second host
    shutil.copy(sshds["key"], peer_key)
    shutil.chown(peer_key, name, name)
    runner = ssh.SSHRunner([host(sshds, address, name, work, peer_key) for address in ("127.0.0.2", "127.0.0.3")],   # a rank on each
                           kill_grace=5, poll_interval=0.1)
    assert ssh.check(runner.first, build=False)[2] == "uid+bwrap"
    job = spec(3, SLEEPS, gpus=2)
    runner.launch(job)
    marker = str(work / job.name)
    try:
        output = work / ".portal" / job.name / "output.log"
        wait_for(lambda: output.exists() and output.read_text().count("UID ") == 2, timeout=120,
                 message="both ranks to start")
        uids = {int(line.split("UID ", 1)[1]) for line in output.read_text().splitlines() if "UID " in line}
        assert len(uids) == 1 and uids.isdisjoint({0, pwd.getpwnam(name).pw_uid}), uids
        assert (work / job.name).stat().st_uid in uids
        assert len(processes_marked(marker, "RINGMASTER_JOB_DIR")) >= 2
    finally:
        runner.cancel(job)                    # as root, through sudo -n: the ranks are another uid's
    assert processes_marked(marker, "RINGMASTER_JOB_DIR") == []


@pytest.mark.parametrize("account", ["plain"], indirect=True)
@pytest.mark.django_db
def test_an_account_that_can_neither_runs_jobs_under_itself_and_its_instance_says_so(
        sshds, account):  # noqa: F811
    name, home = account
    instance = add_instance(sshds, "plain", "127.0.0.2", 1, user=name, work_dir=home / "jobs")
    assert check(instance, build=False)[0] is True
    assert Instance.objects.get(pk=instance.pk).isolation == "shared"

    runner = ssh.SSHRunner([host(sshds, "127.0.0.2", name, home / "jobs")], kill_grace=5, poll_interval=0.1)
    lines, exited = run_to_end(runner, spec(4, "import os; print('UID', os.getuid())"))
    assert exited.code == 0
    assert [line.text for line in lines] == [f"UID {pwd.getpwnam(name).pw_uid}"]
    folder = home / "jobs" / spec(4, "").name
    assert (folder.stat().st_uid, folder.stat().st_mode & 0o777) == (pwd.getpwnam(name).pw_uid, 0o700)
    assert not (home / "jobs" / ".portal" / spec(4, "").name / "uid").exists()
    shutil.rmtree(home / "jobs")
