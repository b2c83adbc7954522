import json

from django.core.management.base import BaseCommand, CommandError

from jobs import backends
from jobs.models import Job


class Command(BaseCommand):
    help = ("Print, as JSON, the MPIJob the Kubernetes backend creates (or would create) for a job "
            "(what a job's backend creates for it). Needs no connection to the cluster. Problems the "
            "API server or the MPI operator would refuse are written to stderr, and the exit status is then 1.")

    def add_arguments(self, parser):
        parser.add_argument("job_id", type=int)

    def handle(self, *args, job_id, **options):
        job = Job.objects.select_related("image", "script", "cluster", "charged_group").filter(pk=job_id).first()
        if job is None:
            raise CommandError(f"no job {job_id}")
        try:
            backend = backends.of(job)
            made = backend.document(job)
        except (backends.UnknownBackend, ValueError) as exc:
            raise CommandError(str(exc)) from None
        if made is None:
            raise CommandError(f"job {job_id} runs on the {job.backend} backend, not on a Kubernetes cluster")
        _, document = made
        self.stdout.write(json.dumps(document, indent=2))
        problems = backend.document_problems(document)
        if problems:
            raise CommandError("\n".join(problems))
