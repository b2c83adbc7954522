"""A job that recovers by itself (jobs.domain.recovery), with real parts: its first attempt
saves a checkpoint and exits 3, which its policy restarts; the real worker queues it again, the
scheduler admits it after the backoff, and its second attempt, launched anew in the job's
folder, resumes from the checkpoint in RINGMASTER_CHECKPOINT and succeeds. One job throughout."""
import pytest
from django.test import Client

from jobs.models import Job, LogLine, State
from tests.integration.test_job_lifecycle import submit, upload, wait_state

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

RESUMING = b'''
import os, sys
checkpoint = os.environ.get("RINGMASTER_CHECKPOINT")
if checkpoint:
    step = int(open(checkpoint).read())
    print(f"resumed at step {step}", flush=True)
    print(f"step {step + 1}", flush=True)
    sys.exit(0)
with open(os.path.join(os.environ["RINGMASTER_OUTPUT_DIR"], "state.ckpt"), "w") as saved:
    saved.write("5")
print("saved step 5", flush=True)
sys.exit(3)
'''


def test_a_failed_attempt_restarts_from_its_checkpoint_and_the_job_succeeds(http):
    job_id = submit(http, gpus=1, script=upload(http, RESUMING, "resuming.py"), checkpoint_pattern="*.ckpt",
                    max_restarts=1, restart_on_exit_codes=[3])

    job = wait_state(job_id, {State.SUCCEEDED, State.FAILED, State.CANCELLED})
    assert job.state == State.SUCCEEDED, job.reason
    body = http.get(f"{http.base}/api/jobs/{job_id}/").json()
    first, second = body["attempts"]
    assert (first["number"], first["exit_code"], second["number"], second["exit_code"]) == (1, 3, 2, 0)
    assert first["started"] and first["ended"] and second["started"] and second["ended"]
    assert first["ended"] <= second["started"]
    assert (body["attempt"], body["restarts_left"], body["checkpoint"]) == (2, 0, "state.ckpt")
    assert any(event["message"].startswith("attempt 1 ended (exit code 3") and "0 of 1 restart left" in
               event["message"] for event in body["events"])
    assert [e["state"] for e in body["events"] if e["state"]] == [
        "QUEUED", "LAUNCHING", "RUNNING", "QUEUED", "LAUNCHING", "RUNNING", "SUCCEEDED"]

    # Both attempts' lines are kept, in one gap-free log; the second's start at its first_seq.
    lines = list(LogLine.objects.filter(job_id=job_id).order_by("seq").values_list("seq", "text"))
    assert [seq for seq, _ in lines] == list(range(len(lines)))
    texts = [text for _, text in lines]
    assert texts.count("saved step 5") == 1 and texts.count("resumed at step 5") == 1
    assert texts.index("saved step 5") < second["first_seq"] <= texts.index("resumed at step 5")
    assert "step 6" in texts
    logs = f"{http.base}/api/jobs/{job_id}/logs/"
    by_attempt = {number: [line["text"] for line in http.get(logs, params={"attempt": number}).json()["lines"]]
                  for number in (1, 2)}
    assert "saved step 5" in by_attempt[1] and "resumed at step 5" not in by_attempt[1]
    assert "resumed at step 5" in by_attempt[2] and "saved step 5" not in by_attempt[2]
    refused = http.get(logs, params={"attempt": 3})
    assert refused.status_code == 400 and "no attempt 3" in refused.json()["attempt"][0]

    client = Client()
    client.force_login(Job.objects.get(pk=job_id).owner)
    page = client.get(f"/jobs/{job_id}/").content.decode()
    assert 'id="attempts-card"' in page and "0 of 1 restart left" in page
    assert Job.objects.get(pk=job_id).gpu_seconds == pytest.approx(first["gpu_seconds"] + second["gpu_seconds"])
