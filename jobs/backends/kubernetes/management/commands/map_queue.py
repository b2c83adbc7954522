"""map_queue --cluster C (--group G | --user U) --queue Q

Sends a group's or a user's jobs on cluster C to the Kueue LocalQueue Q (their
kueue.x-k8s.io/queue-name label), in place of the cluster's own queue; a user's mapping wins over
their group's. `--queue ""` removes the mapping. The same form as the admin's checks it.
"""
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError

from jobs.backends.admin_forms import errors_by_option
from jobs.backends.kubernetes.forms import QueueMappingForm
from jobs.backends.kubernetes.models import Cluster, QueueMapping

OPTIONS = {"queue": "--queue", "cluster": "--cluster", "group": "--group", "user": "--user"}


class Command(BaseCommand):
    help = "Map a group or a user to its own Kueue LocalQueue on a cluster (empty --queue: remove the mapping)."

    def add_arguments(self, parser):
        parser.add_argument("--cluster", required=True, help="the cluster's name")
        who = parser.add_mutually_exclusive_group(required=True)
        who.add_argument("--group")
        who.add_argument("--user")
        parser.add_argument("--queue", required=True, help="the LocalQueue name (empty: remove the mapping)")

    def handle(self, *args, **o):
        cluster = Cluster.objects.filter(name=o["cluster"]).first()
        if cluster is None:
            names = ", ".join(Cluster.objects.values_list("name", flat=True)) or "none"
            raise CommandError(f"--cluster: no cluster {o['cluster']!r} (clusters: {names})")
        if o["group"] is not None:
            field, who = "group", Group.objects.filter(name=o["group"]).first()
            if who is None:
                raise CommandError(f"--group: no group {o['group']!r}")
        else:
            field, who = "user", get_user_model().objects.filter(username=o["user"]).first()
            if who is None:
                raise CommandError(f"--user: no user {o['user']!r}")
        mapping = QueueMapping.objects.filter(cluster=cluster, **{field: who}).first()
        if not o["queue"]:
            if mapping is not None:
                mapping.delete()
            self.stdout.write(f"{field} {who} on {cluster.name}: the cluster's queue "
                              f"({cluster.kueue_queue or 'none'})")
            return
        form = QueueMappingForm(data={"cluster": cluster.pk, field: who.pk, "queue": o["queue"]},
                                instance=mapping or QueueMapping())
        if not form.is_valid():
            raise CommandError(errors_by_option(form, OPTIONS))
        saved = form.save()
        self.stdout.write(f"{field} {who} on {cluster.name}: LocalQueue {saved.queue}")
