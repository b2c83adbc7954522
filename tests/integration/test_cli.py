"""The installed `ringmaster` command against a real uvicorn, Celery worker and horovodrun:
submit, follow (also across a web server restart), list, cancel, and its errors."""
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from jobs.domain import tokens
from jobs.models import Job, LogLine, MetricPoint, NotificationTarget, Script, State
from tests.conftest import ROOT, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

RINGMASTER = Path(sys.executable).parent / "ringmaster"
ENDED = {State.SUCCEEDED, State.FAILED, State.CANCELLED}

# Each rank prints numbered lines and reports a metric every 10 of them; its rank is horovodrun's
# (the CLI is under test, not Horovod: no torch import, about 2 CPU-seconds a rank).
TRAIN = '''import argparse
import os
import time

import ringmaster_metrics

parser = argparse.ArgumentParser()
parser.add_argument("--lines", type=int, default=20)
parser.add_argument("--interval", type=float, default=0.0)
args = parser.parse_args()
rank = int(os.environ["HOROVOD_RANK"])
for i in range(args.lines):
    print(f"rank={rank} line={i}", flush=True)
    if i % 10 == 0:
        ringmaster_metrics.log(step=i, loss=1.0 / (i + 1))
    time.sleep(args.interval)
print(f"rank={rank} done", flush=True)
'''


@pytest.fixture
def train_py(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    return path


def cli_env(url, user, tmp_path):
    """Only what the command needs: no database URL, no secrets of the portal, no config file.
    PYTHONPATH: the installed entry point runs this checkout's code, even where the environment's
    editable install points at another checkout sharing it."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "PYTHONPATH": str(ROOT),
            "RINGMASTER_URL": url, "RINGMASTER_TOKEN": tokens.issue(user).key}


@pytest.fixture
def env(live_portal, celery_worker, image, alice, tmp_path):
    return cli_env(live_portal, alice, tmp_path)


def ringmaster(env, *argv, timeout=180):
    return subprocess.run([str(RINGMASTER), *map(str, argv)], env=env, capture_output=True, text=True,
                          timeout=timeout)


class Background:
    """`ringmaster ...` running in the background; its output is collected line by line."""

    def __init__(self, env, *argv):
        self.process = subprocess.Popen([str(RINGMASTER), *map(str, argv)], env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.out, self.err = [], []
        self.readers = [threading.Thread(target=self._read, args=(stream, lines), daemon=True)
                        for stream, lines in ((self.process.stdout, self.out), (self.process.stderr, self.err))]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _read(stream, lines):
        for line in stream:
            lines.append(line.rstrip("\n"))

    def wait(self, timeout=180):
        try:
            code = self.process.wait(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
        for reader in self.readers:
            reader.join(timeout=10)
        return code


def submit(env, script, *args, gpus=2, name="cli test"):
    result = ringmaster(env, "submit", "-q", "--image", "horovod-cpu", "--gpus", gpus, "--name", name,
                        script, "--", *args)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.strip())


def expected_output(job_id):
    """Every stored line of the job, in seq order, as the README says the command prints it:
    `[rank] text`, `[rank stderr] text`, `[launcher] text` (written here, not by its formatter)."""
    printed = []
    for line in LogLine.objects.filter(job_id=job_id).order_by("seq"):
        who = "launcher" if line.rank is None else str(line.rank)
        printed.append(f"[{who}] {line.text}" if line.stream == "stdout" else f"[{who} {line.stream}] {line.text}")
    return printed


def numbered(lines, rank):
    return [int(m[1]) for line in lines if (m := re.fullmatch(rf"\[{rank}\] rank={rank} line=(\d+)", line))]


def test_submit_follow_ls_and_logs_of_a_two_rank_job(env, train_py):
    follow = Background(env, "submit", "--image", "horovod-cpu", "--gpus", "2", "--name", "cli hello",
                        "--env", "GREETING=hi", "-f", train_py, "--", "--lines", "30", "--interval", "0.02")
    assert follow.wait() == 0, follow.err
    submitted = re.fullmatch(r"job (\d+) submitted \(QUEUED\): (http://\S+/jobs/\1/)", follow.out[0])
    assert submitted, follow.out[:3]
    job_id = int(submitted[1])
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.name, job.env, job.args) == (State.SUCCEEDED, "cli hello", {"GREETING": "hi"},
                                                        ["--lines", "30", "--interval", "0.02"])
    assert follow.err[-1] == f"ringmaster: job {job_id} SUCCEEDED"

    lines = expected_output(job_id)
    assert follow.out[1:] == lines                                   # every line once, in seq order
    for rank in (0, 1):
        assert numbered(lines, rank) == list(range(30)) and f"[{rank}] rank={rank} done" in lines

    points = MetricPoint.objects.filter(job_id=job_id, name="loss")
    assert sorted((p.rank, p.step) for p in points) == [(r, s) for r in (0, 1) for s in (0, 10, 20)]

    again = ringmaster(env, "logs", "-f", job_id)                   # an ended job: replay, then exit
    assert again.returncode == 0 and again.stdout.splitlines() == lines
    stored = ringmaster(env, "logs", job_id)
    assert stored.returncode == 0 and stored.stdout.splitlines() == lines
    rank1 = ringmaster(env, "logs", job_id, "--rank", "1")
    assert rank1.stdout.splitlines() == [line for line in lines if line.startswith(("[1] ", "[1 stderr] "))]

    listed = ringmaster(env, "ls")
    assert listed.returncode == 0
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["ID", "NAME", "STATE", "GPUS", "BACKEND", "CREATED", "TAGS", "REASON"]
    row = next(r for r in rows if r.split()[0] == str(job_id))
    assert row.split()[1:6] == ["cli", "hello", "SUCCEEDED", "2", "local"]
    assert env["RINGMASTER_TOKEN"] not in follow.out + follow.err + [listed.stdout, listed.stderr]


def test_cancel_a_running_job_and_a_follower_sees_it_end(env, train_py):
    job_id = submit(env, train_py, "--lines", "100000", "--interval", "0.05")
    follow = Background(env, "logs", "-f", job_id)
    wait_for(lambda: numbered(follow.out, 1), timeout=120, message="rank 1's lines to be printed")

    cancelled = ringmaster(env, "cancel", job_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.strip() == f"job {job_id}: cancel requested; its processes are being stopped"

    assert follow.wait(timeout=120) == 1
    assert f"ringmaster: job {job_id} RUNNING" in follow.err
    assert follow.err[-1].startswith(f"ringmaster: job {job_id} CANCELLED")
    assert Job.objects.get(pk=job_id).state == State.CANCELLED
    assert follow.out == expected_output(job_id)

    again = ringmaster(env, "cancel", job_id)
    assert again.returncode == 1
    assert again.stderr.strip() == f"ringmaster: job {job_id} has already ended (cancelled)"


def test_another_users_job_is_not_found(env, image, make_user):
    bob = make_user("bob")
    script = Script.objects.create(owner=bob, name="b.py", sha256="0" * 64, size=1, content="x")
    theirs = Job.objects.create(owner=bob, image=image, gpus=1, script=script, time_limit_minutes=5,
                                state=State.CANCELLED)
    for job_id in (theirs.pk, 999999):
        for argv in (["logs", job_id], ["logs", "-f", job_id], ["cancel", job_id], ["tag", job_id, "--add", "x"],
                     ["note", job_id, "x"], ["note", job_id]):
            result = ringmaster(env, *argv)
            assert (result.returncode, result.stdout) == (1, ""), argv
            assert result.stderr.strip() == f"ringmaster: job {job_id} not found", argv
    assert str(theirs.pk) not in [line.split()[0] for line in ringmaster(env, "ls").stdout.splitlines()]


def test_tags_and_notes_set_at_submit_changed_and_filtered_by(env, train_py, image, alice):
    tagged = ringmaster(env, "submit", "-q", "--image", "horovod-cpu", "--gpus", "1", "--tag", "resnet",
                        "--tag", "lr  sweep", "--note", "baseline run", train_py, "--", "--lines", "1")
    assert tagged.returncode == 0, tagged.stderr
    job_id = int(tagged.stdout)
    job = Job.objects.get(pk=job_id)
    assert (job.tags, job.note) == (["resnet", "lr sweep"], "baseline run")
    other = Job.objects.create(owner=alice, image=image, gpus=1, script_path="t.py", time_limit_minutes=5,
                               state=State.CANCELLED, tags=["resnet"])

    def listed(*tags):
        result = ringmaster(env, "ls", *[arg for tag in tags for arg in ("--tag", tag)])
        assert result.returncode == 0, result.stderr
        return [int(line.split()[0]) for line in result.stdout.splitlines()[1:]]

    assert listed("resnet") == [other.pk, job_id]
    assert listed("resnet", "lr sweep") == [job_id]
    changed = ringmaster(env, "tag", other.pk, "--add", "best", "--add", "lr sweep", "--remove", "resnet")
    assert (changed.returncode, changed.stdout.splitlines()) == (0, ["best", "lr sweep"])
    assert listed("lr sweep") == [other.pk, job_id] and listed("resnet") == [job_id]
    assert ringmaster(env, "note", other.pk, "diverged at step 900").returncode == 0
    assert ringmaster(env, "note", other.pk).stdout == "diverged at step 900\n"
    assert Job.objects.get(pk=other.pk).note == "diverged at step 900"
    bad = ringmaster(env, "tag", other.pk, "--add", "x" * 65)
    assert bad.returncode == 2 and bad.stderr.startswith("ringmaster: tags: A tag is at most 64 characters")
    assert Job.objects.get(pk=other.pk).tags == ["best", "lr sweep"]


def test_bad_input_prints_the_field_errors_and_exits_2(env, train_py):
    before = Job.objects.count()
    zero = ringmaster(env, "submit", "--image", "horovod-cpu", "--gpus", "0", train_py)
    assert zero.returncode == 2
    assert zero.stderr.strip() == "ringmaster: gpus: Ensure this value is greater than or equal to 1."
    many = ringmaster(env, "submit", "--image", "no-such-image", "--gpus", "100", train_py)
    assert many.returncode == 2
    errors = many.stderr.splitlines()
    assert "ringmaster: gpus: This machine runs at most 4 processes per job." in errors
    assert any(line.startswith("ringmaster: image: No enabled image 'no-such-image'") for line in errors)
    stranger = ringmaster(env, "submit", "--image", "horovod-cpu", "--gpus", "1", "--group", "not-mine", train_py)
    assert stranger.returncode == 2 and stranger.stderr.startswith("ringmaster: group: ")
    nowhere = ringmaster(env, "submit", "--image", "horovod-cpu", "--gpus", "1", "--backend", "kubernetes",
                         "--cluster", "nowhere", train_py)
    assert nowhere.returncode == 2
    assert nowhere.stderr.strip() == ("ringmaster: backend: No Kubernetes cluster is registered (or enabled): an "
                                      "admin adds one with manage.py add_cluster, or in the admin under Clusters.")
    typo = ringmaster(env, "submit", "--image", "horovod-cpu", "--gpus", "1", "--backend", "kubernetes",
                      "--clustr", "gpu-a", train_py)
    assert typo.returncode == 2
    assert typo.stderr.startswith("ringmaster: --clustr: the kubernetes backend has no such option (its options: "
                                  "--cluster; `ringmaster backends` lists every backend's")
    listed = ringmaster(env, "backends")
    assert listed.returncode == 0
    assert "kubernetes: Kubernetes (unavailable: No Kubernetes cluster is registered" in listed.stdout
    assert "  --cluster VALUE  Kubernetes backend: the cluster (name); empty: the only one there is." in listed.stdout
    model = ringmaster(env, "submit", "--image", "horovod-cpu", "--gpus", "1", "--gpu-model", "A100", train_py)
    assert model.returncode == 2
    assert model.stderr.strip() == ("ringmaster: gpu_model: No GPU is a A100 on This machine; "
                                    "the models there are: no GPU nvidia-smi could see.")
    elastic = ringmaster(env, "submit", "--image", "horovod-cpu", "--gpus", "2", "--max-gpus", "1", train_py)
    assert elastic.returncode == 2
    assert elastic.stderr.strip() == "ringmaster: max_gpus: Most GPUs must be at least GPUs (2)."
    assert Job.objects.count() == before


def test_notifications_are_managed_from_the_command_line(env, alice):
    refused = ringmaster(env, "notifications", "add", "--kind", "webhook", "https://10.1.2.3/hook")
    assert refused.returncode == 2 and refused.stderr.startswith("ringmaster: address: ") and "private" in refused.stderr
    added = subprocess.run([str(RINGMASTER), "notifications", "add", "--kind", "email", "--name", "my mail", "-"],
                           input="alice@example.com\n", env=env, capture_output=True, text=True, timeout=180)
    assert added.returncode == 0, added.stderr
    target = NotificationTarget.objects.get(owner=alice)
    assert added.stdout == f"target {target.pk}: email a…@example.com\n" and target.address() == "alice@example.com"

    changed = ringmaster(env, "notifications", "set", "--on-wait", "--wait-minutes", 45, "--no-on-end")
    preferences = "notify when: a job waits long (long wait: 45 min, idle: 30 min)"
    assert (changed.returncode, changed.stdout) == (0, preferences + "\n"), changed.stderr
    listed = ringmaster(env, "notifications")
    assert listed.stdout.splitlines() == [preferences, f"{target.pk}\temail\tmy mail\ta…@example.com\tnothing sent"]

    tested = ringmaster(env, "notifications", "test", target.pk)
    assert (tested.returncode, tested.stdout) == (0, f"test message delivered to target {target.pk}\n"), tested.stderr
    log = ringmaster(env, "notifications", "log", target.pk)
    assert [line.split("\t")[1:5] for line in log.stdout.splitlines()] == [["test", "-", "delivered", "1"]]
    removed = ringmaster(env, "notifications", "remove", target.pk)
    assert (removed.returncode, removed.stdout) == (0, f"target {target.pk} removed\n")
    gone = ringmaster(env, "notifications", "test", target.pk)
    assert (gone.returncode, gone.stderr.strip()) == (1, f"ringmaster: notification target {target.pk} not found")


def test_a_refused_token_is_a_clear_error_that_does_not_echo_it(env):
    bad = dict(env, RINGMASTER_TOKEN="not-a-real-token-0123456789")
    result = ringmaster(bad, "ls")
    assert result.returncode == 2
    assert "the portal refused the token (HTTP 401)" in result.stderr and "create_api_token" in result.stderr
    assert "not-a-real-token" not in result.stdout + result.stderr


def test_logs_follow_resumes_after_the_web_server_restarts_without_losing_or_repeating(
        restartable_portal, celery_worker, image, alice, tmp_path, train_py):
    env = cli_env(restartable_portal.url, alice, tmp_path)
    job_id = submit(env, train_py, "--lines", "300", "--interval", "0.05")
    follow = Background(env, "logs", "-f", job_id)
    wait_for(lambda: len(numbered(follow.out, 0)) >= 20, timeout=120, message="the first lines to be printed")

    restartable_portal.kill(signal.SIGKILL)
    stored_while_down = LogLine.objects.filter(job_id=job_id).count()
    wait_for(lambda: LogLine.objects.filter(job_id=job_id).count() >= stored_while_down + 40, timeout=60,
             message="the job to store more lines while the web server is down")
    restartable_portal.start()

    assert follow.wait(timeout=180) == 0, follow.err
    assert any("lost the portal" in line and "reconnecting" in line for line in follow.err)
    assert "ringmaster: reconnected" in follow.err
    lines = expected_output(job_id)
    assert follow.out == lines                                       # nothing lost, nothing repeated
    for rank in (0, 1):
        assert numbered(follow.out, rank) == list(range(300))


def test_a_folder_is_submitted_as_the_snapshot_a_zip_of_its_files_gives(live_portal, image, alice, tmp_path):
    """`ringmaster submit ./dir --entry train.py`: what .gitignore matches stays behind, and the job
    runs the same snapshot (sha256) as a zip of the files that were sent, uploaded to the API."""
    import io
    import zipfile

    import requests

    env = cli_env(live_portal, alice, tmp_path)
    root = tmp_path / "my-project"
    sent = {"train.py": "import datautils\nprint(datautils.GREETING)\n", "datautils.py": "GREETING = 'hi'\n",
            "conf/settings.txt": "lr=0.1\n", ".gitignore": "*.ckpt\n"}
    for name, text in {**sent, "big.ckpt": "x" * 5000, ".git/HEAD": "ref: refs/heads/main\n"}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    result = ringmaster(env, "submit", "-q", "--image", "horovod-cpu", "--gpus", "1", root, "--entry", "./train.py",
                        "--", "--lr", "0.1")
    assert result.returncode == 0, result.stderr
    job = Job.objects.get(pk=int(result.stdout))
    assert (job.entry_point, job.args) == ("train.py", ["--lr", "0.1"])
    assert "ringmaster: left out: big.ckpt (1 file, 5.0 kB) by .gitignore" in result.stderr.splitlines()
    assert "ringmaster: left out: .git/ (1 file, 21 B) always" in result.stderr.splitlines()
    assert "ringmaster: sending 4 files, 73 B (packed: " in result.stderr

    api = requests.Session()
    api.headers["Authorization"] = f"Token {env['RINGMASTER_TOKEN']}"
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as archive:
        for name in sent:
            archive.write(root / name, f"my-project/{name}")
    uploaded = api.post(f"{live_portal}/api/projects/", files={"file": ("my-project.zip", zipped.getvalue())})
    assert uploaded.status_code == 201, uploaded.text
    shown = api.get(f"{live_portal}/api/jobs/{job.pk}/").json()["project"]
    assert shown == {"id": uploaded.json()["id"], "sha256": uploaded.json()["sha256"], "entry_point": "train.py",
                     "url": None, "commit": None}
    files = api.get(f"{live_portal}/api/jobs/{job.pk}/files/").json()
    assert sorted(file["path"] for file in files) == sorted(sent)           # neither big.ckpt nor .git/
