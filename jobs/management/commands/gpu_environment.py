"""`make run` on a machine with GPUs: a second environment, with PyTorch's CUDA build, registered
as the image torch-cuda.

The portal's own .venv keeps PyTorch's CPU build (the images horovod-cpu and torch-cpu run it).
Where this machine's nvidia-smi (RINGMASTER_NVIDIA_SMI, the one the local backend reads) reports
GPUs, deploy/gpu-environment.sh makes the environment `--env` and installs PyTorch's CUDA wheel
there; where the CUDA toolkit's nvcc is found too, deploy/install-horovod.sh builds Horovod there
with HOROVOD_GPU_OPERATIONS=NCCL. The image's launchers are what was built: torchrun, and
horovod with it when Horovod was. Without GPUs, or without nvidia-smi, it does nothing.

A failed install is reported and leaves the portal as it was: this command does not fail
`make run`, whose CPU portal works either way. `--dry-run` prints the plan and changes nothing.
"""
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from jobs.models import Image
from runners import gpus

IMAGE = "torch-cuda"
INSTALL_TORCH = settings.BASE_DIR / "deploy" / "gpu-environment.sh"
INSTALL_HOROVOD = settings.BASE_DIR / "deploy" / "install-horovod.sh"
# Where NVIDIA's installers put the CUDA toolkit when its bin/ is not on PATH.
CUDA_HOMES = ("/usr/local/cuda",)


def find_nvcc():
    """The CUDA toolkit's compiler: on PATH, in $CUDA_HOME or $CUDA_PATH, or in CUDA_HOMES; ""."""
    homes = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), *CUDA_HOMES]
    found = shutil.which("nvcc") or next(
        (str(Path(home, "bin", "nvcc")) for home in homes if home and os.access(Path(home, "bin", "nvcc"), os.X_OK)),
        "")
    return os.path.abspath(found) if found else ""


@dataclass(frozen=True)
class Plan:
    """What this machine gets: `gpus` as nvidia-smi reported them ([] without nvidia-smi, or
    when it failed: `error`), and `nvcc` ("" when the CUDA toolkit is not found)."""

    gpus: tuple
    error: str
    nvcc: str

    @property
    def build(self):
        return bool(self.gpus)

    @property
    def horovod(self):
        return self.build and bool(self.nvcc)

    @property
    def launchers(self):
        return "horovod,torchrun" if self.horovod else "torchrun"

    def describe(self, env):
        """What it will do, one line a step; [] where there is nothing to do and nothing odd."""
        if self.error:
            return [f"No environment with PyTorch's CUDA build: {self.error}"]
        if not self.build:
            return []
        names = sorted({gpu.name for gpu in self.gpus})
        lines = [f"nvidia-smi reports {len(self.gpus)} GPU{'s' if len(self.gpus) != 1 else ''} ({', '.join(names)}): "
                 f"PyTorch's CUDA build goes into {env}, registered as the image {IMAGE} for {self.launchers} jobs"]
        if self.horovod:
            lines.append(f"CUDA toolkit: {self.nvcc}: Horovod is built there with NCCL (HOROVOD_GPU_OPERATIONS=NCCL)")
        else:
            lines.append(f"No CUDA toolkit (nvcc is not on PATH, in $CUDA_HOME or in {', '.join(CUDA_HOMES)}): "
                         f"Horovod is not built with NCCL, so {IMAGE} runs torchrun jobs only; install the "
                         "toolkit and run `make run` again to add Horovod")
        return lines


def plan():
    seen, error = gpus.local_inventory(settings.RINGMASTER_NVIDIA_SMI)
    return Plan(tuple(seen), error, find_nvcc())


def register(python, launchers):
    """Create or update the image torch-cuda; an admin's `enabled` is kept."""
    horovod = " and Horovod 0.28.1 with NCCL" if "horovod" in launchers.split(",") else ""
    image, _ = Image.objects.update_or_create(name=IMAGE, defaults={
        "description": f"PyTorch 2.13 (CUDA){horovod}, for jobs on this machine's GPUs.",
        "python": python, "launchers": launchers, "container_image": ""})
    return image


class Command(BaseCommand):
    help = ("Where nvidia-smi reports GPUs: make an environment with PyTorch's CUDA build (and Horovod "
            f"with NCCL where nvcc is) and register it as the image {IMAGE}. Without GPUs, nothing.")

    def add_arguments(self, parser):
        parser.add_argument("--env", default=str(settings.BASE_DIR / ".venv-cuda"),
                            help="the environment's folder (default: .venv-cuda in the checkout)")
        parser.add_argument("--dry-run", action="store_true", help="print what it would do, and do nothing")
        parser.add_argument("--skip-install", action="store_true",
                            help="install nothing: register --python (default: the environment's) as it is")
        parser.add_argument("--python", default="", help="the interpreter to register (default: <env>/bin/python)")

    def handle(self, *args, env, dry_run, skip_install, python, **options):
        env = Path(env).absolute()
        python = python or str(env / "bin" / "python")
        decided = plan()
        for line in decided.describe(env):
            self.stdout.write(line)
        if dry_run:
            if not decided.build and not decided.error:
                self.stdout.write(f"No GPUs reported by nvidia-smi here: nothing to do ({IMAGE} is not registered)")
            return
        if not decided.build:
            return
        launchers = decided.launchers
        if skip_install:
            if not os.access(python, os.X_OK):
                raise CommandError(f"--skip-install: {python} is not an interpreter that can run")
        else:
            if not self._step("PyTorch's CUDA build", [str(INSTALL_TORCH), str(env), sys.executable]):
                self.stderr.write(f"The image {IMAGE} is not registered; the CPU images work as before. "
                                  f"`make run` tries again (RINGMASTER_TORCH_CUDA_INDEX names the wheels' index).")
                return
            if decided.horovod and not self._step(
                    "Horovod with NCCL", [str(INSTALL_HOROVOD), python],
                    HOROVOD_GPU_OPERATIONS="NCCL", HOROVOD_CUDA_HOME=str(Path(decided.nvcc).parent.parent)):
                self.stderr.write(f"{IMAGE} runs torchrun jobs only.")
                launchers = "torchrun"
        image = register(python, launchers)
        self.stdout.write(f"Image {image.name!r} runs {image.launchers} jobs with {image.python}")

    def _step(self, what, argv, **env):
        """Run one install step, its output shown as it comes; whether it succeeded."""
        self.stdout.flush()
        try:
            done = subprocess.run(argv, cwd=settings.BASE_DIR, env={**os.environ, **env}, stdin=subprocess.DEVNULL)
        except OSError as exc:
            self.stderr.write(f"{what}: {argv[0]} cannot run: {exc}")
            return False
        if done.returncode != 0:
            self.stderr.write(f"{what} failed to install (exit code {done.returncode}; its output is above).")
        return done.returncode == 0
