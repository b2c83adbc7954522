from django.db import models


class Machine(models.Model):
    """A place the machines backend runs jobs: its slots count towards the backend's capacity
    while it is enabled."""

    name = models.CharField(max_length=100, unique=True)
    slots = models.PositiveIntegerField(default=1)
    enabled = models.BooleanField(default=True)
    # What the backend's periodic check (MachinesBackend.periodic_check) records.
    checked_at = models.DateTimeField(null=True, blank=True, editable=False)
    checks = models.PositiveIntegerField(default=0, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name
