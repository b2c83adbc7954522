"""Queue the portal's Celery tasks by name, once the current transaction commits.

The domain asks for work to be done (admit the queue, run a job, stop one) without importing
jobs.tasks, which imports the domain: the tasks are sent by name through the Celery app.
"""
from celery import current_app
from django.db import transaction


class Send:
    """An on-commit callback that sends task `jobs.tasks.<task>` with `args`."""

    def __init__(self, task, *args, countdown=None):
        self.task, self.args, self.countdown = task, args, countdown

    def __call__(self):
        current_app.send_task(f"jobs.tasks.{self.task}", args=self.args, countdown=self.countdown)

    def __repr__(self):
        return f"Send({self.task!r}, *{self.args!r})"


def sent(callbacks):
    """The names of the tasks among on-commit `callbacks` (for tests and logs)."""
    return [callback.task for callback in callbacks if isinstance(callback, Send)]


def wake_scheduler():
    """Let the scheduler look at the queue (a job was submitted, ended, or capacity changed)."""
    transaction.on_commit(Send("dispatch"))


def wake_scheduler_after(seconds):
    """Let the scheduler look at the queue in `seconds` (a restarted job's backoff ends then)."""
    transaction.on_commit(Send("dispatch", countdown=max(0.0, seconds)))


def run_job(job_id):
    """Launch and follow an admitted job in a worker."""
    transaction.on_commit(Send("run_job", job_id))


def stop_job(job_id):
    """Stop a job whose cancel was requested."""
    transaction.on_commit(Send("stop_job", job_id))


def deliver_notification(delivery_id):
    """Send one notification (jobs.models.NotificationDelivery) to its target."""
    transaction.on_commit(Send("deliver_notification", delivery_id))


def collect_artifacts(job_id):
    """Bring a job's artifacts to where the portal reads them (at its end, or "Fetch now")."""
    transaction.on_commit(Send("collect_artifacts", job_id))


def drive_study(study_id):
    """Let a study look at its trials (one of their jobs ended, or it was created)."""
    transaction.on_commit(Send("drive_study", study_id))
