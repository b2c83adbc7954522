"""Which GPUs of a host a job gets: the one rule for this machine and for instances.

A host offers its first `slots` GPUs by nvidia-smi index (its inventory: what the last check
saw). A job's allocation on the host records the indices it owns; the free ones are those no
active job holds. A host whose inventory is empty (no nvidia-smi: CPU slots) offers `slots`
slots without indices. Picking is deterministic (lowest free indices first), so what a job gets
can be read off its allocation and the reasons a job waits are stable.
"""
from jobs.models import SlotAllocation
from runners.gpus import matches


def offered(inventory, slots):
    """The GPUs (inventory dicts) a host offers jobs."""
    return sorted(inventory, key=lambda gpu: gpu["index"])[:slots]


class HostGpus:
    """The free capacity of one host during an admission pass."""

    def __init__(self, inventory, slots, used_indices, used_slots):
        self.gpus = offered(inventory or [], slots)
        self.bound = bool(self.gpus)
        self.slots = len(self.gpus) if self.bound else slots
        used = set(used_indices)
        self.free_gpus = [gpu for gpu in self.gpus if gpu["index"] not in used]
        self.free_slots = len(self.free_gpus) if self.bound else max(slots - used_slots, 0)

    def free(self, model=""):
        """Free slots for a job (of GPUs of `model`, when it asks for one)."""
        if model:
            return len([gpu for gpu in self.free_gpus if matches(gpu["name"], model)])
        return self.free_slots

    def take(self, count, model=""):
        """Book `count` slots: the indices taken (empty on a host without GPUs)."""
        if not self.bound:
            self.free_slots -= count
            return []
        fitting = [gpu for gpu in self.free_gpus if not model or matches(gpu["name"], model)][:count]
        taken = [gpu["index"] for gpu in fitting]
        self.free_gpus = [gpu for gpu in self.free_gpus if gpu["index"] not in taken]
        self.free_slots = len(self.free_gpus)
        return taken

    def give_back(self, count, indices=()):
        """Free `count` slots a job held (with their `indices` on a host with GPUs)."""
        if not self.bound:
            self.free_slots += count
            return
        returned = [gpu for gpu in self.gpus if gpu["index"] in set(indices)]
        self.free_gpus = sorted(self.free_gpus + returned, key=lambda gpu: gpu["index"])
        self.free_slots = len(self.free_gpus)

    def models(self):
        return sorted({gpu["name"] for gpu in self.gpus})


def release_slots(job_id):
    """Free what a job holds on hosts (its SlotAllocation rows, with their indices)."""
    SlotAllocation.objects.filter(job_id=job_id).delete()


class ByGpuModel:
    """Admission on hosts with GPUs by model: a waiting job reserves capacity of its model only,
    so a job asking for another model (or for any) is not held behind it."""

    def capacity_key(self, job):
        return ("capacity", self.backend.name, job.gpu_model.lower())
