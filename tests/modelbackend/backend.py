"""The machines backend: jobs run on registered Machine rows, as many GPUs at once as the
enabled machines have slots; its runner is the fake one of tests/fakebackend (it prints what
two horovodrun ranks would)."""
from pathlib import Path

from django.conf import settings
from django.db.models import F, Sum
from django.utils import timezone

from jobs.backends.base import Backend, CapacityTable
from tests.fakebackend import FakeRunner
from tests.modelbackend.models import Machine


def machines_root():
    return Path(settings.RINGMASTER_JOBS_DIR) / "machines"


class MachinesBackend(Backend):
    name = "machines"
    label = "Machines (tests)"
    launchers = ("horovod",)
    check_every = 120

    def unavailable(self):
        if Machine.objects.filter(enabled=True).exists():
            return None
        return "No machine is registered (or enabled): an admin adds one in the admin under Machines."

    def capacity(self):
        """The slots of the enabled machines; None while there is no machine at all (the backend
        takes no job then, and the capacity page leaves it out)."""
        if not Machine.objects.exists():
            return None
        return Machine.objects.filter(enabled=True).aggregate(n=Sum("slots"))["n"] or 0

    def largest_job(self):
        return self.capacity()

    def runner(self, job):
        return FakeRunner(machines_root())

    def periodic_check(self):
        """Records the check on every enabled machine."""
        machines = Machine.objects.filter(enabled=True)
        machines.update(checked_at=timezone.now(), checks=F("checks") + 1)
        return {name: True for name in machines.values_list("name", flat=True)}

    def capacity_table(self):
        rows = list(Machine.objects.all())
        return CapacityTable("modelbackend/capacity.html", rows) if rows else None
