"""GET /api/backends/: the enabled backends, each with the fields of its own that a submission
may carry (Backend.api_fields), and why no job can go there now where none can. The command line
reads it to pass a backend's options (`ringmaster submit --cluster gpu-a`) without knowing any
backend."""
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs import backends
from jobs.web.api import REFUSED

BACKENDS = inline_serializer("Backend", many=True, fields={
    "name": serializers.CharField(),
    "label": serializers.CharField(),
    "fields": serializers.DictField(child=serializers.CharField(), help_text="field name: what it is"),
    "unavailable": serializers.CharField(help_text="why no job can go there now (an admin must add something); "
                                                   "empty where jobs can"),
})


def described(backend):
    return {"name": backend.name, "label": backend.label,
            "fields": {name: str(field.help_text or "") for name, field in backend.api_fields().items()},
            "unavailable": backend.unavailable() or ""}


class BackendList(APIView):
    @extend_schema(responses={200: BACKENDS, **REFUSED})
    def get(self, request):
        return Response([described(backend) for backend in backends.enabled()])
