"""The admin's form for an instance, used by add_instance too."""
from django import forms
from django.core.exceptions import ImproperlyConfigured

from jobs.backends.admin_forms import write_only_secret
from jobs.backends.instances.models import Instance
from runners import ssh


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
