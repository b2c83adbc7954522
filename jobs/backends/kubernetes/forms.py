"""The admin's forms for a cluster and for a group's or a user's Kueue queue on it, used by
add_cluster and map_queue too."""
from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, ImproperlyConfigured

from jobs.backends.admin_forms import write_only_secret
from jobs.backends.kubernetes.clusters import (ClusterError, cluster_problems, kueue_refusal, parse_kubeconfig,
                                               queue_problem, record_kueue)
from jobs.backends.kubernetes.models import Cluster, QueueMapping


class ClusterForm(forms.ModelForm):
    """The kubeconfig is write-only, like an instance's key: stored encrypted, never shown. The
    settings no MPIJob on the cluster could be created with are refused, named by field."""

    kubeconfig = write_only_secret(6, "Paste a self-contained kubeconfig (certificates and token inline). "
                                      "Stored encrypted; never shown again. Leave empty to keep the stored one.")

    class Meta:
        model = Cluster
        fields = ["name", "enabled", "connection", "context", "namespace", "gpus_per_node", "node_selector",
                  "tolerations", "priority_class", "kueue_queue", "mpijob_command", "training_runtime", "artifacts_volume",
                  "artifacts_path", "cpu_per_gpu", "memory_per_gpu_gib",
                  "clean_pod_policy", "backoff_limit", "ttl_seconds_after_finished", "image_pull_grace_seconds",
                  "gpu_limit"]

    def clean(self):
        data = super().clean()
        self._clean_kubeconfig(data)
        return data

    # Whether a queue name is checked against the cluster (API discovery of Kueue) before it
    # is saved; add_cluster --no-check turns it off.
    check_kueue = True

    def _post_clean(self):
        super()._post_clean()              # the instance now holds the cleaned values
        if not self.errors:
            for field, messages in cluster_problems(self.instance).items():
                for message in messages:
                    self.add_error(None if field == NON_FIELD_ERRORS else field, message)
        if not self.errors and self.check_kueue and self.instance.kueue_queue:
            self._refuse_a_queue_without_kueue()

    def _refuse_a_queue_without_kueue(self):
        """A queue name on a cluster that answers without Kueue is refused: such a job would
        never be admitted. A cluster that cannot be asked now keeps the name (its check says so)."""
        found, detail = record_kueue(self.instance)
        if found is False:
            self.add_error("kueue_queue", kueue_refusal(self.instance, self.instance.kueue_queue, detail))

    def _clean_kubeconfig(self, data):
        text = data.get("kubeconfig") or ""
        if data.get("connection") != Cluster.Connection.KUBECONFIG:
            self.instance.kubeconfig_encrypted = ""
            return
        if not text.strip():
            if not self.instance.kubeconfig_encrypted:
                self.add_error("kubeconfig", "A kubeconfig is required for this connection.")
            return
        try:
            parse_kubeconfig(text, data.get("context", ""))
            self.instance.set_kubeconfig(text)
        except (ClusterError, ImproperlyConfigured) as exc:
            self.add_error("kubeconfig", str(exc))


class QueueMappingForm(forms.ModelForm):
    """A group's or a user's own LocalQueue on a cluster (the admin's inline and map_queue): a
    valid label value, on a cluster whose last check did not find Kueue missing."""

    class Meta:
        model = QueueMapping
        fields = ["cluster", "group", "user", "queue"]

    def clean_queue(self):
        queue = self.cleaned_data["queue"]
        problem = queue_problem(queue)
        if problem:
            raise forms.ValidationError(problem)
        return queue

    def clean(self):
        data = super().clean()
        cluster, queue = data.get("cluster"), data.get("queue")
        if cluster is None and self.instance.cluster_id:    # an inline on its cluster's page
            cluster = self.instance.cluster
        if cluster is not None and queue and cluster.kueue_found is False:
            self.add_error("queue", kueue_refusal(cluster, queue, cluster.kueue_detail))
        return data
