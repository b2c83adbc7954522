"""Celery tasks. Thin: each loads what it needs and calls the scheduler, a service or the follower.

The domain never imports this module: it queues these tasks by name (jobs.taskqueue).
"""
from celery import shared_task
from celery.signals import worker_ready

from jobs import backends
from jobs.domain import artifacts, follow, notifications, notify_send, scheduler, studies, tbmetrics
from jobs.models import Job
from jobs.web.forms import JobForm


@shared_task(acks_late=True)
def dispatch():
    """Admit queued jobs as quotas and capacity allow."""
    return scheduler.admit()


@shared_task
def run_job(job_id):
    """Launch one job; the worker's follow hub (jobs.domain.followhub) follows it to its end, so
    the task (and the pool's thread) is done once the launch is."""
    follow.start(job_id)


@shared_task(acks_late=True)
def stop_job(job_id):
    follow.stop(job_id)


@shared_task
def check_backend(name):
    """One enabled backend's periodic health check (beat runs it every Backend.check_every
    seconds: jobs.backends.check_schedule). A backend that is not enabled here is not checked."""
    if name not in backends.names():
        return None
    return backends.get(name).periodic_check()


@shared_task
def reconcile():
    return scheduler.reconcile()


@shared_task(bind=True, acks_late=True, autoretry_for=(notify_send.Unsent,), retry_backoff=True,
             retry_backoff_max=600, retry_jitter=True, max_retries=10)
def deliver_notification(self, delivery_id):
    """One notification to one target; retried with exponential backoff (about 1 s, 2 s, 4 s, ...,
    at most 10 minutes apart; some 17 minutes in all) while the trouble may pass."""
    notifications.deliver(delivery_id, last=self.request.retries >= self.max_retries)


@shared_task
def check_notifications():
    """Beat's look for jobs that waited long or whose GPUs sit idle."""
    return notifications.check()


@shared_task
def collect_artifacts(job_id):
    """Bring one job's artifacts back (its end, or "Fetch now" while it runs)."""
    job = Job.objects.select_related("owner").filter(pk=job_id).first()
    if job is not None:
        artifacts.collect(job)
        if job.is_terminal:
            tbmetrics.scrape(job, last=True)      # what its event files gained at the end


@shared_task
def scrape_tensorboard():
    """Beat's look at running jobs' TensorBoard event files (jobs.domain.tbmetrics)."""
    return tbmetrics.scrape_running()


@shared_task
def expire_artifacts():
    """Beat's deletion of artifacts past RINGMASTER_ARTIFACT_RETENTION_DAYS."""
    return artifacts.expire()


@shared_task
def drive_study(study_id):
    """One pass over a study (jobs.domain.studies.drive): its trials' ends told, new trials asked.
    Its trials are validated by the job form, as every job is."""
    studies.drive(study_id, JobForm)


@shared_task
def drive_studies():
    """Beat's pass over every running study: new metric points reported (pruning), ended trials told."""
    studies.drive_running(JobForm)


@worker_ready.connect
def reconcile_on_start(sender, **kwargs):
    """A worker that starts after a crash picks up the jobs the dead one was following."""
    reconcile.delay()
