"""A stored SSH key or kubeconfig the portal cannot decrypt (RINGMASTER_FERNET_KEYS changed, or
is not set on the worker): the job fails at once with a reason that tells the admin what to do,
and the instance is marked unhealthy, instead of the follower failing every 15 s forever.

follow.run is what the worker's run_job task calls; the launch over a real worker is in
tests/integration/test_instances.py."""
import pytest
from cryptography.fernet import Fernet

from jobs.domain import follow
from jobs.backends.instances.models import Instance
from jobs.backends.kubernetes.models import Cluster
from jobs.models import Job, SlotAllocation, State
from tests.clusterjobs import on_cluster

pytestmark = pytest.mark.django_db

ANOTHER_KEY = Fernet(Fernet.generate_key())


def encrypted_elsewhere(text):
    """A token made with a key the portal does not have."""
    return ANOTHER_KEY.encrypt(text.encode()).decode()


def a_job(owner, image, state, **fields):
    return Job.objects.create(owner=owner, image=image, gpus=1, script_path="train.py", time_limit_minutes=5,
                              state=state, **fields)


def test_a_running_job_on_an_instance_whose_key_is_unreadable_fails_saying_what_to_do(alice, image):
    instance = Instance.objects.create(name="gpu-a", host="gpu-a.example", user="u", gpus=1, healthy=True,
                                       private_key_encrypted=encrypted_elsewhere("-----BEGIN KEY-----"))
    job = a_job(alice, image, State.RUNNING, backend="instances")
    SlotAllocation.objects.create(job=job, host_id=instance.pk, slots=1, position=0)

    follow.run(job.pk)

    job.refresh_from_db()
    assert job.state == State.FAILED
    assert job.reason.startswith("cannot reach the job (it may still run there; the portal cannot stop it): "
                                 "the SSH key of instance gpu-a cannot be decrypted with the keys in "
                                 "RINGMASTER_FERNET_KEYS (they changed since it was stored): put the key it was "
                                 "stored with back into RINGMASTER_FERNET_KEYS")
    assert "store its SSH key again" in job.reason
    instance.refresh_from_db()
    assert not instance.healthy and instance.health_reason.startswith("the SSH key of instance gpu-a cannot be decrypted")
    assert not SlotAllocation.objects.exists()                            # its slot went back


def test_a_job_launching_on_a_cluster_whose_kubeconfig_is_unreadable_fails_naming_the_cluster(alice, image, settings):
    cluster = Cluster.objects.create(name="gpu-east", namespace="training", gpus_per_node=8,
                                     kubeconfig_encrypted=encrypted_elsewhere("apiVersion: v1"))
    job = on_cluster(a_job(alice, image, State.LAUNCHING, backend="kubernetes"), cluster)

    follow.run(job.pk)

    job.refresh_from_db()
    assert job.state == State.FAILED
    assert job.reason.startswith("cannot reach the job: the kubeconfig of cluster gpu-east cannot be decrypted")
    assert "store its kubeconfig again" in job.reason


def test_without_any_key_on_the_worker_the_reason_says_it_is_not_set(alice, image, settings):
    cluster = Cluster.objects.create(name="gpu-east", namespace="training", gpus_per_node=8,
                                     kubeconfig_encrypted=encrypted_elsewhere("apiVersion: v1"))
    job = on_cluster(a_job(alice, image, State.LAUNCHING, backend="kubernetes"), cluster)
    settings.RINGMASTER_FERNET_KEYS = ""

    follow.run(job.pk)

    job.refresh_from_db()
    assert job.state == State.FAILED
    assert job.reason.startswith("cannot reach the job: the kubeconfig of cluster gpu-east cannot be decrypted: "
                                 "RINGMASTER_FERNET_KEYS is not set")
