"""Signal receivers of the domain (connected in jobs.apps.JobsConfig.ready)."""
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from jobs import taskqueue
from jobs.models import Quota


@receiver([post_save, post_delete], sender=Quota)
def look_at_the_queue_again(sender, **kwargs):
    """A raised (or removed) limit may let queued jobs start now, not at the next beat."""
    taskqueue.wake_scheduler()
