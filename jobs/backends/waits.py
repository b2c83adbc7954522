"""Why a queued job waits: a Wait (a code and its parameters), and the one place that turns a
wait into words.

Whoever decides that a job waits (submit and hold in jobs.domain.services, the scheduler, a
backend's Admission) makes a Wait; nothing builds the sentence a user reads but this module.
Each code has a kind, what the job waits for without the numbers (quota, capacity, held, ...):
a queued job keeps its wait's words in Job.reason and its kind in Job.waits_for, and its events
record a change of kind, not every change of the numbers or of the job it waits behind.

A code of a backend's own goes in _CODES, with its kind and its words.
"""
from functools import cached_property

from django.utils import timezone


class Wait:
    """Why a job waits: `code` (a key of _CODES) and `params`, plain values its words name."""

    def __init__(self, code, **params):
        if code not in _CODES:
            raise ValueError(f"no words for a wait {code!r}")
        self.code, self.params = code, params

    @property
    def kind(self):
        """What the job waits for: "scheduler", "held", "restart", "unavailable", "never", "quota", "capacity"."""
        return _CODES[self.code][0]

    @cached_property
    def words(self):
        return _CODES[self.code][1](**self.params)

    def stored(self):
        """The Job fields that keep this wait."""
        return {"reason": self.words, "waits_for": self.kind}

    def __repr__(self):
        return f"Wait({self.code!r}, {self.params!r})"


def refusal(wait):
    """What the job form says of a job that can never start under its quotas (a "never_quota"
    wait): the limit, as its words name it."""
    return _quota_limit(**wait.params)


def number(value):
    """1,000 / 12.5: a GPU-hour figure as a person reads it."""
    if abs(value - round(value)) < 0.05:
        return f"{round(value):,}"
    return f"{value:,.1f}"


def gpu_count(gpus, model=""):
    """"4 GPUs", "1 GPU", or "4 A100 GPUs": a number of GPUs as every message of the portal says it."""
    noun = "GPU" if gpus == 1 else "GPUs"
    return f"{gpus} {model} {noun}" if model else f"{gpus} {noun}"


def _models(names):
    return ", ".join(names) if names else "none (no GPU seen by nvidia-smi)"


def _down(down):
    """The enabled instances that get no jobs, and why ([(name, why)]): a reason that hides them misleads."""
    return "; not healthy: " + "; ".join(f"{name} ({why})" for name, why in down) if down else ""


def _quota_limit(name, quota, limit, most=0, days=0):
    """A limit no job of this size can ever meet: `limit` is "gpus_per_job", "jobs" or "gpu_hours"."""
    if limit == "gpus_per_job":
        return f"at most {gpu_count(most)} per job for {name} ({quota})"
    if limit == "jobs":
        return f"{name} may run no jobs ({quota}: 0 jobs at once)"
    return f"{name} has no GPU-hours ({quota}: 0 per {days} days)"


def _quota_use(scope, limit, use, most, needs=0, days=0):
    """One scope's limit a job would break now: `limit` is "gpu_hours", "jobs" or "gpus"."""
    if limit == "gpu_hours":
        return f"{scope}: GPU-hours for {days} days used up: {number(use)} of {number(most)}"
    if limit == "jobs":
        return f"{scope}: {use} of {most} jobs running"
    return f"{scope}: {use} of {most} GPUs in use, needs {needs}"


# code: (kind, words of its params)
_CODES = {
    "scheduler": ("scheduler", lambda: "waiting for the scheduler"),
    "held": ("held", lambda by: f"held by {by or 'an admin'}"),
    "restart": ("restart", lambda attempt, at:
                f"restarting: attempt {attempt} waits until {timezone.localtime(at):%H:%M:%S %Z} (the backoff)"),
    "unavailable": ("unavailable", lambda error: f"can never start: {error}"),
    "never_quota": ("never", lambda **limit: f"can never start: {_quota_limit(**limit)}"),
    # broken: [the params of _quota_use], one per scope whose limit the job would break
    "quota": ("quota", lambda broken: "waiting for quota: " + "; ".join(_quota_use(**b) for b in broken)),
    "quota_behind": ("quota", lambda scope: f"waiting behind an earlier job for the quota of {scope}"),
    "capacity": ("capacity", lambda in_use, capacity, gpus:
                 f"waiting for capacity: {in_use} of {capacity} GPUs in use, this job needs {gpus}"),
    "capacity_behind": ("capacity", lambda backend: f"waiting behind an earlier job for capacity ({backend})"),
    # the local backend
    "machine_gpus": ("capacity", lambda error: f"waiting for this machine's GPUs: {error}"),
    "machine_capacity": ("capacity", lambda in_use, slots, gpus, model, free:
                         f"waiting for capacity: {in_use} of {slots} GPUs of this machine in use, "
                         f"this job needs {gpu_count(gpus, model)} ({free} free)"),
    # the instances backend
    "no_instance": ("capacity", lambda gpus, model, down:
                    f"waiting for instances: needs {gpu_count(gpus, model)}, no healthy enabled instance{_down(down)}"),
    "no_instance_model": ("capacity", lambda gpus, model, models, down:
                          f"waiting for instances: needs {gpu_count(gpus, model)}, no healthy instance has {model} "
                          f"GPUs (models: {_models(models)}){_down(down)}"),
    "instances_full": ("capacity", lambda gpus, model, largest, free, hosts, healthy, down:
                       f"waiting for instances: needs {gpu_count(gpus, model)}, largest free block {largest} "
                       f"({free} free on {hosts} of {healthy} healthy instances){_down(down)}"),
    # the kubernetes backend
    "cluster_capacity": ("capacity", lambda cluster, in_use, limit, gpus:
                         f"waiting for capacity on cluster {cluster}: {in_use} of {limit} GPUs in use, "
                         f"this job needs {gpus}"),
    "cluster_behind": ("capacity", lambda: "waiting behind an earlier job for capacity on its cluster"),
}
