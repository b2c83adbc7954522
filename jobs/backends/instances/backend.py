"""The instances backend: horovodrun on interactive GPU instances over SSH (runners.ssh).

Where a job's slots go (placement), their release, the runner's hosts, and health checks.
Placement happens only in an admission pass (jobs.domain.scheduler.admit), in its transaction:
the instance rows are locked FOR UPDATE and the free slots are read from the SlotAllocation
rows, so two admissions can never book the same slots. Slots are released when a job reaches a
terminal state, whichever way it got there (release(), called by jobs.domain.states).
"""
import logging
from collections import defaultdict

from django.conf import settings
from django.db.models import Sum
from django.utils import timezone

from runners import ssh

from jobs import taskqueue
from jobs.backends.base import Admission, Backend, CapacityTable, interpreter_problem
from jobs.backends.placement import ByGpuModel, HostGpus, release_slots
from jobs.backends.waits import Wait
from runners.gpus import matches
from jobs.backends.instances.models import ArtifactsHost, Instance
from jobs.models import SlotAllocation
from jobs.secrets import SecretError

log = logging.getLogger(__name__)


def held(instance_ids):
    """({instance id: slots jobs hold there}, {instance id: [GPU indices they hold]})."""
    slots, indices = defaultdict(int), defaultdict(list)
    for host_id, count, held_indices in (SlotAllocation.objects.filter(host_id__in=list(instance_ids))
                                         .values_list("host_id", "slots", "gpu_indices")):
        slots[host_id] += count
        indices[host_id] += held_indices or []
    return slots, indices


def allocations_by_instance(job_id):
    """[(allocation, instance)] of a job's slots on instances, its first host first."""
    allocations = list(SlotAllocation.objects.filter(job_id=job_id, host_id__isnull=False).order_by("position"))
    instances = Instance.objects.in_bulk([a.host_id for a in allocations])
    return [(a, instances[a.host_id]) for a in allocations if a.host_id in instances]


class Pool:
    """Free slots (and GPU indices) of the healthy, enabled instances, locked for this
    admission pass."""

    def __init__(self):
        rows = list(Instance.objects.select_for_update().filter(enabled=True, healthy=True).order_by("name", "id"))
        used_slots, used_indices = held(i.pk for i in rows)
        self.instances = {i.pk: i for i in rows}
        self.hosts = {i.pk: HostGpus(i.gpu_inventory, i.gpus, used_indices[i.pk], used_slots[i.pk]) for i in rows}
        self.indices = {}

    def capacity(self):
        return sum(host.slots for host in self.hosts.values())

    def models(self):
        return sorted({name for host in self.hosts.values() for name in host.models()})

    def place(self, gpus, model=""):
        """[(instance, slots)] on as few instances as possible (the first runs horovodrun), or
        None with the Wait of the job."""
        if not self.instances:
            return None, Wait("no_instance", gpus=gpus, model=model, down=_unhealthy())
        if model and not any(host.free(model) or any(matches(g["name"], model) for g in host.gpus)
                             for host in self.hosts.values()):
            return None, Wait("no_instance_model", gpus=gpus, model=model, models=self.models(), down=_unhealthy())
        free = {pk: n for pk, host in self.hosts.items() if (n := host.free(model)) > 0}
        fits = [pk for pk, n in free.items() if n >= gpus]
        if fits:
            # Best fit: the instance with the fewest free slots that still holds the whole job.
            best = min(fits, key=lambda pk: (free[pk], self.instances[pk].name))
            return [(self.instances[best], gpus)], None
        total = sum(free.values())
        if total < gpus:
            return None, Wait("instances_full", gpus=gpus, model=model, largest=max(free.values(), default=0),
                              free=total, hosts=len(free), healthy=len(self.instances), down=_unhealthy())
        placement, left = [], gpus
        for pk in sorted(free, key=lambda pk: (-free[pk], self.instances[pk].name)):
            take = min(free[pk], left)
            placement.append((self.instances[pk], take))
            left -= take
            if not left:
                break
        return placement, None

    def grow(self, job_id, count, model=""):
        """Give a job `count` more slots: first on the instances it runs on, then on others
        (the fullest first, as place() does). Returns [(instance name, slots added)]."""
        mine = {a.host_id: a for a in SlotAllocation.objects.select_for_update().filter(job_id=job_id)}
        order = sorted(self.hosts, key=lambda pk: (pk not in mine, -self.hosts[pk].free(model),
                                                  self.instances[pk].name))
        added, position = [], max((a.position for a in mine.values()), default=-1) + 1
        for pk in order:
            take = min(self.hosts[pk].free(model), count)
            if take <= 0:
                continue
            indices = self.hosts[pk].take(take, model)
            if pk in mine:
                allocation = mine[pk]
                allocation.slots += take
                allocation.gpu_indices = list(allocation.gpu_indices) + indices
                allocation.save(update_fields=["slots", "gpu_indices"])
            else:
                SlotAllocation.objects.create(job_id=job_id, host_id=pk, slots=take, position=position,
                                              gpu_indices=indices)
                position += 1
            added.append((self.instances[pk].name, take))
            count -= take
            if not count:
                break
        return added

    def shrink(self, job_id, count):
        """Take `count` slots back from a job, from its last host on; the first host (which runs
        horovodrun) keeps at least one."""
        for allocation in SlotAllocation.objects.select_for_update().filter(job_id=job_id).order_by("-position"):
            if not count:
                break
            keep = max(allocation.slots - count, 1 if allocation.position == 0 else 0)
            given = allocation.slots - keep
            count -= given
            indices = list(allocation.gpu_indices)
            if allocation.host_id in self.hosts:
                self.hosts[allocation.host_id].give_back(given, indices[keep:] if indices else ())
            if keep:
                allocation.slots, allocation.gpu_indices = keep, indices[:keep]
                allocation.save(update_fields=["slots", "gpu_indices"])
            else:
                allocation.delete()

    def allocate(self, job_id, placement, model=""):
        SlotAllocation.objects.bulk_create([
            SlotAllocation(job_id=job_id, host_id=instance.pk, slots=slots, position=position,
                           gpu_indices=self.hosts[instance.pk].take(slots, model))
            for position, (instance, slots) in enumerate(placement)
        ])


def _unhealthy():
    """[(name, why)] of the enabled instances that get no jobs (the first five)."""
    return list(Instance.objects.filter(enabled=True, healthy=False).order_by("name")
                .values_list("name", "health_reason")[:5])


def host_of(instance, slots=0):
    return ssh.Host(
        name=instance.name, address=instance.host, port=instance.port, user=instance.user,
        private_key=instance.private_key(), host_key=instance.host_key, slots=slots, setup=instance.setup,
        work_dir=instance.work_dir, peer_ssh_port=instance.peer_ssh_port, peer_ssh_key=instance.peer_ssh_key,
        network_interface=instance.network_interface,
    )


def remember_host_keys(runner):
    """Store host keys a runner saw for the first time (trust on first use)."""
    for name, key in getattr(runner, "learned_host_keys", {}).items():
        Instance.objects.filter(name=name, host_key="").update(host_key=key)


def set_health(instance, healthy, reason, gpus=None):
    """Record a check. `gpus`: the [Gpu] nvidia-smi listed, or None where it is absent."""
    was = instance.healthy
    inventory = [gpu.as_dict() for gpu in gpus] if gpus else []
    fields = {"healthy": healthy, "health_reason": reason[:500], "health_checked_at": timezone.now()}
    if healthy or gpus is not None:
        fields.update(gpus_detected=None if gpus is None else len(gpus), gpu_inventory=inventory)
    Instance.objects.filter(pk=instance.pk).update(**fields)
    instance.healthy, instance.health_reason = healthy, reason[:500]
    if healthy and not was:
        taskqueue.wake_scheduler()


def check(instance, build=None):
    """Check one instance over SSH and record the result. Returns (healthy, reason).

    `build`: whether the check loads Horovod's frameworks (runners.ssh.check), about 10 CPU-seconds
    on the instance, taken from its jobs. By default only where the instance is not healthy (when
    it is added, and before it gets jobs again); beat's check of a healthy one each minute proves
    that horovodrun starts."""
    if build is None:
        build = not instance.healthy
    try:
        host = host_of(instance)
    except Exception as exc:  # the key cannot be decrypted or read
        set_health(instance, False, str(exc))
        return False, str(exc)
    try:
        seen, gpus, isolation = ssh.check(host, timeout=settings.RINGMASTER_SSH_CONNECT_TIMEOUT_SECONDS, build=build)
    except ssh.InstanceError as exc:
        set_health(instance, False, str(exc))
        return False, str(exc)
    if isolation != instance.isolation:
        Instance.objects.filter(pk=instance.pk).update(isolation=isolation)
        instance.isolation = isolation
    if not instance.host_key:
        Instance.objects.filter(pk=instance.pk, host_key="").update(host_key=seen)
        instance.host_key = seen
    if gpus is not None and len(gpus) < instance.gpus:
        reason = f"nvidia-smi shows {len(gpus)} GPUs, the instance is set to offer {instance.gpus}"
        set_health(instance, False, reason, gpus)
        return False, reason
    if gpus is None:
        reason = "ok: no nvidia-smi (CPU slots)"
    else:
        names = ", ".join(sorted({gpu.name for gpu in gpus}))
        reason = f"ok: {len(gpus)} GPUs seen by nvidia-smi ({names})"
    set_health(instance, True, reason, gpus)
    return True, reason


def check_all():
    results = {}
    for instance in Instance.objects.filter(enabled=True):
        results[instance.name] = check(instance)
    return results


class InstancesAdmission(ByGpuModel, Admission):
    """Slots on instances, as few instances as possible: the instance rows are locked (FOR
    UPDATE) the first time a job of the pass needs them; a job that fits gets a placement,
    written as SlotAllocation rows when it is admitted."""

    def __init__(self, backend, book):
        super().__init__(backend, book)
        self.pool, self.plans, self._grown = None, {}, {}

    def why_waiting(self, job):
        if self.pool is None:
            self.pool = Pool()
        placement, reason = self.pool.place(job.gpus, job.gpu_model)
        if placement is not None:
            self.plans[job.pk] = placement
        return reason

    def admitted_message(self, job):
        return "admitted: " + ", ".join(f"{i.name}:{n}" for i, n in self.plans[job.pk])

    def charge(self, job):
        self.pool.allocate(job.pk, self.plans.pop(job.pk), job.gpu_model)

    def _pool(self):
        if self.pool is None:
            self.pool = Pool()
        return self.pool

    def room(self, job):
        return sum(host.free(job.gpu_model) for host in self._pool().hosts.values())

    def where(self, job):
        grown = self._grown.get(job.pk)
        return "on " + ", ".join(name for name, _ in grown) if grown else "on the instances"

    def resize(self, job, size):
        if size > job.gpus_in_use:
            self._grown[job.pk] = self._pool().grow(job.pk, size - job.gpus_in_use, job.gpu_model)
        else:
            self._pool().shrink(job.pk, job.gpus_in_use - size)

    def lost(self, job):
        """[(instance name, why, slots held there)] of the hosts an elastic job runs on that went
        unhealthy (not its first: horovodrun runs there, and losing it is losing the job)."""
        return [(instance.name, instance.health_reason, allocation.slots) for allocation, instance in allocations_by_instance(job.pk)
                if allocation.position > 0 and not instance.healthy]

    def drop(self, job, name):
        """Free what the job held on instance `name` (lost); returns the slots it held there."""
        allocation = SlotAllocation.objects.select_for_update().get(
            job_id=job.pk, host_id=Instance.objects.values("pk").get(name=name)["pk"])
        allocation.delete()
        return allocation.slots


def isolation_of(instance):
    """What the instance's admin page says about how jobs run there."""
    if not instance.isolation:
        return "not known until a health check succeeds"
    return f"The account {instance.user}: {instance.get_isolation_display()}."


class InstancesBackend(Backend):
    name = "instances"
    label = "GPU instances over SSH"
    admission_class = InstancesAdmission
    elastic = True
    check_every = 60        # an instance that stops answering gets no job a minute later

    def periodic_check(self):
        """Health of every enabled instance over SSH."""
        return {name: ok for name, (ok, _) in check_all().items()}

    def capacity_table(self):
        """Per registered instance: health, the GPUs it offers and the ones its last check saw,
        and which of them jobs hold now."""
        instances = list(Instance.objects.order_by("name"))
        slots, indices = held(i.pk for i in instances)
        rows = [{"instance": instance, "in_use": slots[instance.pk], "held": sorted(set(indices[instance.pk])),
                 "gpus": instance.gpu_inventory} for instance in instances]
        return CapacityTable("instances/capacity.html", rows) if rows else None

    def capacity(self):
        """GPUs of the healthy, enabled instances."""
        return Instance.objects.filter(enabled=True, healthy=True).aggregate(n=Sum("gpus"))["n"] or 0

    def unavailable(self):
        if Instance.objects.filter(enabled=True).exists():
            return None
        return ("No GPU instance is registered (or enabled): an admin adds one with manage.py add_instance, "
                "or in the admin under Instances.")

    def largest_job(self):
        """All the GPUs of the enabled instances, healthy or not: what a job may ever get here."""
        return Instance.objects.filter(enabled=True).aggregate(n=Sum("gpus"))["n"] or 0

    def too_large(self, limit):
        sizes = ", ".join(f"{name}: {gpus}" for name, gpus in
                          Instance.objects.filter(enabled=True).order_by("name").values_list("name", "gpus"))
        return f"The GPU instances hold {limit} GPUs in all ({sizes}); a job cannot ask for more."

    def image_problem(self, image):
        return interpreter_problem(image, "a GPU instance")

    def isolation_note(self):
        """Names the enabled instances where jobs share the SSH account (or where that is not
        known yet): on the others each job runs under a uid of its own."""
        shared = list(Instance.objects.filter(enabled=True).exclude(isolation__startswith="uid")
                      .order_by("name").values_list("name", flat=True))
        if not shared:
            return ""
        return (f"{self.label}: on {', '.join(shared)}, jobs run under the instance's one SSH account "
                f"(it is neither root nor allowed sudo -n, or not checked yet), so they can read each other's "
                f"files and signal each other's processes there.")

    def gpu_models(self):
        names = set()
        for inventory in Instance.objects.filter(enabled=True).values_list("gpu_inventory", flat=True):
            names.update(gpu["name"] for gpu in inventory or [])
        return sorted(names)

    def release(self, job_id):
        release_slots(job_id)

    def runner(self, job):
        allocations = allocations_by_instance(job.pk)
        if not allocations:
            raise ValueError(f"job {job.pk} holds no instance slots")
        hosts = []
        for allocation, instance in allocations:
            try:
                hosts.append(host_of(instance, allocation.slots))
            except SecretError as exc:      # no job can use it until an admin acts: say so there too
                set_health(instance, False, str(exc))
                raise
        return ssh.SSHRunner(
            hosts,
            start_timeout=settings.RINGMASTER_INSTANCE_START_TIMEOUT_SECONDS,
            connect_timeout=settings.RINGMASTER_SSH_CONNECT_TIMEOUT_SECONDS,
        )

    fetches_artifacts = True
    takes_checkpoints = True
    # The project is sent to every host and unpacked in the job's folder, as the job (runners.ssh).
    runs_projects = True

    def collect_artifacts(self, job, room):
        """Bring the job's output folder back from the instance that ran its launcher, over SFTP
        (only that host's: ranks on other hosts write to their own), into the portal's storage."""
        instance = Instance.objects.filter(pk__in=ArtifactsHost.objects.filter(job_id=job.pk).values("instance")).first()
        if instance is None:
            return super().collect_artifacts(job, room)
        from jobs.backends import job_spec
        runner = ssh.SSHRunner([host_of(instance)], connect_timeout=settings.RINGMASTER_SSH_CONNECT_TIMEOUT_SECONDS)
        root = self.artifacts_root(job)
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        kept, note = runner.fetch_artifacts(job_spec(job), root, room)
        remember_host_keys(runner)
        return kept, note

    def watch_hosts(self, job):
        """Check the instances the job runs on besides its first; one that stopped answering is
        recorded unhealthy, and the scheduler drops it from the job at once."""
        for allocation, instance in allocations_by_instance(job.pk):
            if allocation.position == 0 or not instance.healthy:
                continue
            healthy, _ = check(instance)
            if not healthy:
                taskqueue.wake_scheduler()

    def after_launch(self, job, runner, error=None):
        """Keep what a launch learned: new host keys; an instance it could not reach or use gets
        no more jobs until a health check passes."""
        remember_host_keys(runner)
        first = Instance.objects.filter(name=runner.first.name).first()
        if first is not None:           # where its artifacts are brought back from
            ArtifactsHost.objects.update_or_create(job_id=job.pk, defaults={"instance": first})
        if isinstance(error, ssh.InstanceError):
            for host in runner.hosts:
                if str(error).startswith(host.where()):
                    set_health(Instance.objects.get(name=host.name), False, str(error))
