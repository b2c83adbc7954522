"""A cluster's artifacts volume, mounted on the portal too (Cluster.artifacts_path): the job page
and the API list and serve the files a Kubernetes job wrote under the sub-path its pods mount."""
import html
import json
import os

import pytest

from jobs import backends
from jobs.backends.kubernetes.clusters import render
from jobs.backends.kubernetes.models import Cluster
from jobs.models import Image, Job, State
from runners import mpijob
from tests.clusterjobs import on_cluster
from tests.test_clusters import _admin_errors, kubeconfig, run

pytestmark = pytest.mark.django_db


@pytest.fixture
def volume(tmp_path):
    folder = tmp_path / "volume"
    folder.mkdir()
    return folder


@pytest.fixture
def cluster(volume):
    item = Cluster(name="gpu-east", namespace="training", gpus_per_node=8, artifacts_volume="ringmaster-artifacts",
                   artifacts_path=str(volume))
    item.set_kubeconfig(kubeconfig())
    item.save()
    return item


@pytest.fixture
def job(cluster, make_user):
    image = Image.objects.create(name="horovod-gpu", container_image="registry.example/horovod:0.28.1")
    return on_cluster(Job.objects.create(owner=make_user("alice"), image=image, gpus=8, script_path="/t.py",
                                         backend="kubernetes", state=State.SUCCEEDED, time_limit_minutes=5), cluster)


def mounted_sub_path(job):
    """The sub-path of the volume that the job's pods mount as its output folder."""
    _, document = render(job)
    pod = document["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]       # the ranks run there
    mount = next(m for c in pod["containers"] for m in c["volumeMounts"] if m["mountPath"] == mpijob.OUTPUT_MOUNT)
    return mount["subPath"]


def test_the_files_a_job_wrote_on_the_volume_are_listed_and_served_to_its_owner_only(client, job, volume, make_user):
    written = volume / mounted_sub_path(job)
    (written / "checkpoints").mkdir(parents=True)
    (written / "checkpoints" / "step-10.pt").write_bytes(b"\x00weights\xff" * 100)
    (written / "log.txt").write_text("done\n")

    client.force_login(job.owner)
    listing = client.get(f"/api/jobs/{job.pk}/artifacts/").json()
    assert sorted((item["name"], item["size"]) for item in listing) == [("checkpoints/step-10.pt", 900),
                                                                         ("log.txt", 5)]
    download = client.get(f"/api/jobs/{job.pk}/artifacts/checkpoints/step-10.pt")
    assert b"".join(download.streaming_content) == b"\x00weights\xff" * 100
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "step-10.pt" in page and "does not read" not in page

    client.force_login(make_user("mallory"))
    assert client.get(f"/api/jobs/{job.pk}/artifacts/").status_code == 404


def test_without_the_volume_on_the_portal_the_page_says_where_the_files_are(client, job, cluster):
    Cluster.objects.filter(pk=cluster.pk).update(artifacts_path="")
    client.force_login(job.owner)
    assert client.get(f"/api/jobs/{job.pk}/artifacts/").json() == []
    page = html.unescape(client.get(f"/jobs/{job.pk}/").content.decode())
    assert "The portal does not read this cluster's artifacts" in page


def test_an_artifacts_path_the_portal_cannot_read_is_refused_by_the_admin_and_add_cluster(client, make_user, tmp_path):
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    data = {"name": "gpu-west", "enabled": "on", "connection": "kubeconfig", "kubeconfig": kubeconfig(),
            "namespace": "training", "gpus_per_node": "8", "node_selector": "{}", "tolerations": "[]",
            "mpijob_command": "mpirun", "training_runtime": "torch-distributed", "cpu_per_gpu": "4",
            "memory_per_gpu_gib": "16", "clean_pod_policy": "Running", "backoff_limit": "0",
            "ttl_seconds_after_finished": "3600", "image_pull_grace_seconds": "300",
            "queue_mappings-TOTAL_FORMS": "0", "queue_mappings-INITIAL_FORMS": "0"}
    missing = tmp_path / "not-mounted"
    shown = _admin_errors(client, "/admin/kubernetes/cluster/add/",
                          {**data, "artifacts_volume": "ringmaster-artifacts", "artifacts_path": str(missing)})
    assert shown == {"artifacts_path": [f"{missing} is not a folder on the portal's machine: mount the volume there first."]}
    shown = _admin_errors(client, "/admin/kubernetes/cluster/add/", {**data, "artifacts_path": str(tmp_path)})
    assert shown == {"artifacts_path": ["Name the artifacts volume too: this is where the portal sees it."]}

    config = tmp_path / "kubeconfig"
    config.write_text(kubeconfig())
    with pytest.raises(Exception, match="--artifacts-path/artifacts_path: Must be an absolute path"):
        run("add_cluster", "--name", "gpu-west", "--kubeconfig", str(config), "--namespace", "training",
            "--gpus-per-node", "8", "--artifacts-volume", "ringmaster-artifacts", "--artifacts-path", "volume",
            "--no-check")
    run("add_cluster", "--name", "gpu-west", "--kubeconfig", str(config), "--namespace", "training",
        "--gpus-per-node", "8", "--artifacts-volume", "ringmaster-artifacts", "--artifacts-path", str(tmp_path),
        "--no-check")
    assert Cluster.objects.get(name="gpu-west").artifacts_path == str(tmp_path)


def test_they_count_against_the_owners_storage_quota_and_go_after_the_retention_time(job, volume, settings):
    from datetime import timedelta

    from django.utils import timezone

    from jobs.domain import artifacts
    from jobs.models import Quota

    written = volume / mounted_sub_path(job)
    written.mkdir()
    (written / "model.pt").write_bytes(b"x" * 3000)
    Quota.objects.create(user=job.owner, storage_gb=2e-6)            # 2,000 bytes

    artifacts.collect(job)
    job.refresh_from_db()
    assert job.artifacts_bytes == 3000 and "exceed the owner's storage quota" in job.artifacts_note

    Job.objects.filter(pk=job.pk).update(finished_at=timezone.now() - timedelta(
        days=settings.RINGMASTER_ARTIFACT_RETENTION_DAYS + 1))
    assert artifacts.expire() == 1
    assert not written.exists() and volume.exists()


@pytest.mark.parametrize("launcher", ["horovod", "torchrun"])
def test_a_rerun_from_checkpoint_mounts_the_jobs_folder_read_only_and_names_the_newest_match(client, job, volume,
                                                                                              launcher):
    Job.objects.filter(pk=job.pk).update(checkpoint_pattern="checkpoints/*.pt", launcher=launcher)
    job.image.launchers = "horovod,torchrun"
    job.image.save()
    written = volume / mounted_sub_path(job)
    (written / "checkpoints").mkdir(parents=True)
    for step in (10, 20):
        (written / "checkpoints" / f"step-{step}.pt").write_bytes(b"w")
    os.utime(written / "checkpoints" / "step-10.pt", (1, 1))          # step-20 is the newest

    client.force_login(job.owner)
    response = client.post(f"/api/jobs/{job.pk}/rerun-from-checkpoint/")
    assert response.status_code == 201, response.content.decode()
    rerun = Job.objects.get(pk=response.json()["id"])
    assert (rerun.parent_id, rerun.checkpoint, rerun.backend) == (job.pk, "checkpoints/step-20.pt", "kubernetes")

    kind, document = render(rerun)
    assert backends.of(rerun).document_problems(document) == []          # the CRD's schema holds
    mounts = [m for m in _all(document, "volumeMounts") if m["mountPath"] == mpijob.CHECKPOINT_MOUNT]
    assert mounts and all(m == {"name": "artifacts", "mountPath": "/ringmaster/checkpoint",
                                "subPath": mounted_sub_path(job), "readOnly": True} for m in mounts)
    assert {"name": "RINGMASTER_CHECKPOINT", "value": "/ringmaster/checkpoint/checkpoints/step-20.pt"} in \
        _all(document, "env")


def _all(node, key):
    """Every item of every list under `key` anywhere in `node`."""
    if isinstance(node, dict):
        here = node.get(key) if isinstance(node.get(key), list) else []
        return here + [item for value in node.values() for item in _all(value, key)]
    if isinstance(node, list):
        return [item for value in node for item in _all(value, key)]
    return []
