"""A job's limits of processes and memory (runners.limits): which ones a job gets (its image's, else
the site's), and the reason a job gives that ran into one."""
import pytest
from django.utils import timezone

from jobs.backends import job_spec
from jobs.domain.failure import describe
from jobs.models import Image, Job, LogLine
from runners.base import Exited
from runners.limits import MEMORY, PROCESSES, reported

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
