"""Artifacts of real jobs (issue 44, part 4): a file a job writes under RINGMASTER_OUTPUT_DIR
downloads byte for byte through the API, from this machine and from an SSH instance (brought back
over SFTP when the job ends, within the owner's storage quota), and a rerun from checkpoint hands
the new job the newest matching file in RINGMASTER_CHECKPOINT, here and on every host of a job on
instances."""
import hashlib
import os
import sys

import pytest
from django.core.management import call_command

from jobs.installation import installation_id
from jobs.models import Job, State
from runners import ssh
from runners.base import JobSpec
from tests import sshd
from tests.conftest import run_to_end, wait_for
from tests.integration.test_instances import add_instance, sshd_without_sftp, sshds  # noqa: F401  (fixtures)
from tests.integration.test_job_lifecycle import stored_lines, submit, upload, wait_state

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
ENDED = {State.SUCCEEDED, State.FAILED, State.CANCELLED}

# Writes an old and a new checkpoint and a nested file; says what RINGMASTER_CHECKPOINT holds.
WRITER = b'''
import hashlib, os, sys
out = os.environ["RINGMASTER_OUTPUT_DIR"]
given = os.environ.get("RINGMASTER_CHECKPOINT")
if given:
    print("CHECKPOINT", os.path.basename(given), hashlib.sha256(open(given, "rb").read()).hexdigest())
os.makedirs(os.path.join(out, "sub"), exist_ok=True)
with open(os.path.join(out, "sub", "epoch-1.pt"), "wb") as f:
    f.write(b"old")
os.utime(os.path.join(out, "sub", "epoch-1.pt"), (1, 1))
with open(os.path.join(out, "epoch-2.pt"), "wb") as f:
    f.write(bytes(range(256)) * 400 + sys.argv[1].encode())
print("WROTE", out)
'''


def payload(word):
    return bytes(range(256)) * 400 + word.encode()


def listed(http, job_id):
    response = http.get(f"{http.base}/api/jobs/{job_id}/artifacts/")
    assert response.status_code == 200, response.text
    return {a["name"]: a["size"] for a in response.json()}


def test_a_local_jobs_file_downloads_byte_for_byte_and_a_rerun_starts_from_its_newest_checkpoint(http):
    job_id = submit(http, gpus=1, script=upload(http, WRITER, "writer.py"), args=["first"], checkpoint_pattern="*.pt")
    job = wait_state(job_id, ENDED)
    assert job.state == State.SUCCEEDED, job.reason

    assert listed(http, job_id) == {"epoch-2.pt": len(payload("first")), "sub/epoch-1.pt": 3}
    got = http.get(f"{http.base}/api/jobs/{job_id}/artifacts/epoch-2.pt")
    assert got.status_code == 200 and got.content == payload("first")
    assert http.get(f"{http.base}/api/jobs/{job_id}/artifacts/../x").status_code in (400, 404)
    wait_for(lambda: Job.objects.get(pk=job_id).artifacts_bytes == len(payload("first")) + 3,
             message="the job's artifacts counted at its end")

    response = http.post(f"{http.base}/api/jobs/{job_id}/rerun-from-checkpoint/")
    assert response.status_code == 201, response.text
    rerun = response.json()["id"]
    assert wait_state(rerun, ENDED).state == State.SUCCEEDED
    said = [line.text for line in stored_lines(rerun) if line.text.startswith("CHECKPOINT")]
    assert said == [f"CHECKPOINT epoch-2.pt {hashlib.sha256(payload('first')).hexdigest()}"]


@pytest.mark.skipif(not sshd.available(), reason="needs Debian's openssh-server (/usr/sbin/sshd)")
def test_an_instances_file_is_brought_back_at_the_end_and_the_storage_quota_stops_a_larger_one(http, sshds):  # noqa: F811
    add_instance(sshds, "gpu-a", "127.0.0.2", 1)
    script = upload(http, WRITER, "writer.py")
    job_id = submit(http, gpus=1, script=script, args=["remote"], backend="instances")
    assert wait_state(job_id, ENDED, timeout=240).state == State.SUCCEEDED
    wait_for(lambda: Job.objects.get(pk=job_id).artifacts_bytes, message="the artifacts brought back")
    assert listed(http, job_id) == {"epoch-2.pt": len(payload("remote")), "sub/epoch-1.pt": 3}
    assert http.get(f"{http.base}/api/jobs/{job_id}/artifacts/epoch-2.pt").content == payload("remote")
    fetch = http.post(f"{http.base}/api/jobs/{job_id}/artifacts/fetch/")
    assert fetch.status_code == 202, fetch.text

    alice = Job.objects.get(pk=job_id).owner.username
    call_command("set_quota", "--user", alice, "--storage-gb", str((len(payload("remote")) + 3 + 10) / 1e9))
    over = submit(http, gpus=1, script=script, args=["again"], backend="instances")
    assert wait_state(over, ENDED, timeout=240).state == State.SUCCEEDED
    job = wait_for(lambda: Job.objects.filter(pk=over).exclude(artifacts_note="").first(),
                   message="the bring-back stopped by the quota")
    assert "storage quota" in job.artifacts_note
    assert listed(http, over) == {}
    assert job.artifacts_bytes == 0


# Rank 0 writes a checkpoint; every rank says where RINGMASTER_CHECKPOINT is on its host and the
# sha256 of what it holds.
RANK_CHECKPOINT = b"""
import hashlib, os, sys
rank = os.environ.get("HOROVOD_RANK", "0")
given = os.environ.get("RINGMASTER_CHECKPOINT")
if given:
    digest = hashlib.sha256(open(given, "rb").read()).hexdigest()
    print("CHECKPOINT", os.environ["HOROVOD_HOSTNAME"], given, digest, flush=True)
if rank == "0":
    with open(os.path.join(os.environ["RINGMASTER_OUTPUT_DIR"], "model.pt"), "wb") as f:
        f.write(bytes(range(256)) * 4000 + sys.argv[1].encode())
"""


@pytest.mark.skipif(not sshd.available(), reason="needs Debian's openssh-server (/usr/sbin/sshd)")
def test_a_rerun_from_checkpoint_on_two_instances_gives_every_rank_the_file_on_its_host(http, sshds):  # noqa: F811
    add_instance(sshds, "gpu-a", "127.0.0.2", 1)
    add_instance(sshds, "gpu-b", "127.0.0.3", 1)
    checkpoint = bytes(range(256)) * 4000 + b"epoch-9"
    job_id = submit(http, gpus=2, script=upload(http, RANK_CHECKPOINT, "ckpt.py"), args=["epoch-9"],
                    backend="instances", checkpoint_pattern="*.pt")
    job = wait_state(job_id, ENDED, timeout=240)
    assert job.state == State.SUCCEEDED, job.reason
    wait_for(lambda: Job.objects.get(pk=job_id).artifacts_bytes == len(checkpoint), message="the checkpoint brought back")

    response = http.post(f"{http.base}/api/jobs/{job_id}/rerun-from-checkpoint/")
    assert response.status_code == 201, response.text
    rerun = response.json()["id"]
    job = wait_state(rerun, ENDED, timeout=240)
    assert job.state == State.SUCCEEDED, job.reason
    said = sorted((line.rank, *line.text.split()[1:]) for line in stored_lines(rerun)
                  if line.text.startswith("CHECKPOINT"))
    sha = hashlib.sha256(checkpoint).hexdigest()
    where = os.path.realpath(sshds["work_dir"] / f"rm-{installation_id()}-{rerun}" / "checkpoint" / "model.pt")
    assert said == [(0, "127.0.0.2", where, sha), (1, "127.0.0.3", where, sha)]
    assert Job.objects.get(pk=rerun).checkpoint == "model.pt"


def checkpoint_job(job_id, source, launcher="horovod"):
    """A rerun of `source`'s model.pt: it prints the first bytes of RINGMASTER_CHECKPOINT."""
    return JobSpec(job_id=job_id, gpus=1, python=sys.executable, script_name="job.py", installation="rerun",
                   launcher=launcher,
                   script_content="import os; print(open(os.environ['RINGMASTER_CHECKPOINT'], 'rb').read()[:7])",
                   script_path=None, checkpoint=(str(source), "model.pt"))


def kept_checkpoint(tmp_path):
    source = tmp_path / "kept"
    source.mkdir()
    (source / "model.pt").write_bytes(b"weights" * 1000)
    return source


@pytest.mark.skipif(not sshd.available(), reason="needs Debian's openssh-server (/usr/sbin/sshd)")
def test_a_retried_launch_on_an_instance_sends_the_checkpoint_once(sshds, tmp_path):  # noqa: F811
    source, work = kept_checkpoint(tmp_path), tmp_path / "work"
    host = ssh.Host(name="instance-a", address="127.0.0.2", port=sshds["port"], user="root",
                    private_key=sshds["key"].read_text(), slots=1, work_dir=str(work))
    job = checkpoint_job(5, source)
    lines, exited = run_to_end(ssh.SSHRunner([host], poll_interval=0.1), job)
    assert exited.code == 0 and [line.text for line in lines] == ["b'weights'"]

    os.remove(source / "model.pt")                 # a retried launch needs it no more
    started = ssh.SSHRunner([host], poll_interval=0.1).launch(job)
    assert started.already_running, started
    assert (work / job.name / "checkpoint" / "model.pt").read_bytes() == b"weights" * 1000
    assert [name for name in os.listdir(work / ".portal" / job.name) if name.endswith(".part")] == []


@pytest.mark.skipif(not sshd.available(), reason="needs Debian's openssh-server (/usr/sbin/sshd)")
def test_a_torchrun_rerun_on_an_instance_gets_the_checkpoint(sshds, tmp_path):  # noqa: F811
    host = ssh.Host(name="instance-b", address="127.0.0.3", port=sshds["port"], user="root",
                    private_key=sshds["key"].read_text(), slots=1, work_dir=str(tmp_path / "work"))
    job = checkpoint_job(7, kept_checkpoint(tmp_path), launcher="torchrun")
    lines, exited = run_to_end(ssh.SSHRunner([host], poll_interval=0.1), job)
    assert exited.code == 0, [line.text for line in lines]
    assert [line.text for line in lines if line.rank == 0] == ["b'weights'"]


@pytest.mark.skipif(not sshd.available(), reason="needs Debian's openssh-server (/usr/sbin/sshd)")
def test_an_instance_without_sftp_gets_the_checkpoint_through_exec(sshds, sshd_without_sftp, tmp_path):  # noqa: F811
    host = ssh.Host(name="no-sftp", address="127.0.0.4", port=sshd_without_sftp.port, user="root",
                    private_key=sshds["key"].read_text(), slots=1, work_dir=str(tmp_path / "work"))
    lines, exited = run_to_end(ssh.SSHRunner([host], poll_interval=0.1), checkpoint_job(6, kept_checkpoint(tmp_path)))
    assert exited.code == 0 and [line.text for line in lines] == ["b'weights'"]


TB_WRITER = b'''
import os, time
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter
writer = EventFileWriter(os.path.join(os.environ["RINGMASTER_OUTPUT_DIR"], "runs"))
for step in range(4):
    writer.add_event(Event(wall_time=time.time(), step=step,
                           summary=Summary(value=[Summary.Value(tag="train/loss", simple_value=1.0 / (step + 1))])))
writer.close()
print("RINGMASTER_METRIC {\\"step\\": 0, \\"printed\\": 1}")
'''


def test_a_jobs_tensorboard_scalars_reach_the_metrics_endpoint_beside_its_printed_metrics(http):
    job_id = submit(http, gpus=1, script=upload(http, TB_WRITER, "tb.py"))
    assert wait_state(job_id, ENDED).state == State.SUCCEEDED

    def series():
        found = http.get(f"{http.base}/api/jobs/{job_id}/metrics/").json()["series"]
        return found if "train/loss" in found else None
    found = wait_for(series, message="the job's TensorBoard scalars")
    assert [(p["step"], round(p["value"], 3)) for p in found["train/loss"]] == [(0, 1.0), (1, 0.5), (2, 0.333), (3, 0.25)]
    assert [p["value"] for p in found["printed"]] == [1]


def test_an_open_job_page_gets_the_scalars_a_job_wrote_at_its_very_end_before_it_ends(http):
    """The page stops listening when the job ends; what the event files gained since the last
    look is stored and pushed before the end is (no beat runs here: only the end's look sees it)."""
    import asyncio
    import json

    from websockets.asyncio.client import connect

    job_id = submit(http, gpus=1, script=upload(http, TB_WRITER, "tb.py"))
    url = http.base.replace("http://", "ws://") + f"/ws/jobs/{job_id}/?since=-1&tb_since=0"

    async def until_the_end():
        seen = []
        async with connect(url, additional_headers={"Authorization": http.headers["Authorization"]}) as ws:
            async with asyncio.timeout(60):
                while not any(m["type"] == "state" and m["state"] in ENDED for m in seen):
                    seen.append(json.loads(await ws.recv()))
        return seen

    seen = asyncio.run(until_the_end())
    points = [(p["name"], p["step"]) for m in seen if m["type"] == "metrics" for p in m["points"] if p["seq"] == -1]
    assert points == [("train/loss", step) for step in range(4)]
    assert seen[-1]["state"] == State.SUCCEEDED
