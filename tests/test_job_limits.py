"""A job's limits of processes and memory (runners.limits): which ones a job gets (its image's, else
the site's), and the reason a job gives that ran into one."""
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.utils import timezone

from jobs.backends import job_spec
from jobs.domain.failure import describe
from jobs.models import Image, Job, LogLine
from runners.base import Exited, JobSpec
from runners.limits import HIT_FILE, MEMORY, PROCESSES, reported, supervisor_options
from runners.local import SUPERVISOR
from runners.sandbox import job_uid

pytestmark = pytest.mark.django_db


def failed_job(image, script, alice, lines):
    job = Job.objects.create(owner=alice, image=image, gpus=1, script=script, time_limit_minutes=5, exit_code=1)
    LogLine.objects.bulk_create(LogLine(job=job, seq=i, rank=0, stream="stderr", ts=timezone.now(), text=text)
                                for i, text in enumerate(lines))
    return job


def test_an_image_sets_its_jobs_limits_and_the_site_sets_the_rest(image, script, alice, settings):
    settings.RINGMASTER_JOB_MAX_PROCESSES, settings.RINGMASTER_JOB_MEMORY_MIB = 4096, None
    job = Job.objects.create(owner=alice, image=image, gpus=1, script=script, time_limit_minutes=5)
    spec = job_spec(job)
    assert (spec.max_processes, spec.memory_mib) == (4096, None)
    Image.objects.filter(pk=image.pk).update(max_processes=0, memory_mib=512)      # 0: no limit
    spec = job_spec(Job.objects.get(pk=job.pk))
    assert (spec.max_processes, spec.memory_mib) == (None, 512)


def test_a_job_held_by_an_rlimit_says_which_limit_its_error_was(image, script, alice):
    bomb = failed_job(image, script, alice, [
        "Traceback (most recent call last):", '  File "bomb.py", line 6, in <module>',
        "BlockingIOError: [Errno 11] Resource temporarily unavailable"])
    reason = describe(bomb, Exited(1, "horovodrun exited with code 1", rlimits=((PROCESSES, 64), (MEMORY, 512))))
    assert reason["reason"] == ("rank 0: BlockingIOError: [Errno 11] Resource temporarily unavailable "
                                "(hit its limit of 64 processes)")
    hog = failed_job(image, script, alice, ["Traceback (most recent call last):", "  x = bytearray(n)", "MemoryError"])
    reason = describe(hog, Exited(1, "horovodrun exited with code 1", rlimits=((MEMORY, 2048),)))
    assert reason["reason"] == "rank 0: MemoryError (hit its memory limit of 2 GiB)"
    # Where no rlimit held the job, the same error is only the job's own.
    assert describe(hog, Exited(1, "horovodrun exited with code 1"))["reason"] == "rank 0: MemoryError"


def test_what_the_supervisor_counted_is_the_reason(tmp_path):
    hit = tmp_path / "limit_hit"
    hit.write_text("memory 200\nprocesses 32\nrlimit processes 32\n")
    assert reported(hit) == ("hit its memory limit of 200 MiB; hit its limit of 32 processes", ((PROCESSES, 32),))
    assert reported(tmp_path / "none") == ("", ())


# A shell that starts 200 sleepers (they end a moment later), unless it cannot.
FORK_BOMB = "i=0; while [ $i -lt 200 ]; do sleep 1 & i=$((i + 1)); done"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"),
                    reason="needs root, unshare and setpriv")
def test_where_no_cgroup_can_be_made_an_rlimit_holds_a_job_of_its_own_uid(tmp_path):
    """The supervisor, in a mount namespace without the cgroup file systems: RLIMIT_NPROC stops
    the fork bomb of a job whose uid is its own, and the supervisor says an rlimit held it."""
    cgroups = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
               if line.partition(" - ")[2].split()[0] in ("cgroup", "cgroup2")]
    with job_uid(str(tmp_path)) as uid:
        supervise = [sys.executable, "-I", str(SUPERVISOR), "--exit-code", str(tmp_path / "exit_code"),
                     *supervisor_options(JobSpec(job_id=1, gpus=1, python="", script_name="", script_content=None,
                                                 script_path=None, max_processes=16), True, tmp_path / HIT_FILE),
                     "--", "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                     "/bin/sh", "-c", FORK_BOMB]
        done = subprocess.run(["unshare", "--mount", "/bin/sh", "-c", 'for m in "$@"; do umount -l "$m"; done; exec '
                               + " ".join(shlex.quote(word) for word in supervise), "sh", *reversed(cgroups)],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "fork" in done.stderr, done.stderr
    assert reported(tmp_path / HIT_FILE) == ("", ((PROCESSES, 16),))
