"""One form per admin object of the backends (an instance, a cluster), used by the admin and by
the management commands alike, so each rule about their settings lives here once.

The secret of each (an SSH private key, a kubeconfig) is write-only: a new one replaces the
stored one, encrypted (jobs.secrets); it is never shown back, and left empty it is kept.
"""
import json

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, ImproperlyConfigured
from django.forms.models import model_to_dict

from jobs.backends.clusters import (ClusterError, cluster_problems, kueue_refusal, parse_kubeconfig, queue_problem,
                                   record_kueue)
from jobs.models import Cluster, Instance, QueueMapping
from runners import ssh


def write_only_secret(rows, help_text):
    """A form field for a secret that is stored encrypted and never shown back (empty: keep it)."""
    return forms.CharField(widget=forms.Textarea(attrs={"rows": rows, "autocomplete": "off"}), required=False,
                           strip=False, help_text=help_text)


def bound(form_class, instance, **values):
    """`form_class` bound to `instance`'s current values (or its model's defaults) with `values` set
    over them (None: empty), posted as a browser would: how a command sets its options and keeps the
    rest. JSON fields go as text (an empty {} or [] would otherwise read as "no value")."""
    data = {**model_to_dict(instance), **values}
    return form_class(data={name: _posted(value) for name, value in data.items()}, instance=instance)


def _posted(value):
    if value is None:
        return ""
    return json.dumps(value) if isinstance(value, (dict, list)) else value


def errors_by_option(form, options):
    """The form's errors on one line, each named by the command option that set its field:
    "--gpus: Must be at least 1.". `options` names the fields whose option is called otherwise
    ({"private_key": "--key-file"}); a field spelled with _ is also named as the admin has it:
    "--kueue-queue/kueue_queue: ..."."""
    def name(field):
        if field == NON_FIELD_ERRORS:
            return ""
        if field in options:
            return f"{options[field]}: "
        option = "--" + field.replace("_", "-")
        return f"{option}/{field}: " if "_" in field else f"{option}: "

    return "; ".join(name(field) + " ".join(messages) for field, messages in form.errors.items())


class InstanceForm(forms.ModelForm):
    """The private key is write-only: a new one replaces the stored one; it is never shown."""

    private_key = write_only_secret(4, "Paste an unencrypted OpenSSH/PEM private key. Stored encrypted; "
                                       "never shown again. Leave empty to keep the stored key.")

    class Meta:
        model = Instance
        fields = ["name", "host", "port", "user", "gpus", "labels", "enabled", "setup", "work_dir",
                  "peer_ssh_port", "peer_ssh_key", "network_interface", "host_key"]

    def clean_gpus(self):
        gpus = self.cleaned_data["gpus"]
        if gpus is not None and gpus < 1:
            raise forms.ValidationError("Must be at least 1.")
        return gpus

    def clean_private_key(self):
        text = self.cleaned_data.get("private_key") or ""
        if not text.strip():
            if not (self.instance and self.instance.private_key_encrypted):
                raise forms.ValidationError("A private key is required.")
            return ""
        try:
            ssh.load_private_key(text)
        except ssh.InstanceError as exc:
            raise forms.ValidationError(str(exc))
        try:
            self.instance.set_private_key(text)
        except ImproperlyConfigured as exc:
            raise forms.ValidationError(str(exc))
        return text

    def clean(self):
        data = super().clean()
        if self.instance.pk and any(name in self.changed_data for name in ("host", "port")):
            self.instance.host_key = data["host_key"] = ""       # another machine: learn its key anew
        return data


class ClusterForm(forms.ModelForm):
    """The kubeconfig is write-only, like an instance's key: stored encrypted, never shown. The
    settings no MPIJob on the cluster could be created with are refused, named by field."""

    kubeconfig = write_only_secret(6, "Paste a self-contained kubeconfig (certificates and token inline). "
                                      "Stored encrypted; never shown again. Leave empty to keep the stored one.")

    class Meta:
        model = Cluster
        fields = ["name", "enabled", "connection", "context", "namespace", "gpus_per_node", "node_selector",
                  "tolerations", "priority_class", "kueue_queue", "mpijob_command", "training_runtime", "artifacts_volume", "cpu_per_gpu", "memory_per_gpu_gib",
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
