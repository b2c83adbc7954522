"""The domain: images, scripts, jobs, and what a job leaves behind (events, log lines, metrics).

A job's state changes only through jobs.domain.states.transition().
"""
from django.conf import settings
from django.contrib.auth.models import Group
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from runners import launchers


class Image(models.Model):
    """An entry of the admin-managed catalog. A job can only use an enabled image.

    For the Kubernetes backend an image is a container image reference. For the local and SSH
    backends it names the environment the job runs in: the Python interpreter that has Horovod.
    """

    name = models.CharField(max_length=100, unique=True)
    description = models.CharField(max_length=300, blank=True)
    container_image = models.CharField(
        max_length=300, blank=True, help_text="Container image for the Kubernetes backend."
    )
    python = models.CharField(
        max_length=300,
        default="python",
        help_text="Python interpreter (with Horovod or PyTorch) for the local and SSH backends.",
    )
    launchers = models.CharField(
        max_length=100, default=launchers.DEFAULT,
        help_text="The launchers the image carries, comma-separated: " + ", ".join(launchers.LAUNCHERS) + ".")
    max_processes = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="The most processes and threads a job of this image may have on each host (blank: the "
                  "site's default, RINGMASTER_JOB_MAX_PROCESSES; 0: no limit).")
    memory_mib = models.PositiveIntegerField(
        "memory (MiB)", null=True, blank=True,
        help_text="The most memory a job of this image may use on each host, in MiB (blank: the site's "
                  "default, RINGMASTER_JOB_MEMORY_MIB; 0: no limit).")
    enabled = models.BooleanField(default=True)
    extra_packages = models.BooleanField(
        default=True,
        help_text="Whether a project's requirements.txt (or pyproject.toml dependencies) is installed on top of "
                  "this image. Off: a project that names packages is refused with this image.")
    # The recovery policy of a job of this image that gives none (jobs.web.forms.JobForm), on a
    # backend that restarts jobs.
    default_max_restarts = models.PositiveIntegerField(
        default=0, help_text="Restarts of a job of this image that asks for none (on a backend that restarts jobs).")
    default_restart_on_exit_codes = models.JSONField(default=list, blank=True,
                                                     help_text="Their exit codes, e.g. [137].")
    default_restart_on = models.JSONField(default=list, blank=True,
                                          help_text="Their other causes: signal, oom, lost_host, preempted.")

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def job_limits(self):
        """(max processes, memory in MiB) of this image's jobs on each host: its own, else the
        site's; None where there is no limit."""
        processes = settings.RINGMASTER_JOB_MAX_PROCESSES if self.max_processes is None else self.max_processes
        memory = settings.RINGMASTER_JOB_MEMORY_MIB if self.memory_mib is None else self.memory_mib
        return processes or None, memory or None

    def launcher_names(self):
        """The launchers this image carries, in the order given."""
        return [name.strip() for name in self.launchers.split(",") if name.strip()]

    def clean(self):
        from django.core.exceptions import ValidationError

        names = self.launcher_names()
        unknown = [name for name in names if name not in launchers.LAUNCHERS]
        if unknown or not names:
            raise ValidationError({"launchers": f"Give one or more of {', '.join(launchers.LAUNCHERS)}, "
                                                f"comma-separated{f' (not {unknown[0]!r})' if unknown else ''}."})
        self._clean_recovery(ValidationError)

    def _clean_recovery(self, ValidationError):
        codes, causes = self.default_restart_on_exit_codes, self.default_restart_on
        if not isinstance(codes, list) or not all(type(code) is int and 1 <= code <= 255 for code in codes):
            raise ValidationError({"default_restart_on_exit_codes": "Give a list of exit codes from 1 to 255."})
        if not isinstance(causes, list) or not all(cause in RESTART_CAUSES for cause in causes):
            raise ValidationError({"default_restart_on": f"Give a list of {', '.join(RESTART_CAUSES)}."})
        if self.default_max_restarts > settings.RINGMASTER_MAX_RESTARTS_CAP:
            raise ValidationError({"default_max_restarts": f"At most {settings.RINGMASTER_MAX_RESTARTS_CAP} "
                                                           "(RINGMASTER_MAX_RESTARTS_CAP)."})
        if self.default_max_restarts and not codes and not causes:
            raise ValidationError({"default_max_restarts": "Name what earns a restart: exit codes or causes."})


class Script(models.Model):
    """An uploaded training script, kept by content hash. Owner None = the example library."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE)
    name = models.CharField(max_length=255)
    sha256 = models.CharField(max_length=64)
    size = models.PositiveIntegerField()
    content = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "name", "sha256"], name="script_once_per_owner"),
        ]

    def __str__(self):
        return f"{self.name} ({self.sha256[:12]})"


class Project(models.Model):
    """A snapshot of a project (runners.projects): its files as one packed archive, kept once per
    owner by their digest (the same tree uploaded twice is one snapshot)."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="projects")
    sha256 = models.CharField(max_length=64)
    files = models.PositiveIntegerField(help_text="How many files the project has.")
    size = models.BigIntegerField(help_text="Bytes of its files together.")
    listing = models.JSONField(default=list, help_text='[{"path", "size"}] in path order.')
    archive = models.BinaryField(help_text="The files, packed (runners.projects.pack).")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "sha256"], name="project_once_per_owner"),
        ]

    def __str__(self):
        return f"project {self.sha256[:12]}"


class GitCredential(models.Model):
    """A user's credential for private git repositories (jobs.domain.projects.store_git): a token
    for https, or an SSH deploy key (made by the portal, or given) for ssh://. The secret is
    stored encrypted (jobs.secrets) and never shown back; an SSH key's public half is shown, to be
    added to the repository as its deploy key."""

    class Kind(models.TextChoices):
        TOKEN = "token", "A token (https)"
        SSH_KEY = "ssh_key", "An SSH deploy key (ssh://)"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="git_credentials")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    secret_encrypted = models.TextField(editable=False)
    public_key = models.TextField(blank=True, editable=False, help_text="An SSH key's public half (OpenSSH).")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["owner", "id"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="git_credential_name_once_per_owner")]

    def __str__(self):
        return self.name


class State(models.TextChoices):
    QUEUED = "QUEUED"
    LAUNCHING = "LAUNCHING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


TERMINAL_STATES = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED})
ACTIVE_STATES = frozenset({State.LAUNCHING, State.RUNNING})

# What besides an exit code may earn a job a restart (Job.restart_on; jobs.domain.recovery says
# how each is recognised): a rank killed by a signal, the job out of memory, a host of the job
# lost, the job preempted.
RESTART_CAUSES = ("signal", "oom", "lost_host", "preempted")


def gpus_in_use(size, gpus):
    """The GPUs a job holds: its size once admitted (an elastic job's changes), else the GPUs it
    asked for. Quotas, admission, the capacity page, the API and runners all count by this rule;
    in_use_expression() is the same rule for a query."""
    return gpus if size is None else size


def in_use_expression(prefix=""):
    """gpus_in_use() as a query expression; `prefix` reaches a job through a relation ("jobs__")."""
    return Coalesce(f"{prefix}size", f"{prefix}gpus")


class Job(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="jobs")
    name = models.CharField(max_length=100, blank=True)
    image = models.ForeignKey(Image, on_delete=models.PROTECT, related_name="jobs")
    gpus = models.PositiveIntegerField(help_text="GPUs the job needs; an elastic job's minimum.")
    max_gpus = models.PositiveIntegerField(null=True, blank=True, verbose_name="most GPUs",
                                           help_text="Elastic: the job may grow to this many GPUs; blank: fixed size.")
    size = models.PositiveIntegerField(null=True, blank=True, verbose_name="current GPUs",
                                       help_text="GPUs the job holds while admitted (an elastic job's changes).")
    resized_at = models.DateTimeField(null=True, blank=True, editable=False,
                                      help_text="When the scheduler last changed a running elastic job's size.")
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="reruns",
                               help_text="The job this one was rerun from.")
    script = models.ForeignKey(Script, null=True, blank=True, on_delete=models.PROTECT, related_name="jobs")
    script_path = models.CharField(max_length=1024, blank=True)
    project = models.ForeignKey(Project, null=True, blank=True, on_delete=models.PROTECT, related_name="jobs")
    entry_point = models.CharField(max_length=1024, blank=True, help_text="The project's file the job runs.")
    # A project fetched from git: the repository, and the commit its ref resolved to at submit
    # (the snapshot itself is shared with any upload of the same files).
    project_url = models.CharField(max_length=2048, blank=True, help_text="The git repository the project came from.")
    project_commit = models.CharField(max_length=64, blank=True, help_text="The git commit the project's files are.")
    args = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    launcher = models.CharField(max_length=20, default=launchers.DEFAULT, choices=launchers.choices(),
                                help_text="What starts the job's ranks.")
    backend = models.CharField(max_length=20, default="local",
                               help_text="The name of an enabled backend (settings.RINGMASTER_BACKENDS).")
    time_limit_minutes = models.PositiveIntegerField()
    gpu_model = models.CharField(max_length=100, blank=True, verbose_name="GPU model",
                                 help_text="Run only on GPUs whose name contains this (e.g. A100); blank: any.")
    # The owner's own words about the job: tags to find it by (a JSON list of strings, filtered
    # with tags__has_tags, jobs.lookups) and a note.
    tags = models.JSONField(default=list, blank=True, help_text="Labels to find the job by, e.g. baseline, lr-sweep.")
    note = models.TextField(blank=True, help_text="Why the job was run, what came of it.")

    # Artifacts: the files its ranks write under RINGMASTER_OUTPUT_DIR (jobs.domain.artifacts).
    checkpoint_pattern = models.CharField(max_length=200, blank=True,
                                          help_text="A glob (e.g. *.pt) naming the job's checkpoints among its "
                                                    "artifacts; a rerun from checkpoint starts from the newest.")
    checkpoint = models.CharField(max_length=1024, blank=True, editable=False,
                                  help_text="The artifact it starts from (RINGMASTER_CHECKPOINT): the parent's "
                                            "(a rerun from checkpoint), or its own (a restart).")
    artifacts_bytes = models.BigIntegerField(default=0, editable=False,
                                             help_text="Bytes of artifacts kept for the job (the storage quota).")
    artifacts_note = models.CharField(max_length=500, blank=True, editable=False,
                                      help_text="Why the job's artifacts were not all kept (over the storage quota).")
    artifacts_deleted_at = models.DateTimeField(null=True, blank=True, editable=False,
                                                help_text="When retention deleted the job's artifacts.")

    # Recovery (jobs.domain.recovery): an attempt that fails with a cause of the policy starts the
    # next one, from the job's newest checkpoint, while restarts remain.
    max_restarts = models.PositiveIntegerField(default=0, help_text="How many times the job may be restarted.")
    restart_on_exit_codes = models.JSONField(default=list, blank=True,
                                             help_text="Exit codes that earn a restart, e.g. [137].")
    restart_on = models.JSONField(default=list, blank=True,
                                  help_text="Other causes that earn a restart: signal, oom, lost_host, preempted.")
    attempt = models.PositiveIntegerField(default=1, editable=False, help_text="The number of the current attempt.")
    restart_after = models.DateTimeField(null=True, blank=True, editable=False,
                                         help_text="A restarted job waits until then (the backoff).")
    checkpoint_own = models.BooleanField(default=False, editable=False,
                                         help_text="The checkpoint is the job's own (a restart's), not its parent's.")

    # Scheduling: higher priority first, then earlier submission (jobs.domain.scheduler.admit). The job's
    # GPUs count against its owner's quota and against the quota of the group it is charged to.
    priority = models.IntegerField(default=0)
    charged_group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.SET_NULL,
                                      related_name="charged_jobs", verbose_name="group")
    held = models.BooleanField(default=False, help_text="A held job stays queued until released.")
    held_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="+")

    state = models.CharField(max_length=20, choices=State.choices, default=State.QUEUED, db_index=True)
    reason = models.CharField(max_length=500, blank=True)
    waits_for = models.CharField(max_length=20, blank=True, editable=False,
                                 help_text="While queued: the kind of its wait (quota, capacity, held, ...: "
                                           "jobs.backends.waits), the words of which are its reason.")
    exit_code = models.IntegerField(null=True, blank=True)
    failed_rank = models.IntegerField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    gpu_seconds = models.FloatField(default=0)

    # Following the output: the next log seq, the bytes of launcher output already stored, and
    # the splitter's pending state at that offset. All three change together, under the row lock.
    next_seq = models.BigIntegerField(default=0)
    output_offset = models.BigIntegerField(default=0)
    output_state = models.JSONField(default=dict, blank=True)
    follow_cursor = models.JSONField(default=dict, blank=True,
                                     help_text="Where a runner that cannot seek by offset resumes (Kubernetes).")
    follower = models.CharField(max_length=200, blank=True)
    follower_heartbeat = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # The job list (newest first), everyone's and one owner's.
            models.Index(fields=["-created_at", "-id"], name="job_newest"),
            models.Index(fields=["owner", "-created_at", "-id"], name="job_owner_newest"),
            # The scheduler's order over queued jobs, and queue positions.
            models.Index(fields=["state", "-priority", "created_at", "id"], name="job_queue_order"),
            # Usage in a rolling window: jobs that ended since a moment.
            models.Index(fields=["finished_at"], name="job_finished_at"),
        ]

    def __str__(self):
        return self.display_name

    @property
    def display_name(self):
        return self.name or f"job-{self.pk}"

    @property
    def is_terminal(self):
        return self.state in TERMINAL_STATES

    @property
    def gpus_in_use(self):
        return gpus_in_use(self.size, self.gpus)

    @property
    def script_name(self):
        if self.project_id:
            return self.entry_point
        return self.script.name if self.script_id else self.script_path


class JobAttempt(models.Model):
    """One run of a job: the first, and one more per restart (jobs.domain.recovery). Made when the
    scheduler admits the job; `started` once it runs; `ended` with its exit code and reason once
    it ends. Its log lines are the job's from `first_seq` to the next attempt's."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    started = models.DateTimeField(null=True, blank=True)
    ended = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    reason = models.CharField(max_length=500, blank=True)
    gpu_seconds = models.FloatField(default=0)
    first_seq = models.BigIntegerField(default=0, help_text="The seq of its first log line.")

    class Meta:
        ordering = ["job", "number"]
        constraints = [models.UniqueConstraint(fields=["job", "number"], name="attempt_once")]


class JobEvent(models.Model):
    """Every state change and notable message of a job, with its time."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    ts = models.DateTimeField(auto_now_add=True)
    state = models.CharField(max_length=20, choices=State.choices, blank=True)
    message = models.TextField(blank=True)
    gpus = models.PositiveIntegerField(null=True, blank=True, help_text="The job's size from this event on.")

    class Meta:
        ordering = ["ts", "id"]


class LogLine(models.Model):
    """One line of one rank's output. seq is per job, gap-free, from 0."""

    id = models.BigAutoField(primary_key=True)
    # Output is the largest, fastest-growing table. No foreign key in the database: PostgreSQL
    # would check it row by row at each commit, a large share of a big batch's commit. Rows are
    # written only under the job's row lock, and a job's delete takes that lock first
    # (jobs.domain.receivers), so no line outlives its job; Django deletes them with it.
    # No index of its own either: the job's (job, seq) ones begin with it.
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_lines", db_constraint=False,
                            db_index=False)
    seq = models.BigIntegerField()
    rank = models.IntegerField(null=True, blank=True, help_text="None: the launcher's own lines.")
    stream = models.CharField(max_length=6)
    ts = models.DateTimeField()
    text = models.TextField()

    class Meta:
        ordering = ["job", "seq"]
        constraints = [models.UniqueConstraint(fields=["job", "seq"], name="log_seq_unique")]
        indexes = [models.Index(fields=["job", "rank", "seq"], name="log_rank_seq")]


class MetricPoint(models.Model):
    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="metric_points", db_constraint=False,
                            db_index=False)     # as LogLine.job, and written with it
    rank = models.IntegerField(null=True, blank=True)
    seq = models.BigIntegerField(default=0, help_text="The log line it was read from.")
    step = models.BigIntegerField()
    name = models.CharField(max_length=100)
    value = models.FloatField()
    ts = models.DateTimeField()

    class Meta:
        ordering = ["job", "name", "step", "id"]
        indexes = [
            models.Index(fields=["job", "name", "step"], name="metric_name_step"),
            models.Index(fields=["job", "seq"], name="metric_seq"),
        ]


class SchedulerLock(models.Model):
    """One row, locked FOR UPDATE while admitting, so admission decisions never race."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)


class Quota(models.Model):
    """Limits for one user or one group (a team), on all backends together or on one backend.

    An empty limit means: for a user's all-backends row, the site default (settings
    RINGMASTER_DEFAULT_QUOTA_*); for a group's row or a per-backend row, no limit of that kind.
    A user without any row gets the site default. All the rows that apply to a job must hold:
    its owner's, and those of the group it is charged to (pooled across the group's members).
    Changes made in the admin are kept in its history (who, when, what).
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="quotas")
    group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.CASCADE, related_name="quotas")
    backend = models.CharField(max_length=20, blank=True,
                               help_text="Empty: the limits hold for all backends together.")
    gpus = models.PositiveIntegerField(null=True, blank=True, verbose_name="GPUs at once",
                                       help_text="GPUs of launching and running jobs together.")
    jobs = models.PositiveIntegerField(null=True, blank=True, verbose_name="jobs at once",
                                       help_text="Launching and running jobs together.")
    gpus_per_job = models.PositiveIntegerField(null=True, blank=True, verbose_name="GPUs per job",
                                               help_text="A larger job is refused when it is submitted.")
    gpu_hours = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0)],
                                  verbose_name="GPU-hours per window",
                                  help_text="GPUs x running time, over the last `window days` (a rolling window).")
    window_days = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)],
                                              help_text="Length of the GPU-hours window; empty: the site default.")
    storage_gb = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0)],
                                   verbose_name="artifact storage (GB)",
                                   help_text="A user's all-backends row: the artifacts of their jobs kept at once; "
                                             "empty: no limit.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["group__name", "user__username", "backend"]
        constraints = [
            models.CheckConstraint(
                condition=(Q(user__isnull=False, group__isnull=True) | Q(user__isnull=True, group__isnull=False)),
                name="quota_user_xor_group",
                violation_error_message="Give a user or a group, not both.",
            ),
            models.UniqueConstraint(fields=["user", "backend"], condition=Q(user__isnull=False),
                                    name="quota_once_per_user_backend"),
            models.UniqueConstraint(fields=["group", "backend"], condition=Q(group__isnull=False),
                                    name="quota_once_per_group_backend"),
        ]

    def __str__(self):
        who = f"user {self.user}" if self.user_id else f"group {self.group}"
        return f"{who} on {self.backend}" if self.backend else who


class UserSettings(models.Model):
    """Per-user choices: the group a job is charged to when the submission names none."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, primary_key=True, on_delete=models.CASCADE,
                                related_name="ringmaster_settings")
    default_group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                                      help_text="Charged when a job names no group (must be one of the user's groups).")

    class Meta:
        verbose_name = "user settings"
        verbose_name_plural = "user settings"

    def __str__(self):
        return f"settings of {self.user}"


class ApiToken(models.Model):
    """A user's API token (one at most), kept as the SHA-256 of its key: the database holds nothing
    that signs in. The key is shown once, when it is made (jobs.domain.tokens)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, primary_key=True, on_delete=models.CASCADE,
                                related_name="api_token")
    digest = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(auto_now_add=True)
    # When it stops working (RINGMASTER_API_TOKEN_DAYS after it was made); none: never.
    expires = models.DateTimeField(null=True, blank=True)
    # A read-only token may only read (GET, HEAD, OPTIONS); anything else is 403.
    read_only = models.BooleanField(default=False)

    def __str__(self):
        return f"API token of {self.user}"

    @property
    def expired(self):
        return self.expires is not None and self.expires <= timezone.now()


class SsoGroup(models.Model):
    """Marks a group whose members the directory decides (jobs.domain.directory): made, or taken
    over, when a sign-on's groups claim first names it. Groups without this mark (made by hand in
    the admin and never named by the claim) keep the members an admin gives them."""

    group = models.OneToOneField(Group, primary_key=True, on_delete=models.CASCADE, related_name="sso")
    since = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "group kept by single sign-on"
        verbose_name_plural = "groups kept by single sign-on"

    def __str__(self):
        return str(self.group)


class SlotAllocation(models.Model):
    """GPU slots a job holds on one host, from admission until the job ends (any way): a host of
    its backend (an instance: `host_id` is the id of the backend's own row), or this machine
    (host_id null). `gpu_indices` are the nvidia-smi indices the job owns there (its ranks on
    that host see only these: CUDA_VISIBLE_DEVICES); empty where the host has no GPUs the portal
    could see (CPU slots)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="allocations")
    host_id = models.BigIntegerField(null=True, blank=True, db_column="instance_id",
                                          help_text="The backend's host row (an Instance); empty: this machine.")
    slots = models.PositiveIntegerField()
    position = models.PositiveSmallIntegerField(help_text="0: the host that runs horovodrun.")
    gpu_indices = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["job", "position"]
        constraints = [models.UniqueConstraint(fields=["job", "host_id"], name="slots_once_per_job_instance")]


class SystemSample(models.Model):
    """What a job's host showed at one moment: one GPU of the job (utilization %, memory MiB,
    power W, from nvidia-smi), or, on a host without GPUs, the job's processes there (device
    "cpu": CPU % of one core summed over processes, resident memory MiB)."""

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="system_samples")
    ts = models.DateTimeField()
    host = models.CharField(max_length=100)
    device = models.CharField(max_length=20, help_text='"gpu<index>" or "cpu".')
    utilization = models.FloatField(null=True, blank=True)
    memory_used = models.FloatField(null=True, blank=True)
    memory_total = models.FloatField(null=True, blank=True)
    power = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["job", "ts", "id"]
        indexes = [models.Index(fields=["job", "id"], name="system_sample_job")]


class Installation(models.Model):
    """This portal's id: part of every name it gives outside its database (job folders on
    instances, MPIJobs and their labels), so two portals that reach the same instance or
    namespace, or one portal whose database was reset, never take each other's jobs. Made once,
    at random, with the database (jobs.installation); RINGMASTER_INSTALLATION_ID overrides it."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    ident = models.CharField(max_length=12, help_text="Lowercase letters and digits.")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return self.ident


class NotificationPreferences(models.Model):
    """Which of a user's jobs' events reach their notification targets (jobs.domain.notifications).
    A user without a row gets the defaults: a job's end, and nothing else."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, primary_key=True, on_delete=models.CASCADE,
                                related_name="notification_preferences")
    on_end = models.BooleanField(default=True, verbose_name="a job ends",
                                 help_text="Succeeded, failed or cancelled.")
    on_wait = models.BooleanField(default=False, verbose_name="a job waits long",
                                  help_text="Still queued after the minutes below.")
    wait_minutes = models.PositiveIntegerField(default=30, validators=[MinValueValidator(1)],
                                               verbose_name="waiting minutes")
    on_idle = models.BooleanField(default=False, verbose_name="a job's GPUs sit idle",
                                  help_text="Running, with every GPU below the site's idle threshold for the "
                                            "minutes below.")
    idle_minutes = models.PositiveIntegerField(default=30, validators=[MinValueValidator(1)],
                                               verbose_name="idle minutes")

    class Meta:
        verbose_name = "notification preferences"
        verbose_name_plural = "notification preferences"

    def __str__(self):
        return f"notification preferences of {self.user}"


class NotificationTarget(models.Model):
    """Where a user's notifications go: an e-mail address (Django's mail), an Apprise URL (Slack,
    Teams, Discord, ntfy, ...), or a webhook (a JSON POST signed with the target's secret). The
    address or URL and the secret are stored encrypted (jobs.secrets) and never shown back;
    `shown` is what the pages show of it (an Apprise URL with its tokens masked)."""

    class Kind(models.TextChoices):
        EMAIL = "email", "E-mail"
        APPRISE = "apprise", "Chat (an Apprise URL: Slack, Teams, Discord, ntfy, ...)"
        WEBHOOK = "webhook", "Webhook (a signed JSON POST)"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                              related_name="notification_targets")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    name = models.CharField(max_length=100, blank=True)
    address_encrypted = models.TextField(editable=False)
    secret_encrypted = models.TextField(editable=False, blank=True)
    shown = models.CharField(max_length=300, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["owner", "id"]

    def __str__(self):
        return self.name or self.shown

    def set_address(self, text):
        from jobs.secrets import encrypt

        self.address_encrypted = encrypt(text)

    def address(self):
        from jobs.secrets import decrypt

        return decrypt(self.address_encrypted, f"notification target {self.pk}", "add the target again")

    def set_secret(self, text):
        from jobs.secrets import encrypt

        self.secret_encrypted = encrypt(text) if text else ""

    def secret(self):
        from jobs.secrets import decrypt

        if not self.secret_encrypted:
            return ""
        return decrypt(self.secret_encrypted, f"the secret of notification target {self.pk}", "add the target again")


class NotificationDelivery(models.Model):
    """One notification to one target, and how its delivery went (the target's log)."""

    class Event(models.TextChoices):
        ENDED = "ended", "job ended"
        WAITING = "waiting", "job waits long"
        IDLE = "idle", "GPUs idle"
        TEST = "test", "test"

    class Status(models.TextChoices):
        QUEUED = "queued", "queued"
        RETRYING = "retrying", "failed, will retry"
        DELIVERED = "delivered", "delivered"
        FAILED = "failed", "failed"

    id = models.BigAutoField(primary_key=True)
    target = models.ForeignKey(NotificationTarget, on_delete=models.CASCADE, related_name="deliveries")
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    event = models.CharField(max_length=10, choices=Event.choices)
    payload = models.JSONField(default=dict)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    attempts = models.PositiveIntegerField(default=0)
    detail = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["target", "-id"], name="delivery_target_newest")]


class JobNotice(models.Model):
    """That a job's owner was notified of one kind of event: each kind once per job."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=10, choices=NotificationDelivery.Event.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "kind"], name="job_notice_once_per_kind")]


class AllowedNetwork(models.Model):
    """An address range the portal may connect to on a user's behalf although it is private,
    loopback, link-local or this machine's (jobs.domain.destinations): set by an admin."""

    network = models.CharField(max_length=50, unique=True, help_text="An address range, e.g. 10.20.0.0/16 or fd00::/8.")
    note = models.CharField(max_length=200, blank=True)

    class Meta:
        abstract = True
        ordering = ["network"]

    def __str__(self):
        return self.network

    def clean(self):
        import ipaddress

        from django.core.exceptions import ValidationError

        try:
            self.network = str(ipaddress.ip_network(self.network.strip(), strict=False))
        except ValueError:
            raise ValidationError({"network": "Give an address range, e.g. 10.20.0.0/16."}) from None


class NotifyAllowedNetwork(AllowedNetwork):
    """A network notification targets may point at (an intranet chat server, say), beside the
    setting RINGMASTER_NOTIFY_ALLOWED_NETWORKS."""

    class Meta(AllowedNetwork.Meta):
        verbose_name = "network allowed for notifications"
        verbose_name_plural = "networks allowed for notifications"


class GitAllowedNetwork(AllowedNetwork):
    """A network git repositories may be fetched from (an intranet git server, say), beside the
    setting RINGMASTER_GIT_ALLOWED_NETWORKS. A list of its own: allowing notifications to reach
    a network does not let users' fetches read from it."""

    class Meta(AllowedNetwork.Meta):
        verbose_name = "network allowed for git repositories"
        verbose_name_plural = "networks allowed for git repositories"


class Study(models.Model):
    """A hyperparameter search (jobs.domain.studies): one base job tried with the values Optuna
    picks for its placeholders, each trial an ordinary job. Optuna keeps its own record of the
    study (named optuna_name) in its tables of this database; these rows are what the portal
    shows and what keeps a trial from being submitted twice."""

    class State(models.TextChoices):
        RUNNING = "RUNNING"
        DONE = "DONE"
        STOPPED = "STOPPED"
        FAILED = "FAILED"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="studies")
    name = models.CharField(max_length=100)
    spec = models.JSONField(help_text="base, space, objective, trials, parallel, sampler, pruner (as submitted).")
    state = models.CharField(max_length=10, choices=State.choices, default=State.RUNNING, db_index=True)
    reason = models.CharField(max_length=500, blank=True, help_text="Why the study stopped or failed.")
    optuna_name = models.CharField(max_length=100, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "studies"

    def __str__(self):
        return f"study {self.pk} ({self.name})"


class Trial(models.Model):
    """One trial of a study: the parameters Optuna asked for, and the job that ran them (its record:
    a trial with a job is never submitted again)."""

    class State(models.TextChoices):
        RUNNING = "RUNNING"         # its job is queued or running
        COMPLETE = "COMPLETE"
        PRUNED = "PRUNED"
        FAIL = "FAIL"

    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="trials")
    number = models.IntegerField(help_text="Optuna's trial number.")
    optuna_id = models.BigIntegerField(help_text="Optuna's trial id (its storage's key).")
    params = models.JSONField(default=dict)
    state = models.CharField(max_length=10, choices=State.choices, default=State.RUNNING)
    value = models.FloatField(null=True, blank=True, help_text="The objective as the trial's job reported it.")
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    retry_of = models.IntegerField(null=True, blank=True, help_text="The number of the failed trial this one retries.")
    reason = models.CharField(max_length=500, blank=True)
    last_step = models.BigIntegerField(default=-1, help_text="The last step reported to Optuna (pruning).")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["study", "number"]
        constraints = [models.UniqueConstraint(fields=["study", "number"], name="trial_number_once")]
