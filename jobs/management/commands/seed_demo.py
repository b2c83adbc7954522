"""Demo data for `make run`: an admin (its password kept in a 0600 file, never printed), an image catalog and the example scripts, and what each
enabled backend adds (Backend.seed: a cluster when KUBECONFIG names one). Idempotent."""
import hashlib
import secrets
import sys
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from jobs import backends
from jobs.management.commands.ready_banner import keep_initial_password
from jobs.models import Image, Script

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class Command(BaseCommand):
    help = "Create the demo admin (its password kept in the data folder for the banner), the image catalog and example scripts."

    def add_arguments(self, parser):
        parser.add_argument("--admin", default="admin")

    def handle(self, admin, **options):
        users = get_user_model()
        if not users.objects.filter(username=admin).exists():
            password = secrets.token_urlsafe(12)
            users.objects.create_superuser(admin, email="", password=password)
            # Never in this output, which may go to a log: the banner `make run` prints on the
            # terminal once everything is up (ready_banner) shows it, until it is changed.
            path = keep_initial_password(admin, password)
            self.stdout.write(f"Created admin user {admin!r}; its password is in {path} (readable by this "
                              "account only) and on the terminal once the portal is ready.")
        else:
            self.stdout.write(f"Admin user {admin!r} exists (reset its password: python manage.py changepassword {admin}).")

        image, created = Image.objects.get_or_create(
            name="horovod-cpu",
            defaults={
                "description": "PyTorch 2.13 (CPU) + Horovod 0.28.1 with Gloo: the environment this portal runs in.",
                "python": sys.executable,
            },
        )
        if created:
            self.stdout.write(f"Image {image.name!r} runs {image.python}")
        image, created = Image.objects.get_or_create(
            name="torch-cpu",
            defaults={
                "description": "PyTorch 2.13 (CPU) for torchrun jobs (DDP over Gloo): the environment this portal runs in.",
                "python": sys.executable,
                "launchers": "torchrun",
            },
        )
        if created:
            self.stdout.write(f"Image {image.name!r} runs torchrun jobs with {image.python}")
        image, created = Image.objects.get_or_create(
            name="horovod-0.28.1",
            defaults={
                "description": "Horovod's own image (Open MPI, sshd, PyTorch), for Kubernetes clusters.",
                "python": "python",
                "container_image": "horovod/horovod:0.28.1",
            },
        )
        if created:
            self.stdout.write(f"Image {image.name!r} runs {image.container_image} on Kubernetes")
        for backend in backends.enabled():
            backend.seed(self.stdout, self.stderr)

        for path in sorted(EXAMPLES.glob("*.py")):
            raw = path.read_bytes()
            _, created = Script.objects.get_or_create(
                owner=None, name=path.name, sha256=hashlib.sha256(raw).hexdigest(),
                defaults={"content": raw.decode(), "size": len(raw)},
            )
            if created:
                self.stdout.write(f"Example script {path.name}")
