"""Kubernetes jobs made directly in the database are put on their cluster the way a submission
puts them there (KubernetesBackend.record)."""
from jobs.backends.kubernetes.models import ClusterJob


def on_cluster(job, cluster):
    """`job` on `cluster` (None: on none); returns the job."""
    if cluster is not None:
        ClusterJob.objects.create(job=job, cluster=cluster)
    return job


def mount_configmap(configmap, folder):
    """Write a ConfigMap's files into `folder` as the kubelet mounts them (data as text,
    binaryData decoded); returns the folder."""
    import base64

    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (configmap.get("data") or {}).items():
        (folder / name).write_text(text)
    for name, encoded in (configmap.get("binaryData") or {}).items():
        (folder / name).write_bytes(base64.b64decode(encoded))
    return folder


def in_folders(words, folders):
    """A container's `words` (command, env values) with each path of the pod that `folders` maps
    ({path in the pod: a folder here}) as that folder here: to run a pod's command on this machine."""
    def here(word):
        for inside, local in folders.items():
            if word == inside or word.startswith(inside + "/"):
                return str(local) + word[len(inside):]
        return word
    return [here(word) for word in words]
