"""The Celery app. Broker and schedule come from settings (portal/settings.py)."""
import os

from celery import Celery
from celery.signals import beat_init, worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_ready.connect
def _worker_ready(**kwargs):
    from portal.heap import freeze_startup_heap
    from portal.readiness import mark_ready

    freeze_startup_heap()       # the worker's follower threads stop for no full scan of Django's objects
    mark_ready("worker")


@beat_init.connect
def _beat_ready(sender, **kwargs):
    """Beat's schedule gets the enabled backends' health checks (Django is set up by now), then
    beat is marked ready."""
    from jobs.backends import check_schedule
    from portal.readiness import mark_ready

    sender.scheduler.update_from_dict(check_schedule())
    mark_ready("beat")
