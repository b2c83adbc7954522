"""Run one rank on its job's own GPUs: `python -m ringmaster_bind <script> <args...>`.

horovodrun gives every rank the same environment, but a job owns different GPUs on each of its
hosts. The portal puts them in RINGMASTER_GPU_MAP ("host=0,1;host2=4,5", hosts as horovodrun's
-H names them) and horovodrun tells each rank its host in HOROVOD_HOSTNAME. This sets
CUDA_VISIBLE_DEVICES to that host's indices and then becomes the training script (exec), so
hvd.local_rank() 0, 1, ... is the job's first, second, ... GPU on the host, and an unchanged
Horovod script (torch.cuda.set_device(hvd.local_rank())) trains on what the job owns.

The script's arguments are passed on as they are; nothing here reads them.
"""
import os
import sys

MAP = "RINGMASTER_GPU_MAP"


def indices_for(mapping, host):
    for entry in mapping.split(";"):
        name, _, indices = entry.partition("=")
        if name == host:
            return indices
    return None


def main(argv):
    if len(argv) < 2:
        sys.exit("usage: python -m ringmaster_bind <script> [args...]")
    host = os.environ.get("HOROVOD_HOSTNAME", "")
    indices = indices_for(os.environ.get(MAP, ""), host)
    if indices is None:
        sys.exit(f"ringmaster: this job owns no GPUs on host {host!r} ({MAP}={os.environ.get(MAP, '')!r})")
    os.environ["CUDA_VISIBLE_DEVICES"] = indices
    os.execv(sys.executable, [sys.executable, *argv[1:]])


if __name__ == "__main__":
    main(sys.argv)
