"""The `instances` backend end to end with real parts: two real OpenSSH servers on 127.0.0.2 and
127.0.0.3 (generated host and user keys), horovodrun over SSH, a real Celery worker, PostgreSQL,
jobs submitted over HTTP to uvicorn."""
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection

from jobs.backends.instances.models import Instance
from jobs.models import Job, JobEvent, SlotAllocation, State
from runners import ssh as ssh_runner
from runners.base import waited
from tests import sshd
import psutil

from tests.conftest import admit_from_threads, job_name, processes_marked, run_to_end, wait_for
from tests.integration.test_job_lifecycle import stored_lines, upload, wait_state

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not sshd.available(), reason="needs Debian's openssh-server (/usr/sbin/sshd)"),
]
ENDED = {State.SUCCEEDED, State.FAILED, State.CANCELLED}


@pytest.fixture(scope="session")
def sshds(tmp_path_factory):
    """Two sshd on one free port, on 127.0.0.2 and 127.0.0.3, trusting one generated user key."""
    directory = tmp_path_factory.mktemp("sshd")
    user_key = sshd.keygen(directory / "user_key")
    port = sshd.free_port_on(["127.0.0.2", "127.0.0.3"])
    servers = [sshd.Sshd(directory, address, port, f"{user_key}.pub").start() for address in ("127.0.0.2", "127.0.0.3")]
    work_dir = tmp_path_factory.mktemp("instance-work")
    yield {"servers": servers, "port": port, "key": user_key, "work_dir": work_dir}
    for server in servers:
        server.stop()


def add_instance(sshds, name, address, gpus, check=False, user="root", work_dir=None, **extra):
    """Register an instance with the management command (the key file is read and encrypted)."""
    argv = ["add_instance", "--name", name, "--host", address, "--port", str(sshds["port"]), "--user", user,
            "--key-file", str(sshds["key"]), "--gpus", str(gpus), "--work-dir", str(work_dir or sshds["work_dir"]),
            "--peer-ssh-port", str(sshds["port"]), "--peer-ssh-key", str(sshds["key"]),
            "--network-interface", "lo"]
    for option, value in extra.items():
        argv += [f"--{option.replace('_', '-')}", str(value)]
    if not check:
        argv.append("--no-check")
    call_command(*argv)
    instance = Instance.objects.get(name=name)
    if not check:
        # `horovodrun --check-build` takes many seconds on a loaded machine: the health check is
        # tested once (test_add_instance_...); other tests mark their instances healthy.
        Instance.objects.filter(pk=instance.pk).update(healthy=True, health_reason="ok (test)")
        instance.refresh_from_db()
    return instance


def submit(http, **fields):
    response = http.post(f"{http.base}/api/jobs/", json={"image": "horovod-cpu", "backend": "instances", **fields})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def job_processes(sshds, job_id):
    """Live processes of job `job_id` on the instances (this machine): its job-folder marker."""
    marker = str((sshds["work_dir"] / job_name(job_id)).resolve())
    found = []
    for process in psutil.process_iter():
        try:
            if process.status() != psutil.STATUS_ZOMBIE and process.environ().get("RINGMASTER_JOB_DIR") == marker:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def running_event(job_id):
    return JobEvent.objects.filter(job_id=job_id, state=State.RUNNING).values_list("message", flat=True).first()


def assert_complete(job_id, count):
    lines = stored_lines(job_id)
    assert [line.seq for line in lines] == list(range(len(lines)))
    for rank in (0, 1):
        texts = [l.text for l in lines if l.rank == rank and "line=" in l.text]
        assert texts == [f"rank={rank} line={i}" for i in range(count)]


def test_add_instance_stores_the_key_encrypted_checks_health_and_records_the_host_key(sshds, celery_worker, db,
                                                                                     capsys):
    instance = add_instance(sshds, "gpu-a", "127.0.0.2", 2, check=True)
    out = capsys.readouterr().out

    assert instance.healthy, instance.health_reason
    assert "no nvidia-smi" in instance.health_reason and instance.health_checked_at
    assert instance.host_key == sshds["servers"][0].host_key_line()             # trusted on first use
    assert "SHA256:" in out and "PRIVATE KEY" not in out
    key = sshds["key"].read_text()
    assert "PRIVATE KEY" not in instance.private_key_encrypted and instance.private_key() == key
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM jobs_instance")
        assert "PRIVATE KEY" not in repr(cursor.fetchall())


def test_a_host_whose_horovod_cannot_load_pytorch_is_unhealthy_until_it_passes_the_full_check(sshds, db, tmp_path):
    """A new instance gets the full check (`horovodrun --check-build`, which exits 0 whatever it
    lacks: its report is read). A healthy one's check each minute only starts horovodrun, so it
    does not take 10 CPU-seconds from the host's jobs; the admin's check is the full one."""
    from jobs.backends.instances import backend as instances

    broken = tmp_path / "broken" / "torch"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise ImportError("libcudart.so.12: cannot open shared object file")\n')
    instance = add_instance(sshds, "gpu-a", "127.0.0.2", 2, check=True,
                            setup=f'PYTHONPATH="{broken.parent}"; export PYTHONPATH')
    instance.refresh_from_db()
    assert not instance.healthy
    assert instance.health_reason.endswith(
        ": horovodrun --check-build: Horovod is built without a framework (TensorFlow, PyTorch, MXNet) "
        "and without the Gloo controller"), instance.health_reason

    Instance.objects.filter(pk=instance.pk).update(healthy=True)          # as if it had passed before
    instance.refresh_from_db()
    assert instances.check(instance) == (True, "ok: no nvidia-smi (CPU slots)")
    ok, reason = instances.check(instance, build=True)
    assert not ok and "Horovod is built without a framework" in reason
    assert not Instance.objects.get(pk=instance.pk).healthy


def test_a_changed_host_key_is_refused(sshds, db):
    instance = add_instance(sshds, "gpu-a", "127.0.0.2", 2)
    other = sshds["servers"][1].host_key_line()                                # the key of another host
    Instance.objects.filter(pk=instance.pk).update(host_key=other)
    instance.refresh_from_db()
    from jobs.backends.instances import backend as instances

    ok, reason = instances.check(instance)
    assert not ok and "host key changed" in reason and "refusing" in reason
    assert not Instance.objects.get(pk=instance.pk).healthy


def fingerprint(server):
    """OpenSSH's own SHA256 fingerprint of a test sshd's host key (ssh-keygen, not the product)."""
    out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", f"{server.host_key}.pub"], check=True,
                         capture_output=True, text=True).stdout
    return re.search(r"SHA256:[A-Za-z0-9+/]+", out).group(0)


def test_a_launch_to_a_host_whose_key_changed_is_refused(http, sshds):
    """The launch path, not only the health check: the instance's recorded host key is another
    host's (the sshd on 127.0.0.3), so its first connection is refused. The job fails naming both
    fingerprints, nothing of it reaches the host, and the instance is marked unhealthy and gets
    no more jobs."""
    this, other = sshds["servers"]
    instance = add_instance(sshds, "gpu-a", "127.0.0.2", 2)
    Instance.objects.filter(pk=instance.pk).update(host_key=other.host_key_line())
    job_id = submit(http, gpus=2, script=upload(http), args=["--lines", "1"])

    job = wait_state(job_id, ENDED, timeout=60)
    assert job.state == State.FAILED, job.reason
    mismatch = f"the host key changed (expected {fingerprint(other)}, got {fingerprint(this)}); refusing to connect"
    assert mismatch in job.reason
    assert list(JobEvent.objects.filter(job_id=job_id).exclude(state="").values_list("state", flat=True)) == [
        State.QUEUED, State.LAUNCHING, State.FAILED]                          # never RUNNING
    marker = str((sshds["work_dir"] / job_name(job_id)).resolve())
    assert processes_marked(marker, "RINGMASTER_JOB_DIR") == []               # no process of it on the host
    assert not (sshds["work_dir"] / job_name(job_id)).exists()               # nothing was put there
    refused = Instance.objects.get(pk=instance.pk)
    assert not refused.healthy and mismatch in refused.health_reason

    waiting = submit(http, gpus=1, script=upload(http), args=["--lines", "1"])
    wait_for(lambda: "no healthy enabled instance" in Job.objects.get(pk=waiting).reason, timeout=60,
             message="the next job to wait for a healthy instance")
    assert Job.objects.get(pk=waiting).state == State.QUEUED
    assert not SlotAllocation.objects.filter(job_id=waiting).exists()


def test_a_launch_with_an_unreadable_ssh_key_fails_at_once_saying_what_to_do(http, sshds):
    """The instance's key was stored under Fernet keys the worker no longer has: the job fails
    within a launch, not after retries forever, and the instance is marked unhealthy."""
    from cryptography.fernet import Fernet

    instance = add_instance(sshds, "gpu-a", "127.0.0.2", 2)
    token = Fernet(Fernet.generate_key()).encrypt(sshds["key"].read_bytes()).decode()
    Instance.objects.filter(pk=instance.pk).update(private_key_encrypted=token)
    job_id = submit(http, gpus=2, script=upload(http), args=["--lines", "1"])

    job = wait_state(job_id, ENDED, timeout=60)
    assert job.state == State.FAILED
    assert job.reason.startswith("cannot reach the job: the SSH key of instance gpu-a cannot be decrypted with the "
                                 "keys in RINGMASTER_FERNET_KEYS"), job.reason
    instance.refresh_from_db()
    assert not instance.healthy and "store its SSH key again" in instance.health_reason
    assert not (sshds["work_dir"] / job_name(job_id)).exists()


@pytest.fixture
def sshd_without_sftp(sshds, tmp_path):
    """A third "instance" (127.0.0.4) whose sshd offers no SFTP subsystem, only exec."""
    port = sshd.free_port_on(["127.0.0.4"])
    server = sshd.Sshd(tmp_path, "127.0.0.4", port, f"{sshds['key']}.pub", sftp=False).start()
    yield server
    server.stop()


def test_an_instance_without_sftp_runs_a_job_to_the_end_with_all_its_output(http, sshds, sshd_without_sftp):
    """The output is read over exec where the server has no SFTP: the job does not stay RUNNING,
    with an empty reason, for good."""
    import paramiko

    probe = paramiko.SSHClient()
    probe.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    probe.connect("127.0.0.4", port=sshd_without_sftp.port, username="root", key_filename=str(sshds["key"]))
    with pytest.raises(paramiko.SSHException):
        probe.open_sftp()                                          # the server really has none
    probe.close()
    call_command("add_instance", "--name", "no-sftp", "--host", "127.0.0.4", "--port", str(sshd_without_sftp.port),
                 "--user", "root", "--key-file", str(sshds["key"]), "--gpus", "2", "--work-dir",
                 str(sshds["work_dir"]), "--network-interface", "lo", "--no-check")
    Instance.objects.filter(name="no-sftp").update(healthy=True, health_reason="ok")
    job_id = submit(http, gpus=2, script=upload(http), args=["--lines", "30"])

    job = wait_state(job_id, ENDED, timeout=120)
    assert job.state == State.SUCCEEDED, job.reason
    assert_complete(job_id, 30)


def test_two_rank_job_runs_over_ssh_to_success(http, sshds):
    add_instance(sshds, "gpu-a", "127.0.0.2", 2)
    job_id = submit(http, gpus=2, script=upload(http), args=["--lines", "20"])

    job = wait_state(job_id, ENDED, timeout=240)
    assert job.state == State.SUCCEEDED, job.reason
    assert job.exit_code == 0
    assert "gpu-a" in running_event(job_id) and "-H localhost:2" in running_event(job_id)
    assert_complete(job_id, 20)
    assert not SlotAllocation.objects.exists()                                  # released at the end
    assert (sshds["work_dir"] / ".portal" / job_name(job_id) / "exit_code").read_text().strip() == "0"
    assert (sshds["work_dir"] / job_name(job_id)).stat().st_mode & 0o777 == 0o700     # no other user opens it


def test_two_instances_share_one_two_host_job(http, sshds):
    add_instance(sshds, "gpu-a", "127.0.0.2", 1)
    add_instance(sshds, "gpu-b", "127.0.0.3", 1)
    job_id = submit(http, gpus=2, script=upload(http), args=["--lines", "10"])

    wait_for(lambda: SlotAllocation.objects.filter(job_id=job_id).count() == 2 or
             Job.objects.get(pk=job_id).is_terminal, timeout=60, message="two instances allocated")
    job = wait_state(job_id, ENDED, timeout=240)
    assert job.state == State.SUCCEEDED, job.reason
    assert "-H 127.0.0.2:1,127.0.0.3:1" in running_event(job_id)
    assert_complete(job_id, 10)


def test_worker_killed_mid_job_keeps_the_job_and_its_log_complete(http, sshds, celery_worker):
    add_instance(sshds, "gpu-a", "127.0.0.2", 2)
    job_id = submit(http, gpus=2, script=upload(http), args=["--lines", "100", "--interval", "0.1"])
    wait_for(lambda: stored_lines(job_id) and any(l.text == "rank=0 line=10" for l in stored_lines(job_id)),
             timeout=240, interval=0.3, message="the job to be running")

    celery_worker.kill(signal.SIGKILL)
    try:
        assert Job.objects.get(pk=job_id).state == State.RUNNING
        assert job_processes(sshds, job_id), "training must survive the worker"
    finally:                                  # a failure here must not leave later tests without a worker
        celery_worker.start()

    job = wait_state(job_id, ENDED, timeout=240)
    assert job.state == State.SUCCEEDED, job.reason
    assert_complete(job_id, 100)


def test_cancel_kills_every_process_on_every_host_and_frees_the_slots(http, sshds):
    add_instance(sshds, "gpu-a", "127.0.0.2", 1)
    add_instance(sshds, "gpu-b", "127.0.0.3", 1)
    job_id = submit(http, gpus=2, script=upload(http), args=["--lines", "100000", "--interval", "0.05"])
    wait_for(lambda: any(l.text.startswith("rank=1 line=") for l in stored_lines(job_id)),
             timeout=240, interval=0.3, message="rank 1 to print")
    assert len(job_processes(sshds, job_id)) >= 3

    assert http.post(f"{http.base}/api/jobs/{job_id}/cancel/").status_code == 202
    job = wait_state(job_id, ENDED, timeout=120)
    assert job.state == State.CANCELLED
    assert job_processes(sshds, job_id) == []
    assert not SlotAllocation.objects.exists()


@pytest.fixture
def dead_port():
    """A port of 127.0.0.2 held bound, not listening, for the whole test: a connection is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.2", 0))
        yield sock.getsockname()[1]


def test_unreachable_instance_fails_the_job_quickly_with_the_reason(http, sshds, dead_port):
    add_instance(sshds, "gone", "127.0.0.2", 2)
    Instance.objects.filter(name="gone").update(port=dead_port)
    started = time.monotonic()
    job_id = submit(http, gpus=2, script=upload(http), args=["--lines", "1"])

    job = wait_state(job_id, ENDED, timeout=30)
    assert time.monotonic() - started < 30
    assert job.state == State.FAILED
    assert f"instance gone (root@127.0.0.2:{dead_port}): cannot reach the host: Connection refused" in job.reason
    gone = Instance.objects.get(name="gone")
    assert not gone.healthy and "Connection refused" in gone.health_reason  # no more jobs go there
    assert not SlotAllocation.objects.exists()


def test_a_job_that_does_not_fit_waits_with_the_reason(http, sshds):
    """2 GPUs: the instances hold 2, but one of them is down, so the job waits saying which."""
    add_instance(sshds, "gpu-a", "127.0.0.2", 1)
    add_instance(sshds, "gpu-b", "127.0.0.3", 1)
    Instance.objects.filter(name="gpu-b").update(healthy=False, health_reason="cannot reach the host")
    job_id = submit(http, gpus=2, script=upload(http), args=["--lines", "1"])
    job = wait_for(lambda: (j := Job.objects.get(pk=job_id)).reason.startswith("waiting for instances") and j,
                   timeout=60, message="the reason")
    assert job.state == State.QUEUED
    assert job.reason.startswith("waiting for instances: needs 2 GPUs, largest free block 1")
    assert job.reason.endswith("not healthy: gpu-b (cannot reach the host)")
    http.post(f"{http.base}/api/jobs/{job_id}/cancel/")


def test_jobs_racing_for_the_last_slots_never_both_get_them(sshds, celery_worker, db, image, make_user):
    """Eight admissions at once over four queued 2-GPU jobs and 2 free slots: one job gets them."""
    user = make_user("bob")
    add_instance(sshds, "gpu-a", "127.0.0.2", 2)
    with socket.socket() as sock:     # launches fail at once: this test is about admission only
        sock.bind(("127.0.0.2", 0))
        Instance.objects.update(port=sock.getsockname()[1])
    jobs = [Job.objects.create(owner=user, image=image, gpus=2, script_path="x.py", backend="instances",
                               time_limit_minutes=5, reason="waiting for the scheduler") for _ in range(4)]
    admitted, errors = admit_from_threads(8)
    assert not errors
    assert len(admitted) == 1
    allocations = list(SlotAllocation.objects.values_list("job_id", "slots"))
    assert allocations in ([(admitted[0], 2)], [])                    # [] if it already ended
    waiting = Job.objects.filter(pk__in=[j.pk for j in jobs], state=State.QUEUED)
    assert waiting.count() == 3
    # (A worker may already have failed the admitted job's launch and marked the instance down.)
    assert all(j.reason.startswith(("waiting for instances: needs 2 GPUs", "waiting behind")) for j in waiting)
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(cancel_requested=True)
    wait_for(lambda: Job.objects.get(pk=admitted[0]).is_terminal, timeout=60, message="the admitted launch to fail")


SHOW = """
import json, os, subprocess, sys
print("ARGV " + json.dumps(sys.argv[1:]))
print("ENV " + json.dumps({k: os.environ.get(k) for k in ("LR", "DATABASE_URL", "SECRET_KEY", "RINGMASTER_FERNET_KEYS", "RINGMASTER_JOB_ID", "FROM_SETUP", "PATH")}))
subprocess.run(["id", "-u"], stdout=subprocess.DEVNULL)       # the job's own PATH finds its own `id`
"""
# What the portal's side of a job on an instance runs (the login shell's scripts, horovodrun, the
# rank wrapper, the switch to the job's uid, cancel), by name: a job whose PATH puts a folder of
# commands with these names first must not get any of them run but by its own processes.
ROOT_SIDE_TOOLS = ("sudo", "setpriv", "bwrap", "env", "sh", "bash", "dash", "python", "python3", "horovodrun",
                   "setsid", "id", "cat", "mkdir", "mv", "chmod", "chown", "rm", "kill", "tail", "head", "awk",
                   "df", "stat", "find", "getent", "grep", "tr", "sed", "flock", "dirname", "readlink", "sleep",
                   "ssh", "timeout", "nvidia-smi", "printf", "tool")


def planted_commands(rest_of_path):
    """A folder (outside /tmp, which a job's sandbox hides) such as a user's earlier job could have
    left: a command for each of ROOT_SIDE_TOOLS, a shell startup file (ENV, BASH_ENV) and a
    sitecustomize (PYTHONPATH), each of which notes the uid that ran it in marks/<uid> and goes
    on as the real one. Returns (folder, the job's variables that point there)."""
    folder = Path(tempfile.mkdtemp(prefix="ringmaster-planted-", dir="/var/tmp"))
    folder.chmod(0o755)
    marks = folder / "marks"
    marks.mkdir()
    marks.chmod(0o1777)
    note = f'echo "$1" >> {marks}/$(/usr/bin/id -u)'
    for name in (*ROOT_SIDE_TOOLS, Path(sys.executable).name):
        tool = folder / "bin" / name
        tool.parent.mkdir(exist_ok=True)
        tool.write_text(f'#!/bin/sh\necho "${{0##*/}}" >> {marks}/$(/usr/bin/id -u)\n'
                        f'PATH={rest_of_path}; export PATH\nexec "${{0##*/}}" "$@"\n')
        tool.chmod(0o755)
    (folder / "rc").write_text(note.replace("$1", "rc") + "\n")
    (folder / "py").mkdir()
    (folder / "py" / "sitecustomize.py").write_text(
        f"import os\nwith open('{marks}/' + str(os.getuid()), 'a') as f:\n    f.write('sitecustomize\\n')\n")
    for path in folder.rglob("*"):
        path.chmod(path.stat().st_mode | 0o755)
    return folder, {"PATH": f"{folder / 'bin'}:{rest_of_path}", "ENV": str(folder / "rc"),
                    "BASH_ENV": str(folder / "rc"), "PYTHONPATH": str(folder / "py")}


def marks_by_uid(folder):
    """{uid: set of what ran as it} from planted_commands' marks."""
    return {int(path.name): set(path.read_text().split()) for path in (folder / "marks").iterdir()}


def test_user_words_reach_the_script_literally_over_ssh_secrets_do_not_and_setup_runs(sshds, monkeypatch, tmp_path):
    """...and the job's own variables reach its own processes alone: on a root instance, a PATH
    (ENV, BASH_ENV, PYTHONPATH) that leads to commands a user planted, named as what the portal
    runs there as root, gets none of them run as root; the job's processes, under its uid, use it."""
    from runners.base import JobSpec

    monkeypatch.setenv("DATABASE_URL", "postgres://secret@db/prod")
    monkeypatch.setenv("SECRET_KEY", "do-not-leak")
    words = ["$(touch pwned)", "; touch pwned2", "`id`", "a b", "'q'", '"dq"', "--x=$HOME", "*", "\\n"]
    setup = tmp_path / "env.sh"                  # the instance's setup line: sourced, may cd away
    setup.write_text("FROM_SETUP=yes; export FROM_SETUP; cd /\n")
    host = ssh_runner.Host(name="a", address="127.0.0.2", port=sshds["port"], user="root",
                           private_key=sshds["key"].read_text(), slots=2, work_dir=str(tmp_path / "work"),
                           setup=f". {setup}")
    planted, variables = planted_commands(f"{sshd.VENV_BIN}:/usr/local/bin:/usr/bin:/bin")
    spec = JobSpec(job_id=525252, gpus=2, python=sys.executable, script_name="show.py", script_content=SHOW,
                   script_path=None, args=tuple(words), env={"LR": "0.5 $(id)", **variables})
    runner = ssh_runner.SSHRunner([host], kill_grace=5)
    try:
        lines, exited = run_to_end(runner, spec)
        ran = marks_by_uid(planted)
    finally:
        shutil.rmtree(planted)
    job_uid = int((tmp_path / "work" / ".portal" / spec.name / "uid").read_text())
    assert set(ran) == {job_uid}, ran                         # nothing planted ran as root
    assert {"id", "sitecustomize"} <= ran[job_uid], ran       # the job's own processes did use them
    assert exited.code == 0, [line.text for line in lines]
    import json

    for rank in (0, 1):
        texts = [l.text for l in lines if l.rank == rank]
        argv = json.loads(next(t for t in texts if t.startswith("ARGV "))[5:])
        env = json.loads(next(t for t in texts if t.startswith("ENV "))[4:])
        assert argv == words
        assert env == {"LR": "0.5 $(id)", "DATABASE_URL": None, "SECRET_KEY": None, "RINGMASTER_FERNET_KEYS": None,
                       "RINGMASTER_JOB_ID": "525252", "FROM_SETUP": "yes", "PATH": variables["PATH"]}
    assert not list(tmp_path.rglob("pwned*"))
    assert "a" in runner.learned_host_keys                                    # trust on first use


def test_a_follower_that_cannot_reach_the_host_says_so_and_then_gives_up(sshds, tmp_path):
    """The runner's side of "no job hangs in silence": once the host's sshd is gone, the follow
    says why in a Status within TROUBLE_SAID_AFTER seconds, and ends after lost_after."""
    from runners.base import Exited, JobSpec, Output, Status
    from runners.ssh import TROUBLE_SAID_AFTER, Host, SSHRunner

    port = sshd.free_port_on(["127.0.0.5"])
    server = sshd.Sshd(tmp_path, "127.0.0.5", port, f"{sshds['key']}.pub").start()
    host = Host(name="flaky", address="127.0.0.5", port=port, user="root", private_key=sshds["key"].read_text(),
                slots=1, work_dir=str(tmp_path / "work"), network_interface="lo")
    runner = SSHRunner([host], poll_interval=0.1, connect_timeout=2, lost_after=TROUBLE_SAID_AFTER + 5)
    spec = JobSpec(job_id=990001, gpus=1, python="python", script_name="slow.py",
                   script_content="import time\nprint('started', flush=True)\ntime.sleep(600)\n", script_path=None)
    runner.launch(spec)
    events = waited(runner.follow(spec, 0))
    try:
        seen = b""
        for event in events:
            if isinstance(event, Output):
                seen += event.data
                if b"started" in seen:
                    break
        server.kill()
        began = time.monotonic()
        statuses, ended = [], None
        for event in events:
            if isinstance(event, Status):
                statuses.append((time.monotonic() - began, event.reason))
            elif isinstance(event, Exited):
                ended = (time.monotonic() - began, event)
                break
        assert statuses and statuses[0][0] < TROUBLE_SAID_AFTER + 5, statuses
        assert statuses[0][1].startswith("cannot read the job's output on flaky since "), statuses
        assert "failing the job after 15 s" in statuses[0][1]
        assert ended and ended[1].code is None and ended[1].detail.startswith("lost contact with flaky for 15 s")
    finally:
        events.close()
        server.start()
        runner.cancel(spec)
        server.stop()


def runner_on(sshds, server, tmp_path, **options):
    from runners.ssh import Host, SSHRunner

    host = Host(name="solo", address=server.address, port=server.port, user="root",
                private_key=sshds["key"].read_text(), slots=1, work_dir=str(tmp_path / "work"),
                network_interface="lo")
    return SSHRunner([host], connect_timeout=5, **options)


def script_spec(job_id, text):
    from runners.base import JobSpec

    return JobSpec(job_id=job_id, gpus=1, python="python", script_name="job.py", script_content=text,
                   script_path=None)


def test_a_line_reaches_the_follower_as_it_is_written_not_at_the_next_poll(sshds, tmp_path):
    """The follower streams output.log (one `tail -f` channel) instead of polling it: with reads
    5 s apart, each of 7 lines printed 1 s apart still arrives at once (polling: one of them at
    least 4 s late)."""
    from runners.base import Exited, Output

    port = sshd.free_port_on(["127.0.0.6"])
    server = sshd.Sshd(tmp_path, "127.0.0.6", port, f"{sshds['key']}.pub").start()
    runner = runner_on(sshds, server, tmp_path, poll_interval=5)
    spec = script_spec(990002, "import time\nfor i in range(7):\n    print(f'tick {time.time():.6f}', flush=True)\n"
                               "    time.sleep(1)\ntime.sleep(600)\n")
    runner.launch(spec)
    events = waited(runner.follow(spec, 0))
    try:
        seen, lags = b"", []
        for event in events:
            assert not isinstance(event, Exited), event
            if isinstance(event, Output):
                seen += event.data
                *complete, seen = seen.split(b"\n")
                lags += [time.time() - float(found.group(1))
                         for found in map(re.compile(rb"tick (\d+\.\d+)$").search, complete) if found]
                if len(lags) == 7:
                    break
        assert max(lags) < 1.5, f"lines arrived {', '.join(f'{lag:.2f}' for lag in lags)} s after they were printed"
    finally:
        events.close()
        runner.cancel(spec)
        server.stop()


@pytest.mark.parametrize("sftp", [True, False], ids=["sftp", "exec-only"])
def test_a_host_whose_tail_cannot_follow_a_process_is_read_by_polling(sshds, tmp_path, sftp):
    """busybox's or BSD's tail has no --pid: the follower polls (SFTP, or exec where the server
    has none) and still reads every line and the exit code, from a byte offset too."""
    from runners.base import Exited, Output

    commands = tmp_path / "bin"
    commands.mkdir()
    tried = tmp_path / "tail-tried-to-follow"
    (commands / "tail").write_text(f'#!/bin/sh\ncase "$*" in *--pid*) : > {tried}; '
                                   'echo "tail: unrecognized option: pid" >&2; exit 1;; esac\n'
                                   'exec /usr/bin/tail "$@"\n')
    (commands / "tail").chmod(0o755)
    port = sshd.free_port_on(["127.0.0.7"])
    server = sshd.Sshd(tmp_path, "127.0.0.7", port, f"{sshds['key']}.pub", sftp=sftp, path_first=commands).start()
    runner = runner_on(sshds, server, tmp_path, poll_interval=0.1)
    spec = script_spec(990003, "import sys, time\nfor i in range(30):\n    print(f'line={i}', flush=True)\n"
                               "    time.sleep(0.02)\nsys.exit(3)\n")
    try:
        runner.launch(spec)
        seen, ended = b"", None
        for event in waited(runner.follow(spec, 0)):
            if isinstance(event, Output):
                assert event.offset == len(seen)
                seen += event.data
            elif isinstance(event, Exited):
                ended = event
                break
        assert tried.exists(), "the follower did not try to stream first"
        assert re.findall(rb"line=(\d+)", seen) == [str(i).encode() for i in range(30)]
        assert ended.code == 1                       # horovodrun's exit code for a failed rank
        again = b"".join(event.data for event in waited(runner.follow(spec, 100)) if isinstance(event, Output))
        assert again == seen[100:]                   # a new follower resumes at its byte offset
    finally:
        runner.cancel(spec)
        server.stop()
