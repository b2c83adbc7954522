"""/api/jobs/<id>/artifacts/: the files a job wrote under RINGMASTER_OUTPUT_DIR (a list, one
file's bytes, all as a .tar.gz), "Fetch now", and a rerun from the newest checkpoint. Another
user's job is 404; a name that leaves the output folder is 400, one that is not a file there 404."""
from django.http import FileResponse, Http404, StreamingHttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs import taskqueue
from jobs.domain import artifacts, services
from jobs.web.api import REFUSED, form_errors, get_job
from jobs.web.forms import JobForm
from jobs.web.serializers import DetailSerializer, ErrorsSerializer, JobDetailSerializer


class ArtifactSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="The path relative to the output folder, '/' between folders.")
    size = serializers.IntegerField(help_text="Bytes.")
    modified = serializers.FloatField(help_text="Last written, in seconds since the epoch.")
    skipped = serializers.CharField(
        required=False,
        help_text="Only on an entry that is no file: a folder (its name ends in '/'; '' is the output folder "
                  "itself) whose contents were left out of the list, the archive and the storage count, and "
                  "why (deeper than the walk goes, past the number of names it looks at, unreadable). Its "
                  "size is 0. These entries come after the files.")


def archive_response(job):
    response = StreamingHttpResponse(artifacts.archive_chunks(job), content_type="application/gzip")
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}-artifacts.tar.gz"'
    return response


def file_response(job, name):
    """The artifact's bytes; a bad name is a ValueError (BadName), a missing one Http404."""
    try:
        handle = artifacts.open_file(job, name)
    except FileNotFoundError:
        raise Http404("No such artifact.")
    return FileResponse(handle, as_attachment=True, filename=name.rsplit("/", 1)[-1],
                        content_type="application/octet-stream")


class ArtifactList(APIView):
    @extend_schema(responses={200: ArtifactSerializer(many=True), **REFUSED, 404: DetailSerializer})
    def get(self, request, job_id):
        tree = artifacts.walk(get_job(request, job_id))
        return Response([entry.as_dict() for entry in [*tree.files, *tree.skipped]])


class ArtifactFile(APIView):
    @extend_schema(responses={(200, "application/octet-stream"): bytes, **REFUSED, 400: ErrorsSerializer,
                              404: DetailSerializer})
    def get(self, request, job_id, name):
        job = get_job(request, job_id)
        try:
            return file_response(job, name)
        except artifacts.BadName as exc:
            return Response({"name": [str(exc)]}, status=status.HTTP_400_BAD_REQUEST)


class ArtifactArchive(APIView):
    @extend_schema(responses={(200, "application/gzip"): bytes, **REFUSED, 404: DetailSerializer})
    def get(self, request, job_id):
        return archive_response(get_job(request, job_id))


class ArtifactFetch(APIView):
    """Bring a job's artifacts back now (a Celery task), where its backend copies them."""

    @extend_schema(request=None, responses={202: DetailSerializer, **REFUSED, 400: ErrorsSerializer,
                                            404: DetailSerializer})
    def post(self, request, job_id):
        job = get_job(request, job_id)
        if not artifacts.fetches(job):
            return Response({"job": ["This job's artifacts are read where they are written; there is nothing "
                                     "to fetch."]}, status=status.HTTP_400_BAD_REQUEST)
        taskqueue.collect_artifacts(job.pk)
        return Response({"detail": f"Fetching the artifacts of job {job.pk}."}, status=status.HTTP_202_ACCEPTED)


class RerunFromCheckpoint(APIView):
    """A new job with the settings of this one, given its newest checkpoint (RINGMASTER_CHECKPOINT)."""

    @extend_schema(request=None, responses={201: JobDetailSerializer, **REFUSED, 400: ErrorsSerializer,
                                            404: DetailSerializer})
    def post(self, request, job_id):
        job = get_job(request, job_id)
        checkpoint = artifacts.newest_checkpoint(job)
        if checkpoint is None:
            return Response({"checkpoint_pattern": [artifacts.no_checkpoint(job)]},
                            status=status.HTTP_400_BAD_REQUEST)
        form = JobForm(data=services.resubmit_data(job, request.user), user=request.user)
        if not form.is_valid():
            return Response(form_errors(form), status=status.HTTP_400_BAD_REQUEST)
        new = services.submit(request.user, form, parent=job, checkpoint=checkpoint)
        return Response(JobDetailSerializer(new, context={"request": request}).data, status=status.HTTP_201_CREATED)
