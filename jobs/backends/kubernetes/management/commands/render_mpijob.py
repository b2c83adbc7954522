from django.core.management.base import CommandError

from jobs import backends
from jobs.backends.kubernetes.management.commands._render import RenderCommand


class Command(RenderCommand):
    help = ("Print, as JSON, the MPIJob the Kubernetes backend creates (or would create) for a job "
            "(what a job's backend creates for it). Needs no connection to the cluster. Problems the "
            "API server or the MPI operator would refuse are written to stderr, and the exit status is then 1.")

    def render(self, job):
        try:
            backend = backends.of(job)
            made = backend.document(job)
        except (backends.UnknownBackend, ValueError) as exc:
            raise CommandError(str(exc)) from None
        if made is None:
            raise CommandError(f"job {job.pk} runs on the {job.backend} backend, not on a Kubernetes cluster")
        _, document = made
        return document, backend.document_problems(document)
