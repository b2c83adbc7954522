"""/api/git-credentials/: the caller's credentials for private git repositories (a token for
https, an SSH deploy key for ssh://), which a job's "git" names by id. A secret is stored
encrypted and never sent back; an SSH key's public half is, to be added to the repository as
its deploy key. Another user's credential is 404."""
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.domain import projects
from jobs.models import GitCredential
from jobs.web.api import REFUSED, form_errors
from jobs.web.forms import GitCredentialForm
from jobs.web.notify_api import not_an_object, unknown_fields
from jobs.web.parsers import JSONParser
from jobs.web.serializers import DetailSerializer, ErrorsSerializer


class GitCredentialSerializer(serializers.ModelSerializer):
    public_key = serializers.SerializerMethodField()

    class Meta:
        model = GitCredential
        fields = ["id", "name", "kind", "public_key", "created_at"]

    def get_public_key(self, credential) -> str | None:
        """An SSH key's public half (OpenSSH), to add as the repository's deploy key; null: a token."""
        return credential.public_key or None


class GitCredentialCreateRequest(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    kind = serializers.ChoiceField(choices=GitCredential.Kind.choices)
    secret = serializers.CharField(required=False, help_text=GitCredentialForm.base_fields["secret"].help_text)


class GitCredentialList(APIView):
    parser_classes = [JSONParser]

    @extend_schema(responses={200: GitCredentialSerializer(many=True), **REFUSED})
    def get(self, request):
        return Response(GitCredentialSerializer(projects.visible_git_credentials(request.user).order_by("id"),
                                                many=True).data)

    @extend_schema(request=GitCredentialCreateRequest,
                   responses={201: GitCredentialSerializer, 400: ErrorsSerializer, **REFUSED})
    def post(self, request):
        """Add a credential; an SSH key given no secret is made here, and its public half shown."""
        if not isinstance(request.data, dict):
            return not_an_object()
        errors = unknown_fields(request.data, list(GitCredentialForm.base_fields))
        form = GitCredentialForm(data=request.data, user=request.user)
        if errors or not form.is_valid():
            return Response({**form_errors(form), **errors}, status=status.HTTP_400_BAD_REQUEST)
        return Response(GitCredentialSerializer(form.save()).data, status=status.HTTP_201_CREATED)


class GitCredentialDetail(APIView):
    @extend_schema(responses={200: GitCredentialSerializer, **REFUSED, 404: DetailSerializer})
    def get(self, request, credential_id):
        return Response(GitCredentialSerializer(own(request, credential_id)).data)

    @extend_schema(responses={204: None, **REFUSED, 404: DetailSerializer})
    def delete(self, request, credential_id):
        own(request, credential_id).delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


def own(request, credential_id):
    return get_object_or_404(projects.visible_git_credentials(request.user), pk=credential_id)
