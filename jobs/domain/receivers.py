"""Signal receivers of the domain (connected in jobs.apps.JobsConfig.ready)."""
from django.db.models.signals import post_delete, post_save, pre_delete
from django.dispatch import receiver

from jobs import taskqueue
from jobs.domain import notifications
from jobs.models import TERMINAL_STATES, Job, JobEvent, Quota, Trial


@receiver([post_save, post_delete], sender=Quota)
def look_at_the_queue_again(sender, **kwargs):
    """A raised (or removed) limit may let queued jobs start now, not at the next beat."""
    taskqueue.wake_scheduler()


@receiver(pre_delete, sender=Job)
def wait_for_the_jobs_last_output(sender, instance, **kwargs):
    """A job's lines and points have no foreign key in the database (jobs.models.LogLine): take
    the row lock their writer holds, so a batch being stored is deleted with the job (Django
    deletes them after this, in the same transaction) and a later one finds no job to store to."""
    Job.objects.select_for_update().filter(pk=instance.pk).exists()


@receiver(post_save, sender=JobEvent)
def tell_the_owner_a_job_ended(sender, instance, created, **kwargs):
    """The event of a job's end (states.transition records it) queues the notifications of its
    owner, in the transaction that ends it: sent once it commits, and only then."""
    if created and instance.state in TERMINAL_STATES:
        notifications.job_ended(instance.job)


@receiver(post_save, sender=JobEvent)
def bring_back_the_artifacts_of_a_job_that_ended(sender, instance, created, **kwargs):
    """A job's end queues the bring-back of its artifacts (and the count of their size)."""
    if created and instance.state in TERMINAL_STATES:
        taskqueue.collect_artifacts(instance.job_id)


@receiver(post_save, sender=JobEvent)
def drive_the_study_of_a_trial_that_ended(sender, instance, created, **kwargs):
    """A trial's job that ends lets its study tell Optuna and ask for the next trial now, not at
    beat's next pass. Only a job tagged as a study's trial costs a query."""
    if created and instance.state in TERMINAL_STATES and any(
            tag.startswith("study-") for tag in instance.job.tags or []):
        study_id = Trial.objects.filter(job_id=instance.job_id).values_list("study_id", flat=True).first()
        if study_id is not None:
            taskqueue.drive_study(study_id)
