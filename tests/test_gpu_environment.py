"""`manage.py gpu_environment` (which `make run` runs) and deploy/gpu-environment.sh: on a machine
whose nvidia-smi reports GPUs, an environment with PyTorch's CUDA build registered as the image
torch-cuda (with Horovod where nvcc is); elsewhere nothing. nvidia-smi is the fake of
tests/fakegpu on PATH; the install steps are stand-ins that record how they were called, and
the script's own pip and venv are a fake interpreter: nothing is downloaded or built."""
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command

from jobs.management.commands import gpu_environment
from jobs.models import Image
from tests.conftest import ROOT, install_fake_nvidia_smi

pytestmark = pytest.mark.django_db

H100 = "NVIDIA H100 80GB HBM3"


def executable(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def machine(tmp_path, monkeypatch, settings):
    """A PATH of one folder (plus the venv's python3, which the fake nvidia-smi runs with): give
    it GPUs with machine.gpus([...]), a CUDA toolkit with machine.nvcc()."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}")
    for name in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(gpu_environment, "CUDA_HOMES", ())     # not this host's /usr/local/cuda
    settings.RINGMASTER_NVIDIA_SMI = "nvidia-smi"                # found on PATH, as by default

    class Machine:
        env = tmp_path / "venv-cuda"

        def gpus(self, names, **config):
            install_fake_nvidia_smi(bin_dir, names, **config)

        def nvcc(self, folder=bin_dir):
            return executable(folder / "nvcc", "#!/bin/sh\necho 'Cuda compilation tools, release 12.8'\n")
    return Machine()


@pytest.fixture
def steps(tmp_path, monkeypatch):
    """Stand-ins for the two install steps: each logs its argv and environment; steps.fail(name)
    makes one exit 1."""
    log = tmp_path / "steps.jsonl"
    record = ("#!{python}\nimport json, os, sys\n"
              "with open({log!r}, 'a') as f: f.write(json.dumps({{'step': {name!r}, 'argv': sys.argv[1:], "
              "'gpu_ops': os.environ.get('HOROVOD_GPU_OPERATIONS'), 'cuda_home': os.environ.get('HOROVOD_CUDA_HOME')}})"
              " + '\\n')\nsys.exit({code})\n")

    class Steps:
        def set(self, torch=0, horovod=0):
            for name, code, attribute in (("torch", torch, "INSTALL_TORCH"), ("horovod", horovod, "INSTALL_HOROVOD")):
                script = executable(tmp_path / f"install-{name}", record.format(python=sys.executable, log=str(log),
                                                                                name=name, code=code))
                monkeypatch.setattr(gpu_environment, attribute, script)

        def calls(self):
            return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    steps = Steps()
    steps.set()
    return steps


def run(*args):
    out, err = io.StringIO(), io.StringIO()
    call_command("gpu_environment", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_gpus_without_nvcc_plan_a_cuda_environment_for_torchrun_only(machine, steps):
    machine.gpus([H100] * 8)
    plan = gpu_environment.plan()
    assert (len(plan.gpus), plan.build, plan.horovod, plan.launchers) == (8, True, False, "torchrun")
    out, _ = run("--dry-run", "--env", str(machine.env))
    assert f"nvidia-smi reports 8 GPUs ({H100})" in out
    assert f"{machine.env}, registered as the image torch-cuda for torchrun jobs" in out
    assert "No CUDA toolkit (nvcc is not on PATH" in out and "torchrun jobs only" in out
    assert steps.calls() == [] and not machine.env.exists() and not Image.objects.filter(name="torch-cuda").exists()


@pytest.mark.parametrize("where", ["PATH", "CUDA_HOME", "CUDA_HOMES"])
def test_gpus_and_nvcc_plan_horovod_with_nccl_too(machine, steps, tmp_path, monkeypatch, where):
    machine.gpus([H100, H100])
    if where == "PATH":
        nvcc = machine.nvcc()
    else:
        nvcc = machine.nvcc(tmp_path / "cuda-12.8" / "bin")
        if where == "CUDA_HOME":
            monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda-12.8"))
        else:
            monkeypatch.setattr(gpu_environment, "CUDA_HOMES", (str(tmp_path / "cuda-12.8"),))
    plan = gpu_environment.plan()
    assert (plan.nvcc, plan.horovod, plan.launchers) == (str(nvcc), True, "horovod,torchrun")
    out, _ = run("--dry-run", "--env", str(machine.env))
    assert "image torch-cuda for horovod,torchrun jobs" in out
    assert f"CUDA toolkit: {nvcc}: Horovod is built there with NCCL (HOROVOD_GPU_OPERATIONS=NCCL)" in out
    assert steps.calls() == [] and not Image.objects.filter(name="torch-cuda").exists()


def _images():
    return list(Image.objects.order_by("name").values())


@pytest.mark.parametrize("nvidia_smi", ["absent", "no GPUs", "fail", "garbage"])
def test_without_gpus_nothing_is_installed_or_registered(machine, steps, settings, tmp_path, nvidia_smi):
    settings.DATA_DIR = tmp_path                                  # seed_demo keeps the admin's password here
    call_command("seed_demo", stdout=io.StringIO())
    machine.nvcc()                                                # a toolkit alone is not a reason
    if nvidia_smi == "no GPUs":
        machine.gpus([])
    elif nvidia_smi != "absent":
        machine.gpus([H100], behaviour=nvidia_smi)
    before = _images()
    plan = gpu_environment.plan()
    assert (plan.build, plan.horovod) == (False, False)
    dry, _ = run("--dry-run", "--env", str(machine.env))
    out, err = run("--env", str(machine.env))
    assert steps.calls() == [] and not machine.env.exists()
    assert _images() == before and "torch-cuda" not in [image["name"] for image in before]
    if nvidia_smi in ("fail", "garbage"):
        # A broken driver is worth one calm line, with what nvidia-smi said.
        assert out.startswith("No environment with PyTorch's CUDA build: nvidia-smi") and out.count("\n") == 1
        assert ("Driver/library version mismatch" if nvidia_smi == "fail" else "couldn't communicate") in out
    else:
        assert out == "" and "nothing to do" in dry
    assert err == ""


def test_registration_creates_then_updates_the_image_keeping_the_admins_switch(machine, steps):
    machine.gpus([H100] * 4)
    nvcc = machine.nvcc()
    out, _ = run("--env", str(machine.env), "--skip-install", "--python", sys.executable)
    image = Image.objects.get(name="torch-cuda")
    assert (image.python, image.launchers, image.enabled, image.container_image) == (
        sys.executable, "horovod,torchrun", True, "")
    assert image.launcher_names() == ["horovod", "torchrun"] and "Horovod 0.28.1 with NCCL" in image.description
    image.full_clean()
    assert f"Image 'torch-cuda' runs horovod,torchrun jobs with {sys.executable}" in out
    assert steps.calls() == []

    Image.objects.filter(pk=image.pk).update(enabled=False, python="/elsewhere/python")   # an admin's edits
    nvcc.unlink()
    run("--env", str(machine.env), "--skip-install", "--python", sys.executable)
    image = Image.objects.get(name="torch-cuda")
    assert (image.python, image.launchers, image.enabled) == (sys.executable, "torchrun", False)
    assert "Horovod" not in image.description and Image.objects.filter(name="torch-cuda").count() == 1


def test_skip_install_refuses_an_interpreter_that_is_not_there(machine, steps, tmp_path):
    machine.gpus([H100])
    with pytest.raises(Exception, match="is not an interpreter that can run"):
        run("--env", str(machine.env), "--skip-install")             # <env>/bin/python: never made
    assert not Image.objects.filter(name="torch-cuda").exists()


def test_install_steps_run_in_order_with_nccl_and_register_the_environments_python(machine, steps):
    machine.gpus([H100] * 8)
    nvcc = machine.nvcc()
    out, err = run("--env", str(machine.env))
    python = str(machine.env / "bin" / "python")
    assert [(c["step"], c["argv"], c["gpu_ops"]) for c in steps.calls()] == [
        ("torch", [str(machine.env), sys.executable], None),
        ("horovod", [python], "NCCL"),
    ]
    assert steps.calls()[1]["cuda_home"] == str(nvcc.parent.parent)
    image = Image.objects.get(name="torch-cuda")
    assert (image.python, image.launchers) == (python, "horovod,torchrun") and err == ""


def test_without_nvcc_horovod_is_not_built(machine, steps):
    machine.gpus([H100] * 8)
    run("--env", str(machine.env))
    assert [c["step"] for c in steps.calls()] == ["torch"]
    assert Image.objects.get(name="torch-cuda").launchers == "torchrun"


def test_a_failed_cuda_install_is_reported_and_registers_nothing(machine, steps):
    machine.gpus([H100] * 8)
    machine.nvcc()
    steps.set(torch=1)
    out, err = run("--env", str(machine.env))                    # returns: make run goes on
    assert [c["step"] for c in steps.calls()] == ["torch"]
    assert "PyTorch's CUDA build failed to install (exit code 1" in err
    assert "torch-cuda is not registered; the CPU images work as before" in err
    assert "RINGMASTER_TORCH_CUDA_INDEX" in err
    assert not Image.objects.filter(name="torch-cuda").exists()


def test_a_failed_horovod_build_leaves_torch_cuda_for_torchrun(machine, steps):
    machine.gpus([H100] * 8)
    machine.nvcc()
    steps.set(horovod=1)
    out, err = run("--env", str(machine.env))
    assert [c["step"] for c in steps.calls()] == ["torch", "horovod"]
    assert "Horovod with NCCL failed to install" in err and "torch-cuda runs torchrun jobs only" in err
    assert Image.objects.get(name="torch-cuda").launchers == "torchrun"


def test_make_run_runs_the_command_after_the_database_is_ready():
    dry = subprocess.run(["make", "-n", "run"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    lines = dry.splitlines()
    command = next(i for i, line in enumerate(lines) if "manage.py gpu_environment --env .venv-cuda" in line)
    assert command > next(i for i, line in enumerate(lines) if "manage.py seed_demo" in line)
    assert "--skip-install" not in lines[command] and "--dry-run" not in lines[command]
    assert gpu_environment.INSTALL_TORCH == ROOT / "deploy" / "gpu-environment.sh"
    assert gpu_environment.INSTALL_HOROVOD == ROOT / "deploy" / "install-horovod.sh"


# deploy/gpu-environment.sh itself, with a fake interpreter: `-m venv` copies it into the
# environment, where `-m pip install torch` installs the torch $FAKE_TORCH_INSTALLS ("cuda", "cpu",
# or "" for a failure), and `-c` answers the script's questions about the installed torch.
FAKE_PYTHON = r'''#!/bin/sh
here=$(dirname "$0"); state="$here/torch"; echo "$*" >> "$FAKE_PYTHON_LOG"
case "$1" in
  -m) case "$2" in
        venv) mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; exit 0 ;;
        pip) case "$3 $4" in
               "install -q") [ "$5" = --upgrade ] && exit 0
                             [ -n "$FAKE_TORCH_INSTALLS" ] || { echo "ERROR: No matching distribution" >&2; exit 1; }
                             echo "$FAKE_TORCH_INSTALLS" > "$state"; exit 0 ;;
               "uninstall -q") rm -f "$state"; exit 0 ;;
             esac ;;
      esac; exit 2 ;;
  -c) [ -f "$state" ] || exit 1
      case "$2" in
        *sys.exit*) [ "$(cat "$state")" = cuda ]; exit ;;
        *torch.version.cuda*) echo 12.8; exit 0 ;;
        *torch.__version__*) [ "$(cat "$state")" = cuda ] && echo 2.13.0+cu128 || echo 2.13.0+cpu; exit 0 ;;
      esac; exit 2 ;;
esac
exit 2
'''


@pytest.fixture
def install_torch(tmp_path):
    base = executable(tmp_path / "base" / "python", FAKE_PYTHON)
    log = tmp_path / "python.log"

    def install(torch, index=None):
        env = {"PATH": os.environ["PATH"], "FAKE_PYTHON_LOG": str(log), "FAKE_TORCH_INSTALLS": torch}
        if index:
            env["RINGMASTER_TORCH_CUDA_INDEX"] = index
        done = subprocess.run([str(ROOT / "deploy" / "gpu-environment.sh"), str(tmp_path / "env"), str(base)],
                              env=env, capture_output=True, text=True, timeout=30)
        calls = log.read_text().splitlines()
        log.unlink()
        return done, calls
    return install


def test_the_script_installs_the_cuda_build_from_the_index_once(install_torch, tmp_path):
    done, calls = install_torch("cuda")
    assert done.returncode == 0, done.stderr
    assert "-m pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" in calls
    assert calls[0] == f"-m venv {tmp_path / 'env'}"
    assert "torch 2.13.0 with CUDA 12.8 installed" in done.stdout
    again, calls = install_torch("cuda")
    assert again.returncode == 0 and "already installed" in again.stdout
    assert not any("venv" in call or "pip" in call for call in calls)


def test_the_script_fails_clearly_when_the_index_gives_nothing(install_torch):
    done, calls = install_torch("", index="https://mirror.example/whl/cu126")
    assert done.returncode == 1
    assert "-m pip install -q torch==2.13.0 --index-url https://mirror.example/whl/cu126" in calls
    assert "did not install from https://mirror.example/whl/cu126" in done.stderr


def test_the_script_refuses_a_cpu_build_and_removes_it_for_the_next_try(install_torch, tmp_path):
    done, calls = install_torch("cpu")
    assert done.returncode == 1
    assert "pip installed torch 2.13.0+cpu, which is not a CUDA build" in done.stderr
    assert "-m pip uninstall -q -y torch" in calls and not (tmp_path / "env" / "bin" / "torch").exists()
    retry, calls = install_torch("cuda")
    assert retry.returncode == 0 and any("--index-url" in call for call in calls)
