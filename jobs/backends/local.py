"""The embedded default: horovodrun on the portal's own machine (runners.local).

Its capacity is the GPUs nvidia-smi shows here, when there are any: each job owns some of them
(SlotAllocation rows with no instance, holding the indices), and its ranks see only those.
Without nvidia-smi it runs CPU processes, RINGMASTER_LOCAL_CPU_SLOTS of them at once.
RINGMASTER_LOCAL_GPUS, when set, overrides the count (0 turns the backend off); with GPUs
present it can only lower it: a job never gets a GPU the portal could not see.
"""
import os
import threading
import time

from django.conf import settings
from django.db.models import Sum

from jobs.backends.base import Admission, Backend, interpreter_problem
from jobs.backends.placement import ByGpuModel, HostGpus, release_slots
from jobs.backends.waits import Wait
from jobs.installation import installation_id
from jobs.models import SlotAllocation
from runners import gpus, sandbox
from runners.base import job_name
from runners.local import LocalRunner

_cache, _cache_lock = {}, threading.Lock()


def job_sandbox():
    """The sandbox of local jobs (RINGMASTER_LOCAL_SANDBOX), hiding the portal's data, jobs,
    artifacts and environments folders, on the network RINGMASTER_JOB_NETWORK says."""
    hidden = (settings.DATA_DIR, settings.RINGMASTER_JOBS_DIR, settings.RINGMASTER_ARTIFACTS_DIR,
              settings.RINGMASTER_ENVS_DIR)
    return sandbox.find(settings.RINGMASTER_LOCAL_SANDBOX, hidden,
                        os.path.expanduser("~"), settings.RINGMASTER_JOB_NETWORK)


class MachineGpus:
    """What nvidia-smi shows on this machine: `gpus` ([Gpu], [] without nvidia-smi) or `error`."""

    def __init__(self, gpus_seen, error=""):
        self.gpus, self.error = gpus_seen, error

    @property
    def inventory(self):
        return [gpu.as_dict() for gpu in self.gpus]


def machine_gpus(refresh=False):
    """This machine's GPUs, read at most every RINGMASTER_GPU_CHECK_SECONDS per process
    (admission asks often)."""
    command = settings.RINGMASTER_NVIDIA_SMI
    with _cache_lock:
        seen = _cache.get(command)
        if seen and not refresh and time.monotonic() - seen[0] < settings.RINGMASTER_GPU_CHECK_SECONDS:
            return seen[1]
    result = MachineGpus(*gpus.local_inventory(command))
    with _cache_lock:
        _cache[command] = (time.monotonic(), result)
    return result


def slots():
    """(processes this machine runs at once, whether they are GPUs)."""
    seen = machine_gpus()
    override = settings.RINGMASTER_LOCAL_GPUS
    if seen.error:
        return 0, True
    if seen.gpus:
        return (len(seen.gpus) if override is None else min(override, len(seen.gpus))), True
    return (settings.RINGMASTER_LOCAL_CPU_SLOTS if override is None else override), False


class LocalAdmission(ByGpuModel, Admission):
    """The machine's GPUs, by index (lowest free first); without GPUs, CPU slots, by count."""

    def __init__(self, backend, book):
        super().__init__(backend, book)
        self.host, self.plans = None, {}

    def _host(self):
        if self.host is None:
            count, _ = slots()
            used = SlotAllocation.objects.filter(host_id__isnull=True)
            indices = [i for row in used.values_list("gpu_indices", flat=True) for i in row or []]
            used_slots = used.aggregate(n=Sum("slots"))["n"] or 0
            self.host = HostGpus(machine_gpus().inventory, count, indices, used_slots)
        return self.host

    def why_waiting(self, job):
        seen = machine_gpus()
        if seen.error:
            return Wait("machine_gpus", error=seen.error)
        host = self._host()
        if not host.bound:
            return super().why_waiting(job)
        free = host.free(job.gpu_model)
        if free >= job.gpus:
            return None
        return Wait("machine_capacity", in_use=host.slots - host.free_slots, slots=host.slots, gpus=job.gpus,
                    model=job.gpu_model, free=free)

    def admitted_message(self, job):
        host = self._host()
        if not host.bound:
            return "admitted"
        self.plans[job.pk] = host.take(job.gpus, job.gpu_model)
        return "admitted: GPUs " + ",".join(str(i) for i in self.plans[job.pk])

    def charge(self, job):
        if job.pk in self.plans:
            SlotAllocation.objects.create(job_id=job.pk, host_id=None, slots=job.gpus, position=0,
                                          gpu_indices=self.plans.pop(job.pk))

    def room(self, job):
        host = self._host()
        return host.free(job.gpu_model) if host.bound else super().room(job)

    def where(self, job):
        return "on this machine"

    def resize(self, job, size):
        """Grow: the lowest free indices join the job's; shrink: its last indices go back (the
        ranks Horovod stops are the highest local ranks, which held them)."""
        host = self._host()
        if not host.bound:
            return
        allocation = SlotAllocation.objects.select_for_update().get(job_id=job.pk, host_id__isnull=True)
        indices = list(allocation.gpu_indices)
        if size > len(indices):
            indices += host.take(size - len(indices), job.gpu_model)
        else:
            host.give_back(len(indices) - size, indices[size:])
            indices = indices[:size]
        allocation.gpu_indices, allocation.slots = indices, size
        allocation.save(update_fields=["gpu_indices", "slots"])


class LocalBackend(Backend):
    name = "local"
    label = "This machine"
    admission_class = LocalAdmission
    elastic = True
    runs_projects = True
    installs_packages = True
    restarts_jobs = True

    def capacity(self):
        return slots()[0]

    def gpus_note(self):
        seen = machine_gpus()
        count, bound = slots()
        if seen.error:
            return f"{self.label}: nvidia-smi fails here ({seen.error}); jobs wait until it answers."
        if bound:
            models = ", ".join(sorted({gpu.name for gpu in seen.gpus}))
            return f"{self.label}: {count} GPUs ({models}); each job gets GPUs of its own."
        return (f"{self.label}: no GPU here (nvidia-smi sees none), so each GPU asked for is one process "
                f"on the CPU, {count} at once.")

    def largest_job(self):
        """None while nvidia-smi fails here: jobs wait, saying why, instead of being refused."""
        return None if machine_gpus().error else slots()[0]

    def too_large(self, limit):
        count, are_gpus = slots()
        return f"This machine runs at most {limit} {'GPUs' if are_gpus else 'processes'} per job."

    def gpu_models(self):
        return sorted({gpu.name for gpu in machine_gpus().gpus})

    def image_problem(self, image):
        return interpreter_problem(image, "this machine")

    def release(self, job_id):
        release_slots(job_id)

    takes_checkpoints = True

    def artifacts_root(self, job):
        """The job's own output folder: its ranks write there, the portal reads it in place."""
        return LocalRunner(settings.RINGMASTER_JOBS_DIR).output_dir_named(job_name(installation_id(), job.pk))

    def runner(self, job):
        return LocalRunner(settings.RINGMASTER_JOBS_DIR, nvidia_smi=settings.RINGMASTER_NVIDIA_SMI,
                           sandbox=job_sandbox(), envs_dir=settings.RINGMASTER_ENVS_DIR,
                           install_network=settings.RINGMASTER_INSTALL_NETWORK,
                           pip_index_url=settings.RINGMASTER_PIP_INDEX_URL)
