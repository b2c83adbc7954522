"""Kubernetes jobs made directly in the database are put on their cluster the way a submission
puts them there (KubernetesBackend.record)."""
from jobs.backends.kubernetes.models import ClusterJob


def on_cluster(job, cluster):
    """`job` on `cluster` (None: on none); returns the job."""
    if cluster is not None:
        ClusterJob.objects.create(job=job, cluster=cluster)
    return job
