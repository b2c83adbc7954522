"""The programs that start a job's ranks: Horovod's horovodrun and PyTorch's torchrun.

Each launcher is one module of this package, registered in LAUNCHERS by its name (what a job's
`launcher` field holds). A runner asks the job's launcher for its command line; nothing else
asks which launcher a job has.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class LauncherInfo:
    name: str
    label: str
    expects: str          # what the script must do under it (the job form's help text)


LAUNCHERS = {
    "horovod": LauncherInfo(
        "horovod", "Horovod (horovodrun)",
        "horovodrun starts one process per GPU; the script calls hvd.init() and reads its rank "
        "from Horovod."),
    "torchrun": LauncherInfo(
        "torchrun", "PyTorch (torchrun)",
        "torchrun starts one process per GPU with RANK, LOCAL_RANK and WORLD_SIZE set; the script "
        "calls torch.distributed.init_process_group() (DDP or FSDP)."),
}
DEFAULT = "horovod"      # where an image carries both, and for clients that name none


def choices():
    return [(info.name, info.label) for info in LAUNCHERS.values()]


def of(name):
    """The module of launcher `name` (runners.launchers.horovod, runners.launchers.torchrun)."""
    import importlib

    if name not in LAUNCHERS:
        raise ValueError(f"unknown launcher {name!r}")
    return importlib.import_module(f"{__name__}.{name}")
