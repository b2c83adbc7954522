"""A job on the portal's own machine can read nothing of the portal: it runs in a bubblewrap
sandbox (runners.sandbox) through the real worker, as a user of its own, and a script that looks
for the portal's secrets the way an attacker would (every process's environment in /proc, the
data folder, the secret key and database files, other jobs' folders, /etc/shadow, the machine's
SSH host keys) finds none of them.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from django.conf import settings

from jobs.models import LogLine, State
from runners.base import Exited, JobSpec, waited
from runners.local import LocalRunner
from runners.sandbox import find
from tests.conftest import job_name, run_to_end, wait_for
from tests.integration.test_instances import add_instance, sshds  # noqa: F401 (the sshd fixture)
from tests.integration.test_job_lifecycle import upload, wait_state

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
ENDED = {State.SUCCEEDED, State.FAILED, State.CANCELLED}

LOOK = b"""
import glob, json, os, sys
found, read = [], []
for path in glob.glob("/proc/[0-9]*/environ"):
    try:
        data = open(path, "rb").read()
    except OSError:
        continue
    read.append(path)
    for word in (b"SECRET_KEY=", b"DATABASE_URL=", b"REDIS_URL=", b"RINGMASTER_FERNET_KEYS=", b"CANARY"):
        if word in data:
            found.append(f"{path} has {word.decode()}")
for path in sys.argv[1:]:
    if os.path.isdir(path):
        if os.listdir(path):
            found.append(f"listed {path}: {sorted(os.listdir(path))[:5]}")
    else:
        try:
            with open(path, "rb") as handle:
                found.append(f"read {path}: {handle.read(40)!r}")
        except OSError:
            pass
# What the job may see: its own folder, the machine's system files, a /tmp of its own.
own = sorted(os.listdir("."))
open("/tmp/scratch", "w").write("mine")
print("LOOKED " + json.dumps({"found": found, "environs": len(read), "own": own, "uid": os.getuid(),
                              "own_mode": oct(os.stat(".").st_mode & 0o777), "own_uid": os.stat(".").st_uid,
                              "passwd": os.path.exists("/etc/passwd"), "pids": len(glob.glob("/proc/[0-9]*"))}),
      flush=True)
"""


def host_keys():
    """The machine's SSH host keys (root's, mode 0600): a job runs in the machine's own /etc."""
    keys = [str(path) for path in Path("/etc/ssh").glob("ssh_host_*_key")]
    assert keys, "openssh-server makes host keys (tests/services.sh installs it)"
    return keys


@pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                    reason="needs bubblewrap (apt-get install bubblewrap), and root to run jobs as their own users")
def test_a_local_job_finds_none_of_the_portals_secrets(http, service_env, tmp_path):
    data_dir = Path(service_env["RINGMASTER_DATA_DIR"])
    canaries = {name: data_dir / name for name in ("secret_key", "ringmaster.sqlite3", "fernet_keys")}
    for path in canaries.values():
        if not path.exists():
            path.write_text("CANARY portal secret\n")
    other_job = Path(settings.RINGMASTER_JOBS_DIR) / job_name(999999)       # another job's folder
    other_job.mkdir(parents=True, exist_ok=True)
    (other_job / "train.py").write_text("CANARY another user's script\n")
    targets = [*map(str, canaries.values()), str(data_dir), str(other_job), str(other_job / "train.py"),
               str(settings.RINGMASTER_JOBS_DIR), "/etc/shadow", "/etc/gshadow",
               str(Path.home() / ".ssh"), str(Path.home() / ".config"), *host_keys()]

    Path("/tmp/scratch").unlink(missing_ok=True)                            # what the job writes to its /tmp
    response = http.post(f"{http.base}/api/jobs/", json={
        "image": "horovod-cpu", "gpus": 2, "script": upload(http, LOOK, "look.py"), "args": targets})
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    job = wait_state(job_id, ENDED, timeout=120)
    lines = [line.text for line in LogLine.objects.filter(job_id=job_id).order_by("seq")]
    assert job.state == State.SUCCEEDED, "\n".join([job.reason, *lines[-20:]])   # whole, not cut short

    looked = [json.loads(text.split("LOOKED ", 1)[1]) for text in lines if "LOOKED " in text]
    assert len(looked) == 2, lines                                           # both ranks looked
    # The jobs folder shows the job its own folder, and nothing else.
    own_folder = f"listed {settings.RINGMASTER_JOBS_DIR}: [{job_name(job_id)!r}]"
    for seen in looked:
        assert [found for found in seen["found"] if found != own_folder] == []
        # It did look: it read the environments it could (its own ranks'), and it saw its own
        # folder and the machine's system files.
        assert seen["environs"] >= 2 and seen["pids"] < 20
        assert "look.py" in seen["own"] and seen["passwd"] is True
        # As a user of its own, not root, that owns its folder, which nobody else may open.
        assert seen["uid"] != 0 and seen["own_uid"] == seen["uid"] and seen["own_mode"] == "0o700"
    assert looked[0]["uid"] == looked[1]["uid"]                           # ranks of one job: one user
    assert not Path("/tmp/scratch").exists()                                # its /tmp was its own
    shutil.rmtree(other_job)


LEFT_ON_THE_INSTANCE = b"""
import json, os
found = []
for name, value in os.environ.items():
    for secret in ("SECRET_KEY", "DATABASE_URL", "REDIS_URL", "RINGMASTER_FERNET_KEYS"):
        if name == secret:
            found.append(f"environment has {name}")
for name in os.listdir("."):
    if os.path.isfile(name):
        data = open(name, "rb").read()
        if b"PRIVATE" + b" KEY-----" in data:             # split: this file must not match itself
            found.append(f"{name} holds a private key")
print("LEFT " + json.dumps({"found": found, "files": sorted(os.listdir("."))}), flush=True)
"""


def test_a_job_on_an_instance_gets_none_of_the_portals_secrets(http, sshds, settings):  # noqa: F811
    """The instances here are this machine (loopback sshd), so what the portal sends is what is
    checked: the job's environment and its folder on the instance hold no portal secret and no
    private key (the instance's key stays encrypted in the portal's database)."""
    add_instance(sshds, "gpu-a", "127.0.0.2", 2)
    response = http.post(f"{http.base}/api/jobs/", json={
        "image": "horovod-cpu", "gpus": 2, "backend": "instances",
        "script": upload(http, LEFT_ON_THE_INSTANCE, "left.py")})
    assert response.status_code == 201, response.text
    job = wait_state(response.json()["id"], ENDED, timeout=120)
    lines = [line.text for line in LogLine.objects.filter(job_id=job.pk).order_by("seq")]
    assert job.state == State.SUCCEEDED, (job.reason, lines[-20:])
    left = [json.loads(text.split("LEFT ", 1)[1]) for text in lines if "LEFT " in text]
    assert len(left) == 2 and all(seen["found"] == [] for seen in left), left
    assert "left.py" in left[0]["files"]


WRITES = """
import os, time
open("results.txt", "w").write("first user's results")
print("WROTE", flush=True)
while not os.path.exists("go"):
    time.sleep(0.05)
"""
READS = """
import os, sys
for path in sys.argv[1:]:
    try:
        print("READ", open(path).read(), flush=True)
    except OSError as exc:
        print("REFUSED", type(exc).__name__, flush=True)
"""


@pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                    reason="needs bubblewrap (apt-get install bubblewrap), and root to run jobs as their own users")
def test_a_job_cannot_read_what_another_running_job_wrote_in_its_folder(tmp_path):
    """Two jobs of the local runner side by side: the second looks for the first one's file by
    its path, directly and through /proc (the first job's processes, its working directory)."""
    runner = LocalRunner(tmp_path / "jobs", sandbox=find("bwrap", (str(tmp_path / "jobs"),), str(Path.home())))
    first = JobSpec(job_id=1, gpus=1, python=sys.executable, script_name="w.py", script_content=WRITES, script_path=None)
    runner.launch(first)
    written = runner.job_dir(first) / "results.txt"
    try:
        wait_for(written.exists, timeout=60, message="the first job to write its file")
        owner = os.stat(runner.job_dir(first))
        second = JobSpec(job_id=2, gpus=1, python=sys.executable, script_name="r.py", script_content=READS,
                         script_path=None, args=(str(written), "/proc/1/cwd/results.txt"))
        lines, exited = run_to_end(runner, second)
        assert exited.code == 0
        said = [line.text for line in lines]
        assert len(said) == 2 and all(text.startswith("REFUSED ") for text in said), said
        assert os.stat(runner.job_dir(second)).st_uid not in (0, owner.st_uid)
    finally:
        (runner.job_dir(first) / "go").touch()
    assert [e.code for e in waited(runner.follow(first, 0)) if isinstance(e, Exited)] == [0]


WRAPPER = """#!/bin/sh
name=$(/usr/bin/basename "$0")
echo "WRAPPER $(/usr/bin/id -u) $name" >&2
for d in /usr/sbin /usr/bin /sbin /bin; do [ -x "$d/$name" ] && exec "$d/$name" "$@"; done
exit 0
"""
PRELOAD = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void said(void) { fprintf(stderr, "PRELOADED %d\n", (int) getuid()); }
"""
# The job runs a tool of its own by name (its PATH reaches it), and says who it is.
RUNS_ITS_TOOL = """
import os, subprocess
subprocess.run(["hello"], check=True)
print("JOB", os.getuid(), flush=True)
"""


@pytest.mark.skipif(shutil.which("bwrap") is None or shutil.which("pasta") is None or os.geteuid() != 0
                    or shutil.which("cc") is None,
                    reason="needs root, bubblewrap, pasta (apt-get install bubblewrap passt) and a C compiler")
def test_the_users_environment_reaches_only_the_jobs_own_processes(tmp_path):
    """The attack of a job that left wrappers of the tools the portal runs as root (ip and nsenter
    for an outbound network, setpriv, bwrap, env, sh, ...) in a folder, and a second job that puts
    that folder first on its PATH, with an LD_PRELOAD library and a PYTHONPATH sitecustomize: every
    one of them runs only as the job's own user, inside its sandbox; none as root."""
    tools = Path(tempfile.mkdtemp(dir="/var/tmp"))         # a folder the sandbox shows (not /tmp)
    try:
        tools.chmod(0o755)
        for name in ("ip", "nsenter", "setpriv", "bwrap", "pasta", "env", "sh", "bash", "python3", "kill", "hello"):
            (tools / name).write_text(WRAPPER)
            (tools / name).chmod(0o755)
        (tools / "preload.c").write_text(PRELOAD)
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tools / "preload.so"), str(tools / "preload.c")], check=True)
        (tools / "sitecustomize.py").write_text("import os, sys\nprint('SITE', os.getuid(), file=sys.stderr, flush=True)\n")
        runner = LocalRunner(tmp_path / "jobs", sandbox=find("bwrap", (str(tmp_path / "jobs"),), str(Path.home()),
                                                             "outbound"))
        spec = JobSpec(job_id=5800, gpus=1, python=sys.executable, script_name="t.py", script_content=RUNS_ITS_TOOL,
                       script_path=None, env={"PATH": f"{tools}:/usr/bin:/bin", "LD_PRELOAD": str(tools / "preload.so"),
                                              "PYTHONPATH": str(tools)})
        lines, exited = run_to_end(runner, spec)
    finally:
        shutil.rmtree(tools)
    said = [line.text.split() for line in lines]
    assert exited.code == 0, [line.text for line in lines][-20:]
    job_uid = {int(words[1]) for words in said if words[:1] == ["JOB"]}
    assert len(job_uid) == 1 and 0 not in job_uid
    ran = {(words[0], int(words[1])) for words in said if words[:1] in (["WRAPPER"], ["PRELOADED"], ["SITE"])}
    # The job's own processes got all three, as the job ...
    assert {kind for kind, _ in ran} == {"WRAPPER", "PRELOADED", "SITE"}, said
    # ... and nothing else did.
    assert {uid for _, uid in ran} == job_uid, sorted(ran)
