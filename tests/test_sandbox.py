"""runners.sandbox with the real bubblewrap: what a job in it can and cannot see, including a
Ringmaster checkout and virtual environment under /tmp (how CI runs), which the job's private
/tmp would otherwise hide from it."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runners.local import JOB_PYTHON, LocalRunner
from runners.base import JobSpec
from runners.sandbox import Sandbox

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (apt-get install bubblewrap)")


def run_in(sandbox, job_dir, argv, keep=()):
    return subprocess.run([*sandbox.argv(job_dir, keep=keep), *argv], capture_output=True, text=True, timeout=60)


def test_the_job_sees_its_folder_and_what_it_needs_under_tmp_and_nothing_else_there(tmp_path):
    data, job = tmp_path / "data", tmp_path / "data" / "jobs" / "rm-x-1"
    job.mkdir(parents=True)
    (data / "secret_key").write_text("portal secret")
    tools = tmp_path / "venv" / "bin"
    tools.mkdir(parents=True)
    (tools / "tool").write_text("#!/bin/sh\necho tool ran\n")
    (tools / "tool").chmod(0o755)
    (tmp_path / "elsewhere").write_text("not for the job")
    sandbox = Sandbox(shutil.which("bwrap"), (str(data),), str(Path.home()))
    script = (f"cat {data}/secret_key; cat {tmp_path}/elsewhere; {tools}/tool; echo mine > own && cat own; "
              f"echo scratch > /tmp/s && cat /tmp/s; ls /proc | grep -c '^[0-9]'")
    result = run_in(sandbox, job, ["/bin/sh", "-c", script], keep=(str(tmp_path / "venv"),))
    assert "portal secret" not in result.stdout and "not for the job" not in result.stdout
    lines = result.stdout.split()
    assert lines[:4] == ["tool", "ran", "mine", "scratch"], result.stderr
    assert int(lines[4]) < 5                                     # its own PID namespace
    assert not (tmp_path / "s").exists() and (job / "own").read_text() == "mine\n"


def test_a_folder_that_holds_a_hidden_one_is_never_shown_again(tmp_path):
    data, job = tmp_path / "data", tmp_path / "job"
    data.mkdir(), job.mkdir()
    (data / "secret_key").write_text("portal secret")
    sandbox = Sandbox(shutil.which("bwrap"), (str(data),), "")
    result = run_in(sandbox, job, ["/bin/sh", "-c", f"cat {data}/secret_key /etc/shadow; echo done"],
                    keep=("/", str(tmp_path), "/etc"))                   # e.g. a python in /bin: keep "/"
    assert result.stdout.strip() == "done", result.stdout


def test_a_hidden_folder_inside_another_leaves_no_name_showing_there(tmp_path):
    data, job = tmp_path / "data", tmp_path / "job"
    (data / "artifacts").mkdir(parents=True), job.mkdir()
    (data / "artifacts" / "secret").write_text("another job's file")
    sandbox = Sandbox(shutil.which("bwrap"), (str(data), str(data / "artifacts")), "")
    result = run_in(sandbox, job, ["/bin/sh", "-c", f"ls -A {data}; cat {data}/artifacts/secret; echo done"],
                    keep=("/", "/etc"))
    assert result.stdout.strip() == "done", result.stdout


def test_the_local_runner_keeps_its_interpreters_environment_and_job_python():
    spec = JobSpec(job_id=1, gpus=1, python=sys.executable, script_name="t.py", script_content="", script_path=None)
    needs = LocalRunner("/nonexistent", sandbox=None)._needs(spec)
    venv = str(Path(sys.executable).parent.parent)
    assert venv in needs and str(JOB_PYTHON) in needs
