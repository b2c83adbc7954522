"""The kubernetes backend: each job an MPIJob (kubeflow.org/v2beta1; Horovod) or a TrainJob
(trainer.kubeflow.org/v1alpha1; torchrun) on a registered cluster, through the official client
(runners.kubernetes); connection and job settings per cluster live in clusters.py."""
import os
from pathlib import Path

from django import forms
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db.models import Count, Q, Sum
from django.urls import reverse

from jobs.backends.base import Admission, Backend, CapacityTable
from jobs.backends.kubernetes import clusters
from jobs.backends.kubernetes.clusters import (ClusterError, builder_of, cluster_of, default_cluster, namespace_for,
                                               render, runner_for)
from jobs.backends.kubernetes.models import Cluster, ClusterJob
from jobs.backends.waits import Wait
from jobs.models import ACTIVE_STATES, State, in_use_expression
from jobs.installation import installation_id
from runners import mpijob, trainjob
from runners.base import job_name


class ClusterAdmission(Admission):
    """GPUs of launching and running jobs per cluster (an elastic job's size now), against each
    cluster's `gpu_limit` (read once per pass). A cluster without a limit queues the jobs itself,
    and the portal grows no elastic job there: it cannot see which GPUs are free. Nor does it
    resize a job that goes through Kueue (clusters.KUEUE_RESIZES_NO_MPIJOB)."""

    def __init__(self, backend, book):
        super().__init__(backend, book)
        limited = Cluster.objects.filter(gpu_limit__isnull=False)
        self.limits = {cluster.pk: (cluster.name, cluster.gpu_limit) for cluster in limited}
        self.clusters = {cluster.pk: cluster for cluster in limited}
        self.in_use = dict(ClusterJob.objects.filter(job__backend=backend.name, job__state__in=ACTIVE_STATES,
                                                     cluster__in=list(self.limits)).order_by()
                           .values_list("cluster").annotate(n=Sum(in_use_expression("job__")))
                           .values_list("cluster", "n"))
        # The cluster of each job the pass may ask about: the queued ones and the running ones.
        self.cluster_of = dict(ClusterJob.objects.filter(job__backend=backend.name,
                                                         job__state__in=[State.QUEUED, *ACTIVE_STATES])
                               .values_list("job_id", "cluster_id"))
        self.per_node = {}

    def _cluster_id(self, job):
        if job.pk not in self.cluster_of:
            self.cluster_of[job.pk] = ClusterJob.objects.filter(job_id=job.pk).values_list("cluster_id",
                                                                                          flat=True).first()
        return self.cluster_of[job.pk]

    def capacity_key(self, job):
        return ("capacity", self.backend.name, self._cluster_id(job))

    def behind(self, job):
        return Wait("cluster_behind")

    def why_waiting(self, job):
        cluster = self._cluster_id(job)
        if cluster not in self.limits:
            return None
        name, limit = self.limits[cluster]
        in_use = self.in_use.get(cluster, 0)
        if in_use + job.gpus > limit:
            return Wait("cluster_capacity", cluster=name, in_use=in_use, limit=limit, gpus=job.gpus)
        return None

    def charge(self, job):
        cluster = self._cluster_id(job)
        self.in_use[cluster] = self.in_use.get(cluster, 0) + job.gpus

    # --- elastic jobs: a worker's GPUs at a time, within the cluster's limit ------------------
    def room(self, job):
        cluster = self._cluster_id(job)
        if cluster not in self.limits:
            return 0
        return max(self.limits[cluster][1] - self.in_use.get(cluster, 0), 0)

    def shares_capacity(self, job, other):
        return self._cluster_id(job) == self._cluster_id(other)

    def fixed_size(self, job):
        cluster = self.clusters.get(self._cluster_id(job))
        queue = cluster is not None and clusters.queue_of(cluster, job.owner_id, job.group_id)
        return f"in Kueue queue {queue} on cluster {cluster.name}; {clusters.KUEUE_RESIZES_NO_MPIJOB}" if queue else ""

    def step(self, job):
        cluster = self._cluster_id(job)
        if cluster not in self.per_node:
            self.per_node[cluster] = Cluster.objects.get(pk=cluster).gpus_per_node
        return mpijob.elastic_slots(job.gpus, job.max_gpus, self.per_node[cluster])

    def where(self, job):
        cluster = self._cluster_id(job)
        return f"on cluster {self.limits[cluster][0]}" if cluster in self.limits else "on its cluster"

    def resize(self, job, size):
        cluster = self._cluster_id(job)
        self.in_use[cluster] = self.in_use.get(cluster, 0) + size - job.gpus_in_use


def _enabled_clusters():
    return Cluster.objects.filter(enabled=True)


def _cluster_names():
    return ", ".join(_enabled_clusters().values_list("name", flat=True))


class KubernetesBackend(Backend):
    name = "kubernetes"
    label = "Kubernetes"
    # A job stays LAUNCHING while the cluster schedules it and pulls its image, and its launch is
    # an idempotent create: reconcile re-attaches to it rather than failing it.
    launch_times_out = False
    admission_class = ClusterAdmission
    # Resized by scaling the MPIJob's Worker replicas (runners.kubernetes.KubernetesRunner.resize).
    elastic = True
    check_every = 300       # reachable, and whether Kueue runs there (kept on the cluster)
    collects_system_metrics = False
    system_metrics_note = ("System metrics are not collected on Kubernetes: the portal reads no metrics source "
                           "of the cluster (its own monitoring, e.g. NVIDIA's DCGM exporter, shows the pods' GPUs).")
    artifacts_note = ("The portal does not read this cluster's artifacts: what a job writes stays on the cluster's "
                      "artifacts volume, where the admin names one, and the portal lists it once the admin mounts "
                      "that volume on the portal too (deploy/KUBERNETES.md).")

    # A rerun's pods mount the parent's sub-path of the volume read-only (runners.mpijob.artifacts_volume).
    takes_checkpoints = True
    # A project reaches every pod in the job's ConfigMap, unpacked there before the ranks start
    # (runners.mpijob.PROJECT_ARCHIVE): one that packs into more than MAX_PROJECT_BYTES is refused.
    runs_projects = True

    def artifacts_root(self, job):
        """The job's sub-path of its cluster's artifacts volume, where the portal mounts it too
        (Cluster.artifacts_path); None where it does not."""
        cluster = cluster_of(job)
        if cluster is None or not cluster.artifacts_volume or not cluster.artifacts_path:
            return None
        return Path(cluster.artifacts_path) / job_name(installation_id(), job.pk)

    def seed(self, stdout, stderr):
        """KUBECONFIG (a file) registers the cluster "default" once: its context's namespace (or
        RINGMASTER_KUBE_NAMESPACE), RINGMASTER_KUBE_GPUS_PER_NODE GPUs per node (default 8)."""
        path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
        if not path or Cluster.objects.filter(name="default").exists():
            return
        namespace = os.environ.get("RINGMASTER_KUBE_NAMESPACE", "") or clusters.kubeconfig_namespace(path)
        try:
            call_command("add_cluster", "--name", "default", "--kubeconfig", path, "--namespace", namespace or "default",
                         "--gpus-per-node", os.environ.get("RINGMASTER_KUBE_GPUS_PER_NODE", "8"), stdout=stdout)
        except CommandError as exc:
            stderr.write(f"KUBECONFIG={path}: no cluster registered: {exc}")

    def periodic_check(self):
        """Whether every enabled cluster is reachable, and whether Kueue runs there (kept on the
        cluster, for its admin page and the job form)."""
        return {name: ok for name, (ok, _) in clusters.check_all().items()}

    def capacity_table(self):
        """Per cluster: GPUs in use (launching and running), its limit, jobs active and queued."""
        active = Q(cluster_jobs__job__state__in=ACTIVE_STATES)
        rows = list(Cluster.objects.annotate(
            in_use=Sum(in_use_expression("cluster_jobs__job__"), filter=active, default=0),
            active=Count("cluster_jobs", filter=active),
            queued=Count("cluster_jobs", filter=Q(cluster_jobs__job__state=State.QUEUED))).order_by("name"))
        return CapacityTable("kubernetes/capacity.html", rows) if rows else None

    def elastic_problem(self, launcher):
        """What the Kubernetes object of `launcher`'s jobs cannot do (runners.trainjob: no
        elastic policy), or None."""
        return clusters.builder_of_launcher(launcher).ELASTIC_PROBLEM

    def unavailable(self):
        if _enabled_clusters().exists():
            return None
        return ("No Kubernetes cluster is registered (or enabled): an admin adds one with "
                "manage.py add_cluster, or in the admin under Clusters.")

    def api_fields(self):
        return {"cluster": forms.CharField(max_length=100, required=False,
                                           help_text="Kubernetes backend: the cluster (name); empty: the only one there is.")}

    def page_fields(self):
        if not self.offered():
            return {}
        elastic = " ".join(clusters.elastic_words(cluster) for cluster in _enabled_clusters().order_by("name"))
        return {"cluster": forms.ModelChoiceField(queryset=_enabled_clusters(), to_field_name="name", required=False,
                                                  empty_label="—",
                                                  help_text=f"For the Kubernetes backend. Elastic jobs: {elastic}")}

    def clean(self, form, data):
        """The cluster a kubernetes job goes to (by name or id; none: the only one), and what
        the job needs there."""
        if "cluster" in form.errors:
            return
        cluster = self._cluster(form, data.get("cluster"))
        if cluster is None:
            return
        data["cluster"] = cluster
        gpus = data.get("gpus")
        if cluster.gpu_limit is not None and gpus and gpus > cluster.gpu_limit and "gpus" not in form.errors:
            form.add_error("gpus", f"Cluster {cluster.name} runs at most {cluster.gpu_limit} GPUs at once.")
        most = data.get("max_gpus")
        if cluster.gpu_limit is not None and most and most > cluster.gpu_limit and "max_gpus" not in form.errors:
            form.add_error("max_gpus", f"Cluster {cluster.name} runs at most {cluster.gpu_limit} GPUs at once.")
        image = data.get("image")
        problem = self.image_problem(image) if image is not None else None
        if problem and "image" not in form.errors:
            form.add_error("image", problem)
        project = data.get("project")
        problem = mpijob.project_size_problem(len(project.archive)) if project is not None else None
        if problem and "project" not in form.errors:
            form.add_error("project", problem)
        if "group" not in form.errors:
            try:
                namespace_for(cluster, data.get("group"))
            except ClusterError as exc:
                form.add_error("group", str(exc))
            queue = clusters.queue_for(cluster, getattr(form, "user", None), data.get("group"))
            if queue and cluster.kueue_found is False and "cluster" not in form.errors:
                form.add_error("cluster", clusters.kueue_refusal(cluster, queue, cluster.kueue_detail))

    @staticmethod
    def _cluster(form, value):
        if isinstance(value, Cluster):
            return value
        value = (value or "").strip()
        if not value:
            cluster = default_cluster()
            if cluster is None:
                names = _cluster_names()
                form.add_error("cluster", f"Choose a cluster: {names}." if names else "No Kubernetes cluster is set up.")
            return cluster
        query = Q(name=value) | (Q(pk=int(value)) if value.isascii() and value.isdigit() and int(value) < 2 ** 31
                                 else Q())
        cluster = _enabled_clusters().filter(query).first()
        if cluster is None:
            form.add_error("cluster", f"No enabled cluster {value!r}. Available: {_cluster_names() or 'none'}.")
        return cluster

    def image_problem(self, image):
        if not image.container_image:
            return f"Image {image.name} has no container image, so it cannot run on Kubernetes."
        return None

    def record(self, job, data):
        ClusterJob.objects.create(job_id=job.pk, cluster=data["cluster"])

    def field_values(self, job):
        cluster = cluster_of(job)
        return {"cluster": cluster.name} if cluster is not None else {}

    def field_values_of(self, jobs):
        names = dict(ClusterJob.objects.filter(job_id__in=[job.pk for job in jobs])
                     .values_list("job_id", "cluster__name"))
        return {job.pk: {"cluster": names[job.pk]} if job.pk in names else {} for job in jobs}

    def runner(self, job):
        return runner_for(job)

    def links(self, job):
        if cluster_of(job) is None:
            return []
        return [(f"View {builder_of(job).KIND}", reverse("job-mpijob", args=[job.pk]), "view-mpijob")]

    def document(self, job):
        cluster = cluster_of(job)
        if cluster is None:
            return None
        return render(job, cluster)

    def document_problems(self, document):
        builders = {builder.KIND: builder for builder in (mpijob, trainjob)}
        return builders[document["kind"]].document_problems(document)
