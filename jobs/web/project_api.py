"""Projects: POST /api/projects/ (an archive becomes a snapshot), and the files a job runs,
GET /api/jobs/<id>/files/ and .../files/<path>. A job of one uploaded script is a one-file
project; a job of a script inside its image has no files here. Another user's job is 404."""
from django.http import Http404, HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.domain import projects
from jobs.web.api import REFUSED, form_errors, get_job
from jobs.web.forms import ProjectUploadForm
from jobs.web.serializers import (DetailSerializer, ErrorsSerializer, ProjectFileSerializer, ProjectSerializer,
                                  ProjectUploadRequest)


class ProjectList(APIView):
    parser_classes = [MultiPartParser, FormParser]

    @extend_schema(request={"multipart/form-data": ProjectUploadRequest},
                   responses={201: ProjectSerializer, 400: ErrorsSerializer, **REFUSED})
    def post(self, request):
        """Upload a project as a .zip or .tar.gz; the same files give the same snapshot."""
        form = ProjectUploadForm(data=request.data, files=request.FILES)
        if not form.is_valid():
            return Response(form_errors(form), status=status.HTTP_400_BAD_REQUEST)
        try:
            project = projects.store(request.user, form.cleaned_data["file"])
        except projects.BadProject as exc:
            return Response({"file": [str(exc)]}, status=status.HTTP_400_BAD_REQUEST)
        return Response(ProjectSerializer(project).data, status=status.HTTP_201_CREATED)


class JobFiles(APIView):
    @extend_schema(responses={200: ProjectFileSerializer(many=True), **REFUSED, 404: DetailSerializer})
    def get(self, request, job_id):
        """The files of the job's project (its one script for a script job)."""
        return Response(ProjectFileSerializer(projects.job_files(get_job(request, job_id)), many=True).data)


class JobFile(APIView):
    @extend_schema(responses={(200, "application/octet-stream"): bytes, **REFUSED, 404: DetailSerializer})
    def get(self, request, job_id, path):
        """One file of the job's project, as bytes."""
        try:
            content = projects.job_file(get_job(request, job_id), path)
        except KeyError:
            raise Http404("No such file in the job's project.") from None
        response = HttpResponse(content, content_type="application/octet-stream")
        response["X-Content-Type-Options"] = "nosniff"
        return response
