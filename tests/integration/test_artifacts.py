"""Artifacts of real jobs (issue 44, part 4): a file a job writes under RINGMASTER_OUTPUT_DIR
downloads byte for byte through the API, from this machine and from an SSH instance (brought back
over SFTP when the job ends, within the owner's storage quota), and a rerun from checkpoint hands
the new job the newest matching file in RINGMASTER_CHECKPOINT."""
import hashlib

import pytest
from django.core.management import call_command

from jobs.models import Job, State
from tests import sshd
from tests.conftest import wait_for
from tests.integration.test_instances import add_instance, sshds  # noqa: F401  (the fixture)
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
