"""The instances and kubernetes backends own their tables: each folder is a Django app, installed
only while its backend is enabled, and the core keeps no reference into it. A portal with the
local backend alone migrates and runs without them; an existing database keeps each job's cluster
and artifacts instance when they move out of the jobs_job row."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import get_commands
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from jobs.backends.instances.models import ArtifactsHost, Instance
from jobs.backends.kubernetes.models import Cluster, ClusterJob, QueueMapping
from jobs.models import SlotAllocation

ROOT = Path(__file__).resolve().parent.parent
OLD = [("jobs", "0020_artifacts"), ("kubernetes", None), ("instances", None)]
SEEN = """
from django.contrib import admin
from django.core.management import call_command, get_commands
call_command("makemigrations", "--check", "--dry-run")
print(sorted(get_commands()))
print(sorted(model._meta.label for model in admin.site._registry))
"""


def manage(data_dir, *argv, backends):
    """manage.py in a fresh process on an SQLite database of its own, with `backends` enabled."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("DATABASE_URL", "REDIS_URL", "RINGMASTER_FERNET_KEYS", "RINGMASTER_BACKENDS")}
    env.update(RINGMASTER_DATA_DIR=str(data_dir), RINGMASTER_BACKENDS=backends)
    return subprocess.run([sys.executable, "manage.py", *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_with_the_local_backend_alone_the_other_backends_apps_commands_and_admin_are_absent(tmp_path):
    local = "jobs.backends.local.LocalBackend"
    migrated = manage(tmp_path, "migrate", "-v", "1", backends=local)
    assert migrated.returncode == 0, migrated.stderr
    assert "Applying jobs.0021_backend_models... OK" in migrated.stdout
    assert "Applying kubernetes." not in migrated.stdout and "Applying instances." not in migrated.stdout

    # The core's models need nothing of the absent apps (their migrations describe them whole),
    # and neither their commands nor their admin pages are there.
    seen = manage(tmp_path, "shell", "-c", SEEN, backends=local)
    assert seen.returncode == 0, seen.stderr
    unchanged, commands, registered = seen.stdout.strip().splitlines()[-3:]
    assert unchanged == "No changes detected"
    assert "set_quota" in commands and "seed_demo" in commands
    for command in ("add_instance", "add_cluster", "map_queue", "render_mpijob", "render_trainjob"):
        assert command not in commands and command in get_commands()    # where they are enabled: here
    assert "jobs.Job" in registered and "Cluster" not in registered and "Instance" not in registered


@pytest.mark.django_db(transaction=True)
def test_an_existing_database_keeps_each_jobs_cluster_artifacts_instance_and_slots(make_user):
    """From jobs.0020 (a job's cluster and artifacts instance were columns of jobs_job, a slot
    allocation's instance a foreign key) to the backends' own apps."""
    executor = MigrationExecutor(connection)
    executor.migrate(OLD)
    try:
        old = executor.loader.project_state(OLD[0]).apps
        owner = old.get_model("auth", "User").objects.get(pk=make_user("alice").pk)
        image = old.get_model("jobs", "Image").objects.create(name="horovod-k8s", python="python3")
        cluster = old.get_model("jobs", "Cluster").objects.create(name="east", gpus_per_node=8)
        instance = old.get_model("jobs", "Instance").objects.create(name="gpu-a", host="gpu-a", user="u", gpus=4)
        Job = old.get_model("jobs", "Job")
        on_cluster = Job.objects.create(owner=owner, image=image, gpus=8, backend="kubernetes", cluster=cluster,
                                        time_limit_minutes=5)
        on_instance = Job.objects.create(owner=owner, image=image, gpus=2, backend="instances", state="RUNNING",
                                         artifacts_instance=instance, time_limit_minutes=5)
        old.get_model("jobs", "SlotAllocation").objects.create(job=on_instance, instance=instance, slots=2,
                                                               position=0, gpu_indices=[0, 1])
        old.get_model("jobs", "QueueMapping").objects.create(cluster=cluster, user=owner, queue="alice-queue")
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())

    assert [(link.job_id, link.cluster.name) for link in ClusterJob.objects.all()] == [(on_cluster.pk, "east")]
    assert [(link.job_id, link.instance.name) for link in ArtifactsHost.objects.all()] == [(on_instance.pk, "gpu-a")]
    assert list(SlotAllocation.objects.values_list("job_id", "host_id", "slots")) == \
        [(on_instance.pk, Instance.objects.get(name="gpu-a").pk, 2)]
    assert list(QueueMapping.objects.values_list("cluster__name", "user__username", "queue")) == \
        [("east", "alice", "alice-queue")]
    assert Cluster.objects.get().name == "east"


@pytest.mark.django_db
def test_an_instance_that_jobs_hold_slots_on_cannot_be_deleted_until_they_end(client, make_user, image):
    """Allocations keep an instance's id without a database constraint: the admin keeps the rule."""
    from jobs.models import Job

    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    busy = Instance.objects.create(name="gpu-a", host="gpu-a", user="u", gpus=2)
    idle = Instance.objects.create(name="gpu-b", host="gpu-b", user="u", gpus=2)
    job = Job.objects.create(owner=make_user("alice"), image=image, gpus=1, backend="instances", state="RUNNING",
                             script_path="/t.py", time_limit_minutes=5)
    SlotAllocation.objects.create(job=job, host_id=busy.pk, slots=1, position=0)

    assert client.get(f"/admin/instances/instance/{busy.pk}/delete/").status_code == 403
    bulk = client.post("/admin/instances/instance/", {"action": "delete_selected", "post": "yes",
                                                      "_selected_action": [busy.pk, idle.pk]})
    assert bulk.status_code == 403 and Instance.objects.count() == 2

    SlotAllocation.objects.filter(job=job).delete()                  # the job ended
    assert client.post(f"/admin/instances/instance/{busy.pk}/delete/", {"post": "yes"}).status_code == 302
    assert list(Instance.objects.values_list("name", flat=True)) == ["gpu-b"]


MAPPED = """
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from jobs.backends.kubernetes.models import Cluster, QueueMapping
call_command("migrate", verbosity=0)
east = Cluster.objects.create(name="east", gpus_per_node=8)
QueueMapping.objects.create(cluster=east, user=User.objects.create(username="alice"), queue="alice-queue")
QueueMapping.objects.create(cluster=east, group=Group.objects.create(name="vision"), queue="vision-queue")
QueueMapping.objects.create(cluster=east, user=User.objects.create(username="bob"), queue="bob-queue")
"""
DELETED = """
from django.contrib.auth.models import Group, User
User.objects.get(username="alice").delete()
Group.objects.get(name="vision").delete()
print("deleted")
"""
LEFT = """
from django.core.management import call_command
from jobs.backends.kubernetes.models import QueueMapping
call_command("migrate", verbosity=0)
print(sorted(str(mapping) for mapping in QueueMapping.objects.all()))
"""


def test_a_user_and_a_group_with_queue_mappings_can_be_deleted_while_kubernetes_is_off(tmp_path):
    """QueueMapping's user and group have no database constraint: with the kubernetes app not
    installed, deleting them is not refused for rows Django cannot see; their mappings go when
    the app migrates again, and the others stay."""
    made = manage(tmp_path, "shell", "-c", MAPPED, backends="")
    assert made.returncode == 0, made.stderr
    deleted = manage(tmp_path, "shell", "-c", DELETED, backends="jobs.backends.local.LocalBackend")
    assert deleted.returncode == 0 and deleted.stdout.strip().splitlines()[-1] == "deleted", deleted.stderr
    left = manage(tmp_path, "shell", "-c", LEFT, backends="")
    assert left.returncode == 0, left.stderr
    assert left.stdout.strip().splitlines()[-1] == "['user bob on east: bob-queue']"
