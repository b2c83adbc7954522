"""What render_mpijob and render_trainjob share: find the job, print its document as JSON, and
write what the API server or the operator would refuse to stderr (exit status 1)."""
import json

from django.core.management.base import BaseCommand, CommandError

from jobs.models import Job


class RenderCommand(BaseCommand):
    def add_arguments(self, parser):
        parser.add_argument("job_id", type=int)

    def render(self, job):
        """(the document, [problems]) for `job`; CommandError where there is none."""
        raise NotImplementedError

    def handle(self, *args, job_id, **options):
        job = Job.objects.select_related("image", "script", "charged_group").filter(pk=job_id).first()
        if job is None:
            raise CommandError(f"no job {job_id}")
        document, problems = self.render(job)
        self.stdout.write(json.dumps(document, indent=2))
        if problems:
            raise CommandError("\n".join(problems))
