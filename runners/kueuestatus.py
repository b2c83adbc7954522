"""What Kueue's view of a job (runners.kueue.QueueView) means in plain words: pure functions
over the API's JSON.

- waiting(): why Kueue holds the job (which ClusterQueue, which resource, how much the job
  asks and how much is free), and apart from it its place in the queue where the cluster tells
  it: the place changes often, the reason seldom, and only a new reason is worth a job event;
- eviction(): why Kueue took a running job's quota back (preempted or evicted), with Kueue's
  reason, or "" where it did not.
"""
import re
from dataclasses import dataclass

GPU = "nvidia.com/gpu"
# Kueue's flavor assigner: "couldn't assign flavors to pod set worker: insufficient unused quota
# for nvidia.com/gpu in flavor default-flavor, 8 more needed" (or "insufficient quota ..." where
# the job asks for more than the whole quota).
_SHORT = re.compile(r"insufficient (unused )?quota for (?P<resource>\S+) in flavor (?P<flavor>[^,\s]+)"
                    r"(, (?P<more>\d+) more needed)?")


def condition(workload, ctype):
    """The Workload's condition `ctype` (any status), or None."""
    for cond in ((workload or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return cond
    return None


def is_true(workload, ctype):
    return (condition(workload, ctype) or {}).get("status") == "True"


def asked(workload, resource=GPU):
    """How much of `resource` the Workload's pod sets ask for in all."""
    total = 0
    for pod_set in (workload.get("spec") or {}).get("podSets") or []:
        for container in ((pod_set.get("template") or {}).get("spec") or {}).get("containers") or []:
            resources = container.get("resources") or {}
            value = (resources.get("limits") or {}).get(resource) or (resources.get("requests") or {}).get(resource)
            total += int(value or 0) * int(pod_set.get("count") or 1)
    return total


@dataclass(frozen=True)
class Held:
    """Why Kueue holds a job (`words`; "" where it does not), and where it stands in its queue
    (`place`, "; position 2 in ClusterQueue q" or ""); str() is the two together."""
    words: str
    place: str = ""

    def __str__(self):
        return self.words + self.place


def _place(view):
    if view.position is not None:
        return f"; position {view.position} in ClusterQueue {view.cluster_queue or '?'}"
    if view.pending:
        return f"; {view.pending} workloads pending in LocalQueue {view.queue}"
    return ""


def waiting(view):
    """Why Kueue holds the job now, and its place in the queue (a Held)."""
    workload = view.workload
    where = f"ClusterQueue {view.cluster_queue}" if view.cluster_queue else f"LocalQueue {view.queue}"
    if workload is None:
        return Held(f"waiting for Kueue to queue the job in LocalQueue {view.queue}")
    if is_true(workload, "Admitted"):
        return Held("")
    if is_true(workload, "QuotaReserved"):
        return Held(f"quota reserved in {where}: waiting for Kueue's admission checks")
    before = ""
    evicted = condition(workload, "Evicted")
    if evicted and evicted.get("status") == "True":
        before = f"{eviction_words(workload)}; "
    reserved = condition(workload, "QuotaReserved")
    message = (reserved or {}).get("message", "")
    short = _SHORT.search(message)
    if short:
        resource, flavor = short["resource"], short["flavor"]
        need = asked(workload, resource)
        if short["more"] is not None:
            free = max(need - int(short["more"]), 0)
            return Held(f"{before}waiting in Kueue: {where} has {free} {resource} free in flavor {flavor}, "
                        f"the job asks for {need}", _place(view))
        return Held(f"{before}waiting in Kueue: the job asks for {need} {resource}, more than {where} has in "
                    f"flavor {flavor}", _place(view))
    if message:
        return Held(f"{before}waiting in Kueue ({where}): {message}", _place(view))
    return Held(f"{before}waiting in Kueue for admission to {where}", _place(view))


def eviction_words(workload):
    """Kueue's reason for taking the job's quota back, in words."""
    for ctype, what in (("Preempted", "preempted"), ("Evicted", "evicted")):
        cond = condition(workload, ctype)
        if cond and cond.get("status") == "True":
            return f"{what} by Kueue ({cond.get('reason') or ctype}): {cond.get('message', '')}".rstrip(": ")
    return ""


def eviction(view):
    """Why Kueue stopped the running job (it preempted or evicted its Workload), or ""."""
    return eviction_words(view.workload) if view is not None and view.workload is not None else ""
