from django.core.management.base import CommandError

from jobs.backends import job_spec
from jobs.backends.kubernetes.clusters import cluster_of, cluster_spec
from jobs.backends.kubernetes.management.commands._render import RenderCommand
from runners import launchers, trainjob


class Command(RenderCommand):
    help = ("Print, as JSON, the Kubeflow Trainer TrainJob the Kubernetes backend creates (or would create) "
            "for a torchrun job. Needs no connection to the cluster. Problems the API server or Trainer "
            "would refuse are written to stderr, and the exit status is then 1.")

    def render(self, job):
        cluster = cluster_of(job)
        if cluster is None:
            raise CommandError(f"job {job.pk} runs on the {job.backend} backend, not on a Kubernetes cluster")
        if launchers.of(job.launcher).KUBERNETES != trainjob.__name__:
            raise CommandError(f"job {job.pk} runs with {job.launcher}, not as a TrainJob: see render_mpijob")
        try:
            document = trainjob.new_trainjob(job_spec(job), cluster_spec(cluster, job.charged_group, job.owner))
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        return document, trainjob.document_problems(document)
