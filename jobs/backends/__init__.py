"""The enabled backends, loaded from settings.RINGMASTER_BACKENDS (dotted paths of
jobs.backends.base.Backend subclasses), the way django.contrib.auth loads
AUTHENTICATION_BACKENDS. The rest of the portal asks here for a job's backend and never
branches on a backend's name.

A backend's package may be a Django app (instances/, kubernetes/), which Django imports before
any model can be: this module imports no model when it loads.
"""
from functools import lru_cache

from django.conf import settings
from django.utils.module_loading import import_string

from runners.base import JobSpec


class UnknownBackend(LookupError):
    pass


@lru_cache(maxsize=8)
def _load(paths):
    loaded = {}
    for path in paths:
        backend = import_string(path)()
        if not backend.name or backend.name in loaded:
            raise ValueError(f"RINGMASTER_BACKENDS: {path} has no name or repeats {backend.name!r}")
        loaded[backend.name] = backend
    return loaded


def _enabled():
    return _load(tuple(settings.RINGMASTER_BACKENDS))


def enabled():
    """The enabled backends, in the setting's order."""
    return list(_enabled().values())


def names():
    return list(_enabled())


def get(name):
    try:
        return _enabled()[name]
    except KeyError:
        raise UnknownBackend(f"backend {name!r} is not enabled on this portal "
                             f"(enabled: {', '.join(names()) or 'none'})") from None


def of(job):
    """The backend of `job` (a Job, or anything with a `backend` name)."""
    return get(job.backend)


def check_schedule():
    """Celery beat's entries for the enabled backends' periodic checks: one per backend that has
    one (Backend.check_every), running jobs.tasks.check_backend with its name. A backend that is
    not enabled has no entry, so its check never runs (portal.celery adds these when beat starts)."""
    return {f"check-{backend.name}": {"task": "jobs.tasks.check_backend", "schedule": float(backend.check_every),
                                      "args": (backend.name,)}
            for backend in enabled() if backend.check_every}


def label(name):
    backend = _enabled().get(name)
    return backend.label if backend else name


def job_spec(job):
    """The plain JobSpec a runner gets (runners never see the database)."""
    from jobs.installation import installation_id

    max_processes, memory_mib = job.image.job_limits()
    return JobSpec(
        job_id=job.pk,
        gpus=job.gpus_in_use,
        min_gpus=job.gpus if job.max_gpus else None,
        max_gpus=job.max_gpus,
        python=job.image.python,
        script_name=job.entry_point if job.project_id else job.script.name if job.script_id else "",
        script_content=job.script.content if job.script_id else None,
        script_path=job.script_path or None,
        args=tuple(job.args),
        env=dict(job.env),
        time_limit_seconds=job.time_limit_minutes * 60,
        container_image=job.image.container_image,
        installation=installation_id(),
        launcher=job.launcher,
        gpu_binding=tuple(tuple(indices) for indices in
                          job.allocations.order_by("position").values_list("gpu_indices", flat=True)),
        checkpoint=checkpoint_source(job),
        project=bytes(job.project.archive) if job.project_id else None,
        max_processes=max_processes,
        memory_mib=memory_mib,
        extra_packages=job.image.extra_packages,
        attempt=job.attempt,
    )


def checkpoint_source(job):
    """(folder on this machine, name) of the artifact a job starts from (JobSpec.checkpoint): its
    parent's (a rerun from checkpoint) or its own (a restart: checkpoint_own), or None."""
    source = job if job.checkpoint_own else job.parent
    if not job.checkpoint or source is None or source.artifacts_deleted_at is not None:
        return None
    try:
        folder = of(source).artifacts_root(source)
    except UnknownBackend:
        return None
    return (str(folder), job.checkpoint) if folder is not None else None
