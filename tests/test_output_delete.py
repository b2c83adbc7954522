"""A job's lines and metric points go with the job (they have no foreign key in the database:
jobs.models.LogLine), also when the job is deleted while a batch of its output is being stored."""
import threading

import pytest
from django.db import connection, transaction
from django.utils import timezone

from jobs.domain.logstore import append_output
from jobs.models import Job, LogLine, MetricPoint, State
from runners.output import OutputSplitter
from tests.conftest import wait_for

CHUNK = b"".join(b'[%d]<stdout>:RINGMASTER_METRIC {"step": %d, "loss": 0.%d}\n' % (rank, i, i)
                 for i in range(20) for rank in (0, 1))


def running_job(owner, image):
    return Job.objects.create(owner=owner, image=image, gpus=2, script_path="t.py", time_limit_minutes=5,
                              state=State.RUNNING, started_at=timezone.now())


def store(job, start=0):
    splitter = OutputSplitter()
    return append_output(job.pk, splitter.feed(CHUNK), start, start + len(CHUNK), splitter.state())


def output_rows(job_id):
    return LogLine.objects.filter(job_id=job_id).count(), MetricPoint.objects.filter(job_id=job_id).count()


@pytest.mark.django_db
def test_deleting_a_job_deletes_its_lines_and_points(alice, image):
    job, other = running_job(alice, image), running_job(alice, image)
    assert store(job) and store(other)
    assert output_rows(job.pk) == (40, 40)
    job_id = job.pk
    job.delete()
    assert output_rows(job_id) == (0, 0)
    assert output_rows(other.pk) == (40, 40)                   # nobody else's


@pytest.mark.django_db(transaction=True)
def test_a_batch_stored_while_its_job_is_deleted_goes_with_it(alice, image, row_locks):
    """A follower's transaction holds the job's row and has written a batch; the job is deleted
    meanwhile (an admin, or its owner's account). The delete waits for the batch and removes
    it too: nothing is left of the job."""
    job = running_job(alice, image)
    assert store(job)
    stored, may_commit, errors = threading.Event(), threading.Event(), []

    def follower():
        try:
            with transaction.atomic():
                assert store(job, start=len(CHUNK))
                stored.set()
                may_commit.wait(30)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    def deleter():
        try:
            Job.objects.get(pk=job.pk).delete()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=follower)]
    threads[0].start()
    assert stored.wait(30)
    threads.append(threading.Thread(target=deleter))
    threads[1].start()

    def delete_waits_on_a_lock():
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND wait_event_type = 'Lock' AND query ILIKE %s", ["%jobs_job%"])
            return cursor.fetchone()[0] > 0
    wait_for(delete_waits_on_a_lock, timeout=30, message="the delete to wait for the follower's batch")
    may_commit.set()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert not Job.objects.filter(pk=job.pk).exists()
    assert output_rows(job.pk) == (0, 0)
