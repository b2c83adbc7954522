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

from ..base import HOST_NAME_VAR, HOSTS_FILE, RANK_MODULE, SLOT_VAR
from . import torchrun_agents

PREFIX_OUTPUT_VAR = "RINGMASTER_PREFIX_OUTPUT"   # the rank launcher prefixes the worker's lines
RENDEZVOUS_PORT = 29400                          # torchrun's usual c10d port
# An elastic job's agents restart their workers after a failure this many times: a shrink is one
# (the stopped agent's peers fail), a growth is none. Then the job fails.
ELASTIC_MAX_RESTARTS = 20
# torch 2.13's agents share the rendezvous' TCP store with the workers, and an agent that joins a
# later round waits for ever for the address that the first round's rank 0 published once (it
# publishes it in the first round only): off, each round's rank 0 publishes it.
ELASTIC_ENVIRONMENT = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


PROGRAM = "torchrun"          # what the job's messages call it

def environment(spec):
    """What every worker's environment adds, whatever the backend: prefixed lines, and the job's
    size, which the rank launcher checks the world of the script's init against."""
    return {PREFIX_OUTPUT_VAR: "1", "PYTHONUNBUFFERED": "1", **spec.world_size_env()}


def single_host_argv(spec, start_timeout):
    """torchrun's argv for every worker on this machine, and the files it needs in the job's
    folder: one node with its own rendezvous, or for an elastic job one agent per GPU
    (torchrun_agents, reading the hosts file that the runner keeps there)."""
    if not spec.elastic:
        return argv(spec, spec.python, spec.gpus), {}
    return agents(spec, [("localhost", "localhost", spec.gpus)], ssh=[], wrapper="env", forward=())


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
    host, or per GPU of an elastic job; c10d rendezvous at a free port of the first, under the
    job's name), and the files it needs in the control folder."""
    ssh = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "LogLevel=ERROR"]
    if placement.ssh_port:
        ssh += ["-p", str(placement.ssh_port)]
    if placement.ssh_key:
        ssh += ["-i", placement.ssh_key]
    return agents(spec, placement.hosts, ssh, placement.wrapper[0] if placement.wrapper else "env",
                  placement.forward)


def agents(spec, hosts, ssh, wrapper, forward):
    """torchrun_agents' argv and files (itself and its plan) for a job on `hosts` ((name,
    address, slots), the first one where it runs)."""
    plan = {
        "python": spec.python, "wrapper": wrapper, "id": spec.name, "module": RANK_MODULE, "ssh": ssh,
        "host_variable": HOST_NAME_VAR, "slot_variable": SLOT_VAR,
        "hosts": [{"name": name, "address": address, "slots": slots} for name, address, slots in hosts],
        "forward": list(forward), "max_restarts": 0,
    }
    if spec.elastic:
        plan.update(elastic={"min": spec.min_gpus, "max": spec.max_gpus, "hosts_file": HOSTS_FILE},
                    max_restarts=ELASTIC_MAX_RESTARTS, agent_environment=ELASTIC_ENVIRONMENT)
    files = {"torchrun_agents.py": Path(torchrun_agents.__file__).read_bytes(),
             torchrun_agents.AGENTS: json.dumps(plan, indent=1).encode()}
    return [spec.python, "torchrun_agents.py", torchrun_agents.AGENTS], files
