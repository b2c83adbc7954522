import json

from django.core.management.base import BaseCommand, CommandError

from jobs.clusters import ClusterError, render
from jobs.models import Backend, Job
from runners.mpijob import InvalidMPIJob, validate


class Command(BaseCommand):
    help = ("Print, as JSON, the MPIJob the Kubernetes backend creates (or would create) for a job. "
            "Needs no connection to the cluster. Problems the API server or the MPI operator would "
            "refuse are written to stderr, and the exit status is then 1.")

    def add_arguments(self, parser):
        parser.add_argument("job_id", type=int)

    def handle(self, *args, job_id, **options):
        job = Job.objects.select_related("image", "script", "cluster", "charged_group").filter(pk=job_id).first()
        if job is None:
            raise CommandError(f"no job {job_id}")
        if job.backend != Backend.KUBERNETES or job.cluster is None:
            raise CommandError(f"job {job_id} runs on the {job.backend} backend, not on a Kubernetes cluster")
        try:
            document = render(job)
        except ClusterError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(json.dumps(document, indent=2))
        try:
            validate(document)
        except InvalidMPIJob as exc:
            raise CommandError("\n".join(exc.problems)) from None
