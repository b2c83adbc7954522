"""PyTorch's torchrun (torch.distributed.run): one agent per node starts one worker per GPU,
with RANK, LOCAL_RANK, WORLD_SIZE and MASTER_ADDR/PORT set.

Every worker runs the rank launcher (`-m ringmaster_rank`, job_python/ringmaster_rank.py) in the
job's folder: it binds the job's GPUs, prefixes each line of the worker's output with its global
RANK in horovodrun's format (`[<rank>]<stdout>:`), so that runners.output splits torchrun's
output as it splits horovodrun's, and runs the script under torch.distributed.elastic's `record`,
which writes the worker's error file (TORCHELASTIC_ERROR_FILE). From those files torchrun names
the first failure ("Root Cause (first observed failure)"), which runners.output reads.
"""
import json
from pathlib import Path

from ..base import HOST_NAME_VAR, RANK_MODULE
from . import torchrun_agents

PREFIX_OUTPUT_VAR = "RINGMASTER_PREFIX_OUTPUT"   # the rank launcher prefixes the worker's lines
RENDEZVOUS_PORT = 29400                          # torchrun's usual c10d port


PROGRAM = "torchrun"          # what the job's messages call it

def environment(spec):
    """What every worker's environment adds, whatever the backend."""
    return {PREFIX_OUTPUT_VAR: "1", "PYTHONUNBUFFERED": "1"}


def single_host_argv(spec, start_timeout):
    """torchrun's argv for every worker on this machine: one node, its own rendezvous."""
    return argv(spec, spec.python, spec.gpus)


def argv(spec, python, nproc_per_node, nnodes="1", rendezvous_endpoint=None):
    """torchrun's argv: one node (`--standalone`), or `nnodes` ("2", or "1:4" for an elastic
    job) that meet by c10d rendezvous at `rendezvous_endpoint` ("host:port") under the job's
    name (unique per installation and job). No restarts: a failed worker fails the job, as a
    failed Horovod rank does."""
    if rendezvous_endpoint is None:
        where = ["--standalone"]
    else:
        where = ["--rdzv-backend=c10d", f"--rdzv-endpoint={rendezvous_endpoint}", f"--rdzv-id={spec.name}"]
    return [python, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}",
            *where, "--max-restarts=0", "-m", RANK_MODULE]


# The Kubernetes backend runs a torchrun job as a Kubeflow Trainer TrainJob (a module name: the
# runner imports it, so that no runner module imports a launcher's and the other way round).
KUBERNETES = "runners.trainjob"


def trainer_argv(spec):
    """torchrun's argv in a Kubeflow Trainer TrainJob's node: the torch runtime sets PET_NNODES,
    PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT, which torchrun reads
    as its options (static rendezvous at node 0), so the argv names none of them."""
    return [spec.python, "-m", "torch.distributed.run", "--max-restarts=0", "-m", RANK_MODULE]


def over_ssh(spec, placement):
    """The argv that starts the job's agents from its first host (torchrun_agents: one agent per
    host, c10d rendezvous at a free port of the first, under the job's name), and the files it
    needs in the control folder."""
    ssh = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "LogLevel=ERROR"]
    if placement.ssh_port:
        ssh += ["-p", str(placement.ssh_port)]
    if placement.ssh_key:
        ssh += ["-i", placement.ssh_key]
    plan = {
        "python": spec.python, "wrapper": placement.wrapper[0] if placement.wrapper else "env",
        "id": spec.name, "module": RANK_MODULE, "ssh": ssh, "host_variable": HOST_NAME_VAR,
        "hosts": [{"name": name, "address": address, "slots": slots} for name, address, slots in placement.hosts],
        "forward": list(placement.forward),
    }
    files = {"torchrun_agents.py": Path(torchrun_agents.__file__).read_bytes(),
             torchrun_agents.AGENTS: json.dumps(plan, indent=1).encode()}
    return [spec.python, "torchrun_agents.py", torchrun_agents.AGENTS], files
