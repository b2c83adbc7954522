"""Celery tasks. Thin: each loads what it needs and calls a service or the follower."""
from celery import shared_task
from celery.signals import worker_ready

from . import follow, services


@shared_task(acks_late=True)
def dispatch(job_id=None):
    """Admit queued jobs as quotas and capacity allow (job_id: the job that prompted it, for the log)."""
    return services.admit()


@shared_task
def run_job(job_id):
    """Launch and follow one job to its end (long: as long as the job runs)."""
    follow.run(job_id)


@shared_task(acks_late=True)
def stop_job(job_id):
    follow.stop(job_id)


@shared_task
def check_instances():
    """Health of every enabled GPU instance over SSH (from beat, and on demand)."""
    from . import instances

    return {name: ok for name, (ok, _) in instances.check_all().items()}


@shared_task
def reconcile():
    return follow.reconcile()


@worker_ready.connect
def reconcile_on_start(sender, **kwargs):
    """A worker that starts after a crash picks up the jobs the dead one was following."""
    reconcile.delay()
