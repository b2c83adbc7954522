"""Which runner runs a job, and the plain JobSpec it gets (runners never see the database)."""
from django.conf import settings

from runners.base import JobSpec
from runners.local import LocalRunner

from .models import Backend


def runner_for(job):
    if job.backend == Backend.LOCAL:
        return LocalRunner(settings.RINGMASTER_JOBS_DIR)
    if job.backend == Backend.INSTANCES:
        from .instances import runner_for as instance_runner

        return instance_runner(job)
    if job.backend == Backend.KUBERNETES:
        from .clusters import runner_for as cluster_runner

        return cluster_runner(job)
    raise ValueError(f"backend {job.backend!r} is not available")


def job_spec(job):
    return JobSpec(
        job_id=job.pk,
        gpus=job.gpus,
        python=job.image.python,
        script_name=job.script.name if job.script_id else "",
        script_content=job.script.content if job.script_id else None,
        script_path=job.script_path or None,
        args=tuple(job.args),
        env=dict(job.env),
        time_limit_seconds=job.time_limit_minutes * 60,
        container_image=job.image.container_image,
    )


def after_launch(job, runner, error=None):
    """What a backend keeps from a launch (or a failed one)."""
    if job.backend == Backend.INSTANCES:
        from .instances import after_launch as instances_after_launch

        instances_after_launch(runner, error)
