"""The kubernetes backend's tables: the clusters it runs jobs on, the Kueue queues of groups
and users there, and the cluster of each of its jobs.

Cluster and QueueMapping keep the table names they had as models of the jobs app (jobs_cluster,
jobs_queuemapping): migrations/0001 took them over without touching the database.
"""
from django.conf import settings
from django.contrib.auth.models import Group
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q


class Cluster(models.Model):
    """A Kubernetes cluster with the Kubeflow MPI operator, where `kubernetes` jobs run as MPIJobs.

    The portal connects with its own service account (in-cluster) or with a kubeconfig, stored
    encrypted (jobs.secrets) and never shown back. What the MPIJobs look like on it (namespace,
    GPUs per node, placement, resources, run policy) is set here, per cluster.
    """

    class Connection(models.TextChoices):
        KUBECONFIG = "kubeconfig", "A kubeconfig (stored encrypted)"
        IN_CLUSTER = "in-cluster", "The portal's own service account (it runs in this cluster)"

    class MPIJobCommand(models.TextChoices):
        MPIRUN = "mpirun", "mpirun --tag-output (as mpi-operator's examples)"
        HOROVODRUN = "horovodrun", "horovodrun"

    class CleanPodPolicy(models.TextChoices):
        RUNNING = "Running", "Running: delete the workers still running when the job ends"
        ALL = "All", "All: delete every worker when the job ends"
        NONE = "None", "None: keep the workers"

    name = models.CharField(max_length=100, unique=True)
    enabled = models.BooleanField(default=True)
    connection = models.CharField(max_length=20, choices=Connection.choices, default=Connection.KUBECONFIG)
    kubeconfig_encrypted = models.TextField(editable=False, blank=True)
    context = models.CharField(max_length=200, blank=True, help_text="kubeconfig context; empty: its current one.")
    namespace = models.CharField(
        max_length=63, default="default",
        help_text="Where MPIJobs go. {group} stands for the job's group (one namespace per group), "
                  "e.g. team-{group}.")
    gpus_per_node = models.PositiveIntegerField(verbose_name="GPUs per node", validators=[MinValueValidator(1)],
                                                help_text="A job is split into workers of at most this many GPUs.")
    node_selector = models.JSONField(default=dict, blank=True, help_text='For worker pods, e.g. {"gpu": "a100"}.')
    tolerations = models.JSONField(default=list, blank=True,
                                   help_text='For all pods, e.g. [{"key": "nvidia.com/gpu", "operator": "Exists"}].')
    priority_class = models.CharField(max_length=253, blank=True, help_text="priorityClassName of every pod.")
    kueue_queue = models.CharField(max_length=63, blank=True, verbose_name="Kueue queue",
                                   help_text="Sets the kueue.x-k8s.io/queue-name label: Kueue admits the jobs. "
                                             "The default LocalQueue; groups and users may have their own "
                                             "(Kueue queues below).")
    kueue_found = models.BooleanField(null=True, editable=False, verbose_name="Kueue found",
                                      help_text="Whether the last check found Kueue (its Workload kind) on the "
                                                "cluster; empty: not checked yet.")
    kueue_detail = models.CharField(max_length=300, blank=True, editable=False, verbose_name="Kueue check",
                                    help_text="What the last check found of Kueue.")
    mpijob_command = models.CharField(max_length=20, choices=MPIJobCommand.choices, default=MPIJobCommand.MPIRUN,
                                      verbose_name="MPIJob command",
                                      help_text="What the MPIJob's launcher pod runs to start a Horovod job's ranks.")
    training_runtime = models.CharField(
        max_length=253, default="torch-distributed",
        help_text="The ClusterTrainingRuntime (Kubeflow Trainer) that torchrun jobs' TrainJobs reference.")
    artifacts_volume = models.CharField(
        max_length=253, blank=True, validators=[RegexValidator(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
                                                               "A PersistentVolumeClaim's name (DNS-1123).")],
        help_text="A PersistentVolumeClaim in the job's namespace that its pods mount as RINGMASTER_OUTPUT_DIR, "
                  "each job under a sub-path of its own name; empty: none.")
    artifacts_path = models.CharField(
        max_length=500, blank=True, verbose_name="artifacts volume on the portal",
        help_text="Where the portal's web and worker see the same volume (mounted there too, ReadWriteMany): "
                  "the job page then lists and serves each job's files, counts them against the storage quota "
                  "and deletes them after the retention time. Empty: the portal does not read the volume.")
    cpu_per_gpu = models.FloatField(default=4, validators=[MinValueValidator(0.1)], verbose_name="CPUs per GPU")
    memory_per_gpu_gib = models.PositiveIntegerField(default=16, validators=[MinValueValidator(1)],
                                                     verbose_name="memory per GPU (GiB)")
    clean_pod_policy = models.CharField(max_length=10, choices=CleanPodPolicy.choices, default=CleanPodPolicy.RUNNING)
    backoff_limit = models.PositiveIntegerField(
        default=0, help_text="Launcher retries after a failure (each retry is a new launcher pod).")
    ttl_seconds_after_finished = models.PositiveIntegerField(default=3600)
    image_pull_grace_seconds = models.PositiveIntegerField(
        default=300, help_text="A job whose image cannot be pulled fails after this long.")
    gpu_limit = models.PositiveIntegerField(
        null=True, blank=True, verbose_name="GPUs at once",
        help_text="The most GPUs of this cluster's launching and running jobs together; more wait in "
                  "Ringmaster's queue. Empty: no limit (the cluster's scheduler or Kueue queues them).")

    class Meta:
        db_table = "jobs_cluster"
        ordering = ["name"]

    def __str__(self):
        return self.name

    def set_kubeconfig(self, text):
        from jobs.secrets import encrypt

        self.kubeconfig_encrypted = encrypt(text)

    def kubeconfig(self):
        from jobs.secrets import decrypt

        if not self.kubeconfig_encrypted:
            return ""
        return decrypt(self.kubeconfig_encrypted, f"the kubeconfig of cluster {self.name}",
                       f"store its kubeconfig again (the admin's Clusters, or manage.py add_cluster --name {self.name} ...)")


class QueueMapping(models.Model):
    """The Kueue LocalQueue a group's or a user's jobs on a cluster go to, in place of the
    cluster's default (Cluster.kueue_queue). A user's own mapping wins over their group's
    (clusters.queue_for). The LocalQueue may sit in the group's namespace."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="queue_mappings")
    # No database constraint on group and user: this app is installed only while its backend is
    # enabled, and a user or group deleted meanwhile must not be refused for a row Django cannot
    # see. Mappings left without theirs are dropped when the app migrates again (apps.py).
    group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.CASCADE, db_constraint=False,
                              related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                             db_constraint=False, related_name="+")
    queue = models.CharField(max_length=63, verbose_name="LocalQueue",
                             help_text="The kueue.x-k8s.io/queue-name label of these jobs.")

    class Meta:
        db_table = "jobs_queuemapping"
        ordering = ["cluster__name", "group__name", "user__username"]
        constraints = [
            models.CheckConstraint(
                condition=(Q(user__isnull=False, group__isnull=True) | Q(user__isnull=True, group__isnull=False)),
                name="queue_mapping_user_xor_group",
                violation_error_message="Give a user or a group, not both.",
            ),
            models.UniqueConstraint(fields=["cluster", "user"], condition=Q(user__isnull=False),
                                    name="queue_mapping_once_per_cluster_user"),
            models.UniqueConstraint(fields=["cluster", "group"], condition=Q(group__isnull=False),
                                    name="queue_mapping_once_per_cluster_group"),
        ]

    def __str__(self):
        who = f"user {self.user}" if self.user_id else f"group {self.group}"
        return f"{who} on {self.cluster}: {self.queue}"


class ClusterJob(models.Model):
    """The cluster a kubernetes job runs on, chosen at submission (KubernetesBackend.record).
    The job's own row names only its backend: the core keeps no reference into this app, which
    is installed only while the backend is enabled (hence no database constraint on `job`)."""

    job = models.OneToOneField("jobs.Job", primary_key=True, on_delete=models.CASCADE, db_constraint=False,
                               related_name="cluster_job")
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="cluster_jobs")

    def __str__(self):
        return f"job {self.job_id} on {self.cluster}"
