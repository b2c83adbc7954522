import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from jobs.backends.kubernetes import clusters
from jobs.backends.admin_forms import bound, errors_by_option
from jobs.backends.kubernetes.forms import ClusterForm
from jobs.backends.kubernetes.models import Cluster

# The form's fields whose option is not --field-name.
OPTIONS = {"connection": "--kubeconfig", "enabled": "--disabled"}


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
        parser.add_argument("--mpijob-command", choices=Cluster.MPIJobCommand.values, default=Cluster.MPIJobCommand.MPIRUN,
                            help="what an MPIJob's launcher pod runs to start the ranks")
        parser.add_argument("--training-runtime", default="torch-distributed",
                            help="the ClusterTrainingRuntime that torchrun jobs' TrainJobs reference")
        parser.add_argument("--artifacts-volume", default=None,
                            help="a PersistentVolumeClaim the jobs' pods mount as RINGMASTER_OUTPUT_DIR")
        parser.add_argument("--artifacts-path", default=None,
                            help="where the portal mounts the same volume, to list and serve the files")
        parser.add_argument("--backoff-limit", type=int, default=None)
        parser.add_argument("--gpu-limit", type=int, default=None,
                            help="most GPUs of this cluster's jobs at once (default: no limit)")
        parser.add_argument("--disabled", action="store_true")
        parser.add_argument("--no-check", action="store_true", help="do not connect now")

    def handle(self, *args, **o):
        node_selector = _json(o["node_selector"], dict, "--node-selector")
        tolerations = _json(o["tolerations"], list, "--tolerations")
        text = ""
        if o["kubeconfig"]:
            try:
                text = Path(o["kubeconfig"]).read_text()
            except OSError as exc:
                raise CommandError(f"cannot read the kubeconfig: {exc.strerror}") from None
        cluster = Cluster.objects.filter(name=o["name"]).first() or Cluster(name=o["name"])
        connection = Cluster.Connection.KUBECONFIG if o["kubeconfig"] else Cluster.Connection.IN_CLUSTER
        kept = {name: o[name] for name in ("backoff_limit", "artifacts_volume", "artifacts_path") if o[name] is not None}
        form = bound(ClusterForm, cluster, name=o["name"], connection=connection, kubeconfig=text,
                     context=o["context"], namespace=o["namespace"], gpus_per_node=o["gpus_per_node"],
                     node_selector=node_selector, tolerations=tolerations, priority_class=o["priority_class"],
                     kueue_queue=o["kueue_queue"], mpijob_command=o["mpijob_command"],
                     training_runtime=o["training_runtime"], gpu_limit=o["gpu_limit"],
                     enabled=not o["disabled"], **kept)
        form.check_kueue = not o["no_check"]
        if not form.is_valid():
            raise CommandError(errors_by_option(form, OPTIONS))
        cluster = form.save()
        self.stdout.write(f"cluster {cluster.name} saved")
        if not o["no_check"]:
            ok, what = clusters.check(cluster)
            self.stdout.write(f"check: {'ok' if ok else 'FAILED'}: {what}")
