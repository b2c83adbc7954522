"""How jobs, images, scripts, log lines and metric points look in the API (output only:
input is validated by jobs.forms, the one validation path)."""
from rest_framework import serializers

from .models import Image, Job, JobEvent, LogLine, Script
from .services import queue_position


class ImageSerializer(serializers.ModelSerializer):
    class Meta:
        model = Image
        fields = ["id", "name", "description", "container_image"]


class ScriptSerializer(serializers.ModelSerializer):
    class Meta:
        model = Script
        fields = ["id", "name", "sha256", "size"]


class JobEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["ts", "state", "message"]


class JobSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.get_username")
    image = serializers.CharField(source="image.name")
    script_name = serializers.CharField()
    queue_position = serializers.SerializerMethodField()
    url = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = [
            "id", "name", "owner", "image", "gpus", "script", "script_name", "script_path", "args", "env",
            "backend", "time_limit_minutes", "state", "reason", "exit_code", "failed_rank", "queue_position",
            "cancel_requested", "created_at", "started_at", "finished_at", "gpu_seconds", "url",
        ]

    def get_queue_position(self, job) -> int | None:
        return queue_position(job)

    def get_url(self, job) -> str:
        request = self.context.get("request")
        path = f"/jobs/{job.pk}/"
        return request.build_absolute_uri(path) if request else path


class JobDetailSerializer(JobSerializer):
    events = JobEventSerializer(many=True, read_only=True)

    class Meta(JobSerializer.Meta):
        fields = JobSerializer.Meta.fields + ["events"]


def rank_label(rank):
    return "launcher" if rank is None else rank


class LogLineSerializer(serializers.ModelSerializer):
    rank = serializers.SerializerMethodField()

    class Meta:
        model = LogLine
        fields = ["seq", "rank", "stream", "ts", "text"]

    def get_rank(self, line) -> int | str:
        return rank_label(line.rank)


class JobCreateRequest(serializers.Serializer):
    """Documents POST /api/jobs/ in the OpenAPI schema; validation is jobs.forms.JobForm."""

    image = serializers.CharField(help_text="Image name or id (an enabled image of the catalog).")
    gpus = serializers.IntegerField(min_value=1)
    script = serializers.IntegerField(required=False, help_text="Id from POST /api/scripts/.")
    script_path = serializers.CharField(required=False, help_text="Or a path inside the image.")
    args = serializers.ListField(child=serializers.CharField(), required=False)
    env = serializers.DictField(child=serializers.CharField(), required=False)
    backend = serializers.ChoiceField(choices=["local", "instances", "kubernetes"], required=False)
    cluster = serializers.CharField(required=False)
    name = serializers.CharField(required=False)
    time_limit_minutes = serializers.IntegerField(required=False, min_value=1)


class ScriptUploadRequest(serializers.Serializer):
    file = serializers.FileField()
