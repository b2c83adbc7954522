from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from jobs.backends.instances import backend as instances
from jobs.backends.admin_forms import bound, errors_by_option
from jobs.backends.instances.forms import InstanceForm
from jobs.backends.instances.models import Instance
from runners import ssh

# The form's fields whose option is not --field-name.
OPTIONS = {"private_key": "--key-file", "host_key": "--host", "enabled": "--disabled"}


class Command(BaseCommand):
    help = ("Register a GPU instance for the `instances` backend (or update the one with this name). "
            "The key file is read, encrypted with RINGMASTER_FERNET_KEYS and stored; then the instance "
            "is checked over SSH and its host key recorded. Checked by the admin's own form.")

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True)
        parser.add_argument("--host", required=True)
        parser.add_argument("--port", type=int, default=22)
        parser.add_argument("--user", required=True)
        parser.add_argument("--key-file", required=True, help="the SSH private key (unencrypted)")
        parser.add_argument("--gpus", type=int, required=True)
        parser.add_argument("--labels", default="")
        parser.add_argument("--setup", default="", help="a /bin/sh line run before horovodrun")
        parser.add_argument("--work-dir", default=None)
        parser.add_argument("--peer-ssh-port", type=int, default=None, help="horovodrun -p between instances")
        parser.add_argument("--peer-ssh-key", default="", help="horovodrun -i: key path on the instance")
        parser.add_argument("--network-interface", default="")
        parser.add_argument("--disabled", action="store_true")
        parser.add_argument("--no-check", action="store_true", help="do not connect now")

    def handle(self, *args, **o):
        try:
            key = Path(o["key_file"]).read_text()
        except OSError as exc:
            raise CommandError(f"cannot read the key file: {exc.strerror}") from None
        instance = Instance.objects.filter(name=o["name"]).first() or Instance(name=o["name"])
        kept = {"work_dir": o["work_dir"]} if o["work_dir"] else {}       # else the current one
        form = bound(InstanceForm, instance, name=o["name"], host=o["host"], port=o["port"], user=o["user"],
                     gpus=o["gpus"], labels=o["labels"], setup=o["setup"], peer_ssh_port=o["peer_ssh_port"],
                     peer_ssh_key=o["peer_ssh_key"], network_interface=o["network_interface"],
                     enabled=not o["disabled"], private_key=key, **kept)
        if not form.is_valid():
            raise CommandError(errors_by_option(form, OPTIONS))
        instance = form.save(commit=False)
        instance.healthy, instance.health_reason = False, "not checked yet"
        instance.save()
        self.stdout.write(f"instance {instance.name} saved")
        if not o["no_check"]:
            ok, reason = instances.check(instance)
            instance.refresh_from_db()
            self.stdout.write(f"health: {'healthy' if ok else 'UNHEALTHY'}: {reason}")
            if instance.host_key:
                self.stdout.write(f"host key: {ssh.host_key_fingerprint(instance.host_key)}")
