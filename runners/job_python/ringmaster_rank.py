"""Start one rank of a job: `python -m ringmaster_rank`, in the job's folder, on every host.

horovodrun parses its command line with argparse, which reads a script's own words as
abbreviations of horovodrun's options (`--network resnet50` "could match --network-interface"),
so no word of the user reaches horovodrun: the portal writes the rank's command, [script, args...],
to `argv.json` in the job folder, horovodrun starts this module in that folder (on every host:
Gloo cds each rank to the launcher's folder, the same path everywhere), and this module reads
it and becomes the script (exec), so the script gets its words exactly as given.

A job that owns GPUs also gets them here. horovodrun gives every rank the same environment, but
a job owns different GPUs on each of its hosts: the portal puts them in RINGMASTER_GPU_MAP
("host=0,1;host2=4,5", hosts as horovodrun's -H names them), horovodrun tells each rank its host
in HOROVOD_HOSTNAME, and this sets CUDA_VISIBLE_DEVICES to that host's indices, so
hvd.local_rank() 0, 1, ... is the job's first, second, ... GPU there and an unchanged Horovod
script (torch.cuda.set_device(hvd.local_rank())) trains on what the job owns.

A rank of an elastic job (horovodrun sets HOROVOD_ELASTIC=1) runs its script in this process
instead, after turning off Horovod's shortcut of skipping the state sync after a reset that
only removed workers: when workers are removed while a growth's new ones are still joining
(Horovod issue #3494, open), the survivors skip the sync, the new ranks sync, and each waits for
the other for good. With the shortcut off every rank syncs after every reset: one broadcast of
the committed state more on a shrink.
"""
import json
import os
import runpy
import sys

ARGV_FILE = "argv.json"
MAP = "RINGMASTER_GPU_MAP"
# An elastic job's GPUs change while it runs: the portal keeps them in this file of the job folder
# (its name in this variable), and a rank started after a resize reads the map there.
MAP_FILE = "RINGMASTER_GPU_MAP_FILE"


def indices_for(mapping, host):
    for entry in mapping.split(";"):
        name, _, indices = entry.partition("=")
        if name == host:
            return indices
    return None


def read_argv(path=ARGV_FILE):
    try:
        with open(path, encoding="utf-8") as handle:
            argv = json.load(handle)
    except (OSError, ValueError) as exc:
        sys.exit(f"ringmaster: cannot read this rank's command from {os.path.abspath(path)}: {exc}")
    if not (isinstance(argv, list) and argv and all(isinstance(word, str) for word in argv)):
        sys.exit(f"ringmaster: {os.path.abspath(path)} holds no command")
    return argv


def bind_gpus(environ):
    mapping = environ.get(MAP)
    if environ.get(MAP_FILE):
        try:
            with open(environ[MAP_FILE], encoding="utf-8") as handle:
                mapping = handle.read().strip()
        except OSError as exc:
            sys.exit(f"ringmaster: cannot read this job's GPUs from {os.path.abspath(environ[MAP_FILE])}: {exc}")
    if mapping is None:
        return                                  # a job that owns no GPUs of its own
    host = environ.get("HOROVOD_HOSTNAME", "")
    indices = indices_for(mapping, host)
    if indices is None:
        sys.exit(f"ringmaster: this job owns no GPUs on host {host!r} ({MAP}={mapping!r})")
    environ["CUDA_VISIBLE_DEVICES"] = indices


def always_sync_after_a_reset():
    """Every HostsUpdatedInterrupt asks for the state sync (horovod.common.elastic.run_fn skips
    it when the interrupt says only workers were removed)."""
    try:
        from horovod.common import exceptions
    except ImportError:                         # no Horovod here: nothing to change
        return
    interrupt = exceptions.HostsUpdatedInterrupt
    original = interrupt.__init__

    def __init__(self, skip_sync):
        original(self, False)

    interrupt.__init__ = __init__


def run_here(argv):
    """Run the script as `python script args...` would, in this process."""
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    runpy.run_path(argv[0], run_name="__main__")


def main():
    argv = read_argv()
    bind_gpus(os.environ)
    if os.environ.get("HOROVOD_ELASTIC") == "1":
        always_sync_after_a_reset()
        run_here(argv)
    else:
        os.execv(sys.executable, [sys.executable, *argv])


if __name__ == "__main__":
    main()
