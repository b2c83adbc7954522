import json
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.management.base import BaseCommand, CommandError

from jobs.backends import clusters
from jobs.models import Cluster


def _json(value, kind, option):
    try:
        data = json.loads(value)
    except ValueError as exc:
        raise CommandError(f"{option}: not valid JSON ({exc})") from None
    if not isinstance(data, kind):
        raise CommandError(f"{option}: must be a JSON {'object' if kind is dict else 'list'}")
    return data


class Command(BaseCommand):
    help = ("Register a Kubernetes cluster with the MPI operator for the `kubernetes` backend (or update "
            "the one with this name). The kubeconfig is read, encrypted with RINGMASTER_FERNET_KEYS and "
            "stored; then the cluster is checked.")

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True)
        how = parser.add_mutually_exclusive_group(required=True)
        how.add_argument("--kubeconfig", help="a kubeconfig file (self-contained: certificates inline)")
        how.add_argument("--in-cluster", action="store_true", help="use the portal's own service account")
        parser.add_argument("--context", default="", help="kubeconfig context (default: its current one)")
        parser.add_argument("--namespace", required=True, help="where MPIJobs go; {group}: one per group")
        parser.add_argument("--gpus-per-node", type=int, required=True)
        parser.add_argument("--node-selector", default="{}", help='JSON, e.g. {"gpu": "a100"}')
        parser.add_argument("--tolerations", default="[]", help="JSON list of tolerations")
        parser.add_argument("--priority-class", default="")
        parser.add_argument("--kueue-queue", default="", help="Kueue LocalQueue name")
        parser.add_argument("--launcher", choices=Cluster.Launcher.values, default=Cluster.Launcher.MPIRUN)
        parser.add_argument("--backoff-limit", type=int, default=None)
        parser.add_argument("--gpu-limit", type=int, default=None,
                            help="most GPUs of this cluster's jobs at once (default: no limit)")
        parser.add_argument("--disabled", action="store_true")
        parser.add_argument("--no-check", action="store_true", help="do not connect now")

    def handle(self, *args, **o):
        if o["gpus_per_node"] < 1:
            raise CommandError("--gpus-per-node must be at least 1")
        node_selector = _json(o["node_selector"], dict, "--node-selector")
        tolerations = _json(o["tolerations"], list, "--tolerations")
        cluster = Cluster.objects.filter(name=o["name"]).first() or Cluster(name=o["name"])
        if o["kubeconfig"]:
            try:
                text = Path(o["kubeconfig"]).read_text()
            except OSError as exc:
                raise CommandError(f"cannot read the kubeconfig: {exc.strerror}") from None
            try:
                clusters.parse_kubeconfig(text, o["context"])
                cluster.set_kubeconfig(text)
            except (clusters.ClusterError, ImproperlyConfigured) as exc:
                raise CommandError(str(exc)) from None
            cluster.connection = Cluster.Connection.KUBECONFIG
        else:
            cluster.connection, cluster.kubeconfig_encrypted = Cluster.Connection.IN_CLUSTER, ""
        cluster.context, cluster.namespace, cluster.gpus_per_node = o["context"], o["namespace"], o["gpus_per_node"]
        cluster.node_selector, cluster.tolerations = node_selector, tolerations
        cluster.priority_class, cluster.kueue_queue = o["priority_class"], o["kueue_queue"]
        cluster.launcher, cluster.enabled = o["launcher"], not o["disabled"]
        if o["backoff_limit"] is not None:
            cluster.backoff_limit = o["backoff_limit"]
        cluster.gpu_limit = o["gpu_limit"]
        try:
            cluster.full_clean()
        except ValidationError as exc:
            raise CommandError("; ".join(f"{field}: {' '.join(messages)}"
                                         for field, messages in exc.message_dict.items())) from None
        cluster.save()
        self.stdout.write(f"cluster {cluster.name} saved")
        if not o["no_check"]:
            ok, what = clusters.check(cluster)
            self.stdout.write(f"check: {'ok' if ok else 'FAILED'}: {what}")
