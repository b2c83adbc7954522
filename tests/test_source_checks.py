"""Checks before GPUs are spent (issue #60): a job's Python is compiled at submit, and a file that
does not compile is a 400 naming the file and the line; a script written for the other launcher
is a warning at submit, and a job whose ranks then make a world that is not its size fails with
a plain reason instead of ending well with each rank trained alone."""
import io
import shutil
import sys
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.utils import timezone

from jobs.domain import failure
from jobs.models import Job, LogLine
from runners.base import JobSpec
from runners.local import LocalRunner
from runners.sandbox import find
from tests.conftest import run_to_end
from tests.test_projects import PROJECT, upload, zip_of

HOROVOD_SCRIPT = "import horovod.torch as hvd\n\nhvd.init()\nprint('rank', hvd.rank(), 'of', hvd.size())\n"
TORCHRUN_SCRIPT = "import torch.distributed as dist\n\ndist.init_process_group('gloo')\n"
PLAIN = ("this job has 2 ranks but hvd.init() saw a world of 1: a Horovod script under torchrun? "
         "Pick the Horovod launcher.")


@pytest.fixture
def client(api_client, alice):
    return api_client(alice)


@pytest.fixture
def both(image):
    """The test image, carrying both launchers."""
    image.launchers = "horovod,torchrun"
    image.save()
    return image


def script_id(client, text, name="train.py"):
    handle = io.BytesIO(text.encode())
    handle.name = name
    response = client.post("/api/scripts/", {"file": handle}, format="multipart")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def submit(client, **fields):
    return client.post("/api/jobs/", {"image": "horovod-cpu", "gpus": 2, **fields}, format="json")


# --- syntax errors: a 400 naming the file and the line ----------------------------------------

@pytest.mark.django_db
def test_a_project_module_that_does_not_compile_is_400_on_entry_point_naming_file_and_line(client, image):
    broken = dict(PROJECT, **{"src/model.py": "import os\n\ndef forward(x:\n    return x\n",
                              "src/__init__.py": "", "tools/old.py": "print 'py2'\n"})
    project = upload(client, zip_of(broken)).json()["id"]
    response = submit(client, project=project, entry_point="train.py")
    assert response.status_code == 400
    assert response.json() == {"entry_point": [
        "src/model.py, line 3: '(' was never closed",
        "tools/old.py, line 1: Missing parentheses in call to 'print'. Did you mean print(...)?"]}
    assert Job.objects.count() == 0
    fixed = upload(client, zip_of(dict(PROJECT, **{"src/model.py": "pattern = '\\d+'\n"}))).json()["id"]
    assert submit(client, project=fixed, entry_point="train.py").status_code == 201    # a SyntaxWarning only


@pytest.mark.django_db
def test_a_script_that_does_not_compile_is_400_on_the_field_that_gave_it(client, alice, image):
    bad = script_id(client, "import torch\n\nfor i in range(3)\n    print(i)\n", "bad.py")
    response = submit(client, script=bad)
    assert response.status_code == 400
    assert response.json() == {"script": ["bad.py, line 3: expected ':'"]}
    browser = Client()
    browser.force_login(alice)
    page = browser.post("/jobs/new/", {"image": image.pk, "gpus": 1, "backend": "local",
                                       "script_file": SimpleUploadedFile("up.py", b"def f():\nreturn 1\n")})
    assert page.status_code == 200 and "up.py, line 2: expected an indented block" in page.content.decode()
    assert Job.objects.count() == 0


# --- a script for the other launcher: a warning, and the job is still created ----------------------

@pytest.mark.django_db
def test_a_horovod_script_under_torchrun_and_the_reverse_are_warned_of_and_still_created(client, both):
    helper = dict(PROJECT, **{"train.py": "import datautils\n", "datautils.py": "from horovod import torch as hvd\n"})
    project = upload(client, zip_of(helper)).json()["id"]
    response = submit(client, project=project, entry_point="train.py", launcher="torchrun")
    assert response.status_code == 201
    warning = ("datautils.py imports horovod.torch (line 1): a Horovod (horovodrun) script, but this job's launcher "
               "is PyTorch (torchrun), under which each of its ranks would run alone. Pick Horovod (horovodrun). "
               "As it is, the job fails when its ranks report a world size that is not the job's.")
    assert response.json()["warnings"] == [warning]
    events = client.get(f"/api/jobs/{response.json()['id']}/").json()["events"]
    assert [event["message"] for event in events] == ["submitted by alice", f"Warning: {warning}"]

    torchrun = script_id(client, TORCHRUN_SCRIPT)
    reverse = submit(client, script=torchrun, launcher="horovod").json()["warnings"]
    assert len(reverse) == 1 and reverse[0].startswith("train.py calls init_process_group (line 3): a PyTorch "
                                                       "(torchrun) script, but this job's launcher is Horovod")
    assert submit(client, script=torchrun, launcher="torchrun").json()["warnings"] == []
    assert submit(client, script=script_id(client, HOROVOD_SCRIPT), launcher="horovod").json()["warnings"] == []


# --- the job itself: its ranks report a world that is not its size ------------------------------

@pytest.mark.integration
@pytest.mark.django_db
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (apt-get install bubblewrap)")
def test_a_horovod_script_under_torchrun_fails_with_the_plain_reason(tmp_path, image, script):
    runner = LocalRunner(tmp_path / "jobs", sandbox=find("bwrap", (str(tmp_path / "jobs"),), str(Path.home())))
    spec = JobSpec(job_id=6100, gpus=2, python=sys.executable, script_name="train.py", script_content=HOROVOD_SCRIPT,
                   script_path=None, launcher="torchrun")
    lines, exited = run_to_end(runner, spec)
    assert exited.code != 0, [line.text for line in lines][-20:]
    assert not [line for line in lines if line.text.startswith("rank 0 of 1")]       # no rank trained alone
    assert any(line.text == f"WorldSizeMismatch: {PLAIN}" for line in lines), [line.text for line in lines][-20:]
    # ... and the job's reason is that message, whatever else the ranks printed
    job = Job.objects.create(owner=script.owner, image=image, gpus=2, script=script, launcher="torchrun",
                             time_limit_minutes=5)
    LogLine.objects.bulk_create(LogLine(job=job, seq=seq, rank=line.rank, stream=line.stream, text=line.text,
                                        ts=timezone.now()) for seq, line in enumerate(lines))
    assert failure.describe(job, exited)["reason"] == PLAIN
