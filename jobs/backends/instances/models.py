"""The instances backend's tables: the GPU instances it runs jobs on over SSH, and the instance
each job's artifacts come back from.

Instance keeps the table name it had as a model of the jobs app (jobs_instance): migrations/0001
took it over without touching the database. The GPU slots a job holds on an instance are
jobs.models.SlotAllocation rows (shared with the local backend), whose `host_id` is an
Instance's id.
"""
from django.db import models

from runners import ssh


class Instance(models.Model):
    """An interactive GPU machine the `instances` backend runs horovodrun on, over SSH.

    Its login shell (or `setup`) must provide `python` and `horovodrun`. The private key is stored
    encrypted (jobs.secrets) and never shown back. The host key is recorded the first time the
    portal connects (trust on first use); a host that shows another key is refused.
    """

    name = models.CharField(max_length=100, unique=True)
    host = models.CharField(max_length=255, help_text="Host name or address; also what horovodrun -H uses.")
    port = models.PositiveIntegerField(default=22)
    user = models.CharField(max_length=100)
    gpus = models.PositiveIntegerField(verbose_name="GPUs", help_text="Slots this instance offers.")
    labels = models.CharField(max_length=300, blank=True, help_text="Comma-separated, e.g. a100,nvlink.")
    enabled = models.BooleanField(default=True)
    private_key_encrypted = models.TextField(editable=False, blank=True)
    host_key = models.CharField(max_length=2000, blank=True,
                                help_text="Recorded on first connection; clear it to accept a new host key.")
    setup = models.CharField(max_length=1000, blank=True,
                             help_text="A /bin/sh line run before horovodrun, e.g. `. /opt/venv/bin/activate`.")
    work_dir = models.CharField(max_length=500, default=".ringmaster/jobs",
                                help_text="Where job directories go (relative: to the user's home). "
                                          "Must be the same path on every instance of a multi-host job.")
    peer_ssh_port = models.PositiveIntegerField(null=True, blank=True,
                                                help_text="horovodrun -p: SSH port between instances.")
    peer_ssh_key = models.CharField(max_length=500, blank=True,
                                    help_text="horovodrun -i: key file, on the instance, to reach the others.")
    network_interface = models.CharField(max_length=50, blank=True,
                                         help_text="horovodrun --network-interface (e.g. eth0).")

    healthy = models.BooleanField(default=False)
    health_reason = models.CharField(max_length=500, blank=True, default="not checked yet")
    health_checked_at = models.DateTimeField(null=True, blank=True)
    gpus_detected = models.IntegerField(null=True, blank=True, help_text="From nvidia-smi, where present.")
    gpu_inventory = models.JSONField(default=list, blank=True, editable=False,
                                     help_text="The GPUs the last health check saw: index, name, memory (MiB), uuid.")
    isolation = models.CharField(max_length=20, blank=True, default="", editable=False,
                                 choices=list(ssh.ISOLATIONS.items()),
                                 help_text="How jobs run there, from what its account can do (last health check).")

    class Meta:
        db_table = "jobs_instance"
        ordering = ["name"]

    def __str__(self):
        return self.name

    def gpus_seen(self):
        """The GPUs the last health check saw, by model: "2 × NVIDIA A100-SXM4-40GB (40960 MiB)"."""
        if not self.gpu_inventory:
            return "none seen" if self.health_checked_at else "not checked yet"
        models_seen = {}
        for gpu in self.gpu_inventory:
            key = (gpu.get("name", "?"), gpu.get("memory_mib"))
            models_seen[key] = models_seen.get(key, 0) + 1
        return ", ".join(f"{count} × {name}" + (f" ({memory} MiB)" if memory else "")
                         for (name, memory), count in models_seen.items())

    def set_private_key(self, text):
        from jobs.secrets import encrypt

        self.private_key_encrypted = encrypt(text)

    def private_key(self):
        from jobs.secrets import decrypt

        return decrypt(self.private_key_encrypted, f"the SSH key of instance {self.name}",
                       f"store its SSH key again (the admin's Instances, or manage.py add_instance --name {self.name} ...)")


class ArtifactsHost(models.Model):
    """The instance that ran a job's launcher: where its artifacts are brought back from, after
    its slots are given back. The core keeps no reference into this app, which is installed only
    while the backend is enabled (hence no database constraint on `job`)."""

    job = models.OneToOneField("jobs.Job", primary_key=True, on_delete=models.CASCADE, db_constraint=False,
                               related_name="artifacts_host")
    instance = models.ForeignKey(Instance, null=True, on_delete=models.SET_NULL, related_name="+")
