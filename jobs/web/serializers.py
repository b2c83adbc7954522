"""How jobs, images, scripts, log lines and metric points look in the API (output only:
input is validated by jobs.web.forms, the one validation path)."""
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobs import backends
from jobs.models import RESTART_CAUSES, Image, Job, JobAttempt, JobEvent, LogLine, Project, Script
from jobs.web import forms
from jobs.domain import recovery
from jobs.domain.logwire import rank_label
from jobs.domain.scheduler import queue_position
from runners import launchers


class ImageSerializer(serializers.ModelSerializer):
    launchers = serializers.SerializerMethodField()

    class Meta:
        model = Image
        fields = ["id", "name", "description", "container_image", "launchers"]

    def get_launchers(self, image) -> list[str]:
        """The launchers the image carries (a job's `launcher` is one of them)."""
        return image.launcher_names()


class ScriptSerializer(serializers.ModelSerializer):
    class Meta:
        model = Script
        fields = ["id", "name", "sha256", "size"]


class ProjectSerializer(serializers.ModelSerializer):
    files = serializers.IntegerField(help_text="How many files the project has.")
    size = serializers.IntegerField(help_text="Bytes of its files together.")

    class Meta:
        model = Project
        fields = ["id", "sha256", "files", "size"]


class ProjectFileSerializer(serializers.Serializer):
    path = serializers.CharField(help_text="The file's path in the project, with / between folders.")
    size = serializers.IntegerField()


class JobProjectSerializer(serializers.Serializer):
    """What a job runs of a project: the snapshot, the entry point, and for a project fetched
    from git its repository and commit (null for an uploaded archive)."""
    id = serializers.IntegerField(source="project.id")
    sha256 = serializers.CharField(source="project.sha256")
    entry_point = serializers.CharField()
    url = serializers.CharField(source="project_url", allow_null=True,
                                help_text="The git repository; null: an archive.")
    commit = serializers.CharField(source="project_commit", allow_null=True,
                                   help_text="The git commit the ref resolved to at submit; null: an archive.")

    def to_representation(self, job):
        shown = super().to_representation(job)
        shown["url"], shown["commit"] = shown["url"] or None, shown["commit"] or None
        return shown


class JobEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["ts", "state", "message", "gpus"]


@extend_schema_field(OpenApiTypes.STR)
class BackendValue(serializers.Field):
    """One of a job's backend's own fields (Backend.field_values), read once per job, or once per
    backend for a list of jobs (JobListSerializer)."""

    def __init__(self, name, **kwargs):
        super().__init__(source="*", read_only=True, allow_null=True, **kwargs)
        self.value_name = name

    def to_representation(self, job):
        if not hasattr(job, "_backend_values"):
            try:
                job._backend_values = backends.of(job).field_values(job)
            except backends.UnknownBackend:
                job._backend_values = {}
        return job._backend_values.get(self.value_name)


class JobListSerializer(serializers.ListSerializer):
    """Jobs as a list: each backend's own fields read for all of its jobs at once
    (Backend.field_values_of), not one job at a time."""

    def to_representation(self, data):
        jobs = list(data.all() if hasattr(data, "all") else data)
        by_backend = {}
        for job in jobs:
            by_backend.setdefault(job.backend, []).append(job)
        for name, some in by_backend.items():
            try:
                values = backends.get(name).field_values_of(some)
            except backends.UnknownBackend:
                values = {}
            for job in some:
                job._backend_values = values.get(job.pk, {})
        return super().to_representation(jobs)


class JobSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.get_username")
    image = serializers.CharField(source="image.name")
    script_name = serializers.CharField()
    group = serializers.CharField(source="charged_group.name", default=None, allow_null=True)
    queue_position = serializers.SerializerMethodField()
    url = serializers.SerializerMethodField()
    size = serializers.SerializerMethodField()
    tags = serializers.ListField(child=serializers.CharField(), read_only=True,
                                 help_text="Labels to find the job by (GET /api/jobs/?tag=).")
    project = serializers.SerializerMethodField()
    restarts_left = serializers.SerializerMethodField()

    class Meta:
        model = Job
        list_serializer_class = JobListSerializer
        fields = [
            "id", "name", "owner", "image", "launcher", "gpus", "max_gpus", "size", "script", "script_name", "script_path",
            "project", "args", "env", "backend", "gpu_model", "time_limit_minutes", "group", "priority", "held", "state", "reason", "exit_code",
            "failed_rank", "queue_position", "cancel_requested", "created_at", "started_at", "finished_at",
            "gpu_seconds", "tags", "note", "checkpoint_pattern", "checkpoint", "artifacts_bytes", "artifacts_note",
            "max_restarts", "restart_on_exit_codes", "restart_on", "attempt", "restarts_left", "url",
        ]

    @extend_schema_field(JobProjectSerializer(allow_null=True))
    def get_project(self, job):
        """The project the job runs ({"id", "sha256", "entry_point"}), or null for a script."""
        return JobProjectSerializer(job).data if job.project_id else None

    def get_fields(self):
        """With the enabled backends' own fields (Backend.api_fields, e.g. kubernetes' cluster),
        each null for the jobs of another backend."""
        fields = super().get_fields()
        for backend in backends.enabled():
            for name, field in backend.api_fields().items():
                fields.setdefault(name, BackendValue(name, help_text=field.help_text))
        return fields

    def get_queue_position(self, job) -> int | None:
        """Place in the scheduler's order while queued (1: next); None otherwise or when held."""
        if hasattr(job, "queue_pos"):          # a list annotated by scheduler.with_queue_position
            return job.queue_pos
        return queue_position(job)

    def get_restarts_left(self, job) -> int:
        """How many more times the job may be restarted (its recovery policy's budget left)."""
        return recovery.restarts_left(job)

    def get_size(self, job) -> int | None:
        """GPUs the job holds now (an elastic job's changes), or the last it held; None before admission."""
        return job.size

    def get_url(self, job) -> str:
        request = self.context.get("request")
        path = f"/jobs/{job.pk}/"
        return request.build_absolute_uri(path) if request else path


class JobCreatedSerializer(JobSerializer):
    """POST /api/jobs/'s answer: the job, and what it was created despite."""

    warnings = serializers.SerializerMethodField()

    class Meta(JobSerializer.Meta):
        fields = JobSerializer.Meta.fields + ["warnings"]

    def get_warnings(self, job) -> list[str]:
        """What the job was created despite, e.g. a Horovod script under torchrun (also one of its
        events, "Warning: ..."); empty where nothing."""
        return list(self.context.get("warnings", []))


TAGS_HELP = (f"Labels to find the job by (GET /api/jobs/?tag=): at most {forms.MAX_TAGS}, each 1 to "
             f"{forms.MAX_TAG_CHARS} characters, no commas; runs of whitespace become one space, "
             "duplicates are dropped.")
NOTE_HELP = f"Why the job was run, what came of it (at most {forms.MAX_NOTE_CHARS:,} characters)."


def tags_field():
    return serializers.ListField(child=serializers.CharField(min_length=1, max_length=forms.MAX_TAG_CHARS),
                                 max_length=forms.MAX_TAGS, required=False, help_text=TAGS_HELP)


def note_field():
    return serializers.CharField(required=False, allow_blank=True, max_length=forms.MAX_NOTE_CHARS,
                                 help_text=NOTE_HELP)


class JobAttemptSerializer(serializers.ModelSerializer):
    """One run of the job (the first, then one per restart); `ended` null while it runs."""

    class Meta:
        model = JobAttempt
        fields = ["number", "started", "ended", "exit_code", "reason", "gpu_seconds", "first_seq"]


class JobDetailSerializer(JobSerializer):
    events = JobEventSerializer(many=True, read_only=True)
    attempts = JobAttemptSerializer(many=True, read_only=True)
    parent = serializers.IntegerField(source="parent_id", allow_null=True, read_only=True,
                                      help_text="The job this one was rerun from (null: none).")

    class Meta(JobSerializer.Meta):
        fields = JobSerializer.Meta.fields + ["parent", "events", "attempts"]


class LogLineSerializer(serializers.ModelSerializer):
    rank = serializers.SerializerMethodField()
    hit = serializers.BooleanField(required=False,
                                   help_text="Only in a search with `context`: true for a line that matches, "
                                             "false for one shown around a hit.")

    class Meta:
        model = LogLine
        fields = ["seq", "rank", "stream", "ts", "text", "hit"]

    def get_rank(self, line) -> int | str:
        return rank_label(line.rank)


class GitRequest(serializers.Serializer):
    url = serializers.CharField(help_text="https:// or ssh:// (the schemes in RINGMASTER_GIT_SCHEMES).")
    ref = serializers.CharField(help_text="A branch, a tag or a full commit id.")
    token = serializers.CharField(required=False, write_only=True,
                                  help_text="For a private https repository: used for this fetch only, never kept.")
    credential = serializers.IntegerField(required=False, help_text="Or one of your git credentials "
                                                                    "(GET /api/git-credentials/): its id.")


class JobCreateRequest(serializers.Serializer):
    """Documents POST /api/jobs/ in the OpenAPI schema; validation is jobs.web.forms.JobForm."""

    image = serializers.CharField(min_length=1, help_text="Image name or id (an enabled image of the catalog).")
    gpus = serializers.IntegerField(min_value=1, max_value=2 ** 31 - 1, help_text="GPUs; an elastic job's minimum.")
    max_gpus = serializers.IntegerField(required=False, allow_null=True, min_value=1,
                                        help_text="Makes the job elastic: the most GPUs it may grow to (>= gpus).")
    script = serializers.IntegerField(required=False, help_text="Id from POST /api/scripts/.")
    script_path = serializers.CharField(required=False, help_text="Or a path inside the image.")
    project = serializers.IntegerField(required=False, help_text="Or a project: id from POST /api/projects/.")
    git = GitRequest(required=False, help_text="Or a git repository, fetched by the portal at submit.")
    entry_point = serializers.CharField(required=False, help_text="With project or git: its .py file the job runs.")
    args = serializers.ListField(child=serializers.CharField(), required=False)
    env = serializers.DictField(child=serializers.CharField(), required=False)
    launcher = serializers.ChoiceField(choices=launchers.choices(), required=False,
                                       help_text="What starts the ranks; one the image carries (GET /api/images/). "
                                                 "Default: the image's, horovod where it carries both.")
    backend = serializers.CharField(required=False, help_text="An enabled backend (settings.RINGMASTER_BACKENDS; "
                                                               "by default local, instances, kubernetes).")
    gpu_model = serializers.CharField(required=False, help_text="Only GPUs whose nvidia-smi name contains this "
                                                                "(e.g. A100); local and instances backends.")
    name = serializers.CharField(required=False)
    time_limit_minutes = serializers.IntegerField(required=False, min_value=1)
    group = serializers.CharField(required=False, help_text="Group to charge (one of yours); default: your default group.")
    priority = serializers.IntegerField(required=False, help_text="Staff only; higher runs first (default 0).")
    tags = tags_field()
    note = note_field()
    checkpoint_pattern = serializers.CharField(
        required=False, help_text="A glob (e.g. *.pt) naming checkpoints among the job's artifacts; "
                                  "POST /api/jobs/<id>/rerun-from-checkpoint/ starts from the newest.")
    max_restarts = serializers.IntegerField(
        required=False, min_value=0, help_text="How many times the job is restarted after an attempt fails with a "
                                               "cause below (default 0; at most the site's RINGMASTER_MAX_RESTARTS_CAP). "
                                               "A restart resumes from the newest checkpoint (checkpoint_pattern).")
    restart_on_exit_codes = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=255),
                                                  required=False, help_text="Exit codes that earn a restart, e.g. [137].")
    restart_on = serializers.ListField(child=serializers.ChoiceField(choices=RESTART_CAUSES), required=False,
                                       help_text="Other causes that earn a restart: a rank killed by a signal, "
                                                 "out of memory, a lost host, preemption.")

    def get_fields(self):
        """With the enabled backends' own fields (Backend.api_fields, e.g. kubernetes' cluster)."""
        fields = super().get_fields()
        for backend in backends.enabled():
            for name, field in backend.api_fields().items():
                fields.setdefault(name, serializers.CharField(required=False, help_text=field.help_text))
        return fields


class JobUpdateRequest(serializers.Serializer):
    """Documents PATCH /api/jobs/<id>/: the job's tags and note, the only fields that can change
    (any other is refused, named); validation is jobs.web.forms.JobNotesForm."""

    tags = tags_field()
    note = note_field()


class QuotaScopeSerializer(serializers.Serializer):
    scope = serializers.ChoiceField(choices=["user", "group"])
    name = serializers.CharField()
    backend = serializers.CharField(allow_null=True, help_text="null: all backends together.")
    source = serializers.CharField(help_text='"site default", "quota", or "quota and site default".')
    limits = serializers.DictField(help_text="gpus, jobs, gpus_per_job, gpu_hours (null: no limit), window_days.")
    use = serializers.DictField(help_text="gpus and jobs running now, gpu_hours in the window.")
    lines = serializers.ListField(child=serializers.CharField())


class QuotaSerializer(serializers.Serializer):
    """GET /api/quota/: the caller's limits and current use (documents the shape)."""

    user = serializers.CharField()
    groups = serializers.ListField(child=serializers.CharField())
    default_group = serializers.CharField(allow_null=True)
    limits = serializers.DictField(help_text="Your own limits on all backends (the first scope).")
    use = serializers.DictField()
    scopes = QuotaScopeSerializer(many=True)
    storage = serializers.DictField(help_text="Artifacts of your jobs kept now (used_bytes) and the most they may "
                                              "take (limit_bytes; null: no limit).")


class ScriptUploadRequest(serializers.Serializer):
    file = serializers.FileField()


class ProjectUploadRequest(serializers.Serializer):
    file = serializers.FileField(help_text="A .zip or .tar.gz of the project.")


# --- what the API answers, for the OpenAPI schema (the views build these dicts themselves) --------
class ErrorsSerializer(serializers.Serializer):
    """400: the message(s) of each field that was refused ("non_field_errors": of the whole)."""
    non_field_errors = serializers.ListField(child=serializers.CharField(), required=False)

    class Meta:
        ref_name = "FieldErrors"


class DetailSerializer(serializers.Serializer):
    """401, 403, 404, 409: what went wrong, in one sentence."""
    detail = serializers.CharField()


class JobPageSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = JobSerializer(many=True)


class LogPageSerializer(serializers.Serializer):
    lines = LogLineSerializer(many=True)
    next = serializers.IntegerField(help_text="Pass as `since` for the following page.")
    prev = serializers.IntegerField(help_text="Pass as `before` for the page above.")


class MetricPointSerializer(serializers.Serializer):
    rank = serializers.JSONField(help_text='A rank number, or "launcher".')
    step = serializers.IntegerField(allow_null=True)
    value = serializers.FloatField()
    ts = serializers.DateTimeField()
    seq = serializers.IntegerField()


class SystemSampleSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    ts = serializers.DateTimeField()
    host = serializers.CharField()
    device = serializers.CharField(help_text='"gpu<index>", or "cpu" for the job\'s processes on a host without GPUs.')
    utilization = serializers.FloatField(allow_null=True, help_text="%")
    memory_used = serializers.FloatField(allow_null=True, help_text="MiB")
    memory_total = serializers.FloatField(allow_null=True, help_text="MiB")
    power = serializers.FloatField(allow_null=True, help_text="W")


class SystemMetricsSerializer(serializers.Serializer):
    collected = serializers.BooleanField(help_text="Whether this backend samples a running job's hosts.")
    note = serializers.CharField(help_text="Where nothing is collected: why.")
    hint = serializers.CharField(help_text='"GPU utilization 12% over the last 10 minutes: ...", or empty.')
    samples = SystemSampleSerializer(many=True)


class MetricsSerializer(serializers.Serializer):
    series = serializers.DictField(child=MetricPointSerializer(many=True),
                                   help_text="Training metrics by name, each a list of points.")
    system = SystemMetricsSerializer()
