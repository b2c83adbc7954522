"""Start a torchrun job's agents, one per host, from its first host: what horovodrun does for a
Horovod job. The SSH runner puts this file and AGENTS (JSON) in the job's control folder on the
first host and runs `python torchrun_agents.py agents.json` there, detached, its output going to
the job's output.log.

It picks a free port for the c10d rendezvous, which the first host's agent serves; starts that
agent here and every other host's over SSH (the instance's peer SSH port and key, as horovodrun
uses them), each through the rank wrapper (in the job's folder, as the job's uid where it has
one); passes each its share of the job's processes and the job's environment; and exits with
the first agent's failure (or 0), so that the follower sees one exit code, as for horovodrun.
No shell parses a word here but the remote login shell, which gets each word quoted.

The job ends at its first failure, as a Horovod job does: the other agents are stopped at once
instead of waiting for the failed one at torchrun's exit barrier. A remote agent runs under
this same program (`agent` mode) on its host, which stops it when its SSH connection's input
ends: when this program closes it, or dies (cancel), the agents over there stop with it.

The standard library only: it runs under the instance's Python, as the SSH account.
"""
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading

AGENTS = "agents.json"


def free_port():
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def agent_argv(plan, host, port):
    """The rank wrapper and torchrun's argv of the agent on `host`."""
    first = plan["hosts"][0]
    return [plan["wrapper"], plan["python"], "-m", "torch.distributed.run", f"--nnodes={len(plan['hosts'])}",
            f"--nproc-per-node={host['slots']}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={first['address']}:{port}", f"--rdzv-id={plan['id']}",
            f"--rdzv-conf=is_host={'true' if host is first else 'false'}", f"--local-addr={host['address']}",
            "--max-restarts=0", "-m", plan["module"]]


def environment(plan, host):
    """The job's variables (this program's, as the SSH runner set them) and the host's name."""
    return {**{name: os.environ[name] for name in plan["forward"] if name in os.environ},
            plan["host_variable"]: host["name"]}


def remote_command(plan, host, port):
    """What the remote login shell runs: in the control folder (the same path on every host),
    the agent with the job's environment, under this program's `agent` mode."""
    words = ["env", *(f"{name}={value}" for name, value in environment(plan, host).items()),
             plan["python"], os.path.basename(__file__), "agent", *agent_argv(plan, host, port)]
    return f"cd -- {shlex.quote(os.getcwd())} && exec {shlex.join(words)}"


def stop(process, grace=10.0):
    """TERM, then KILL after `grace` seconds, the process and its process group."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            return
        try:
            process.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def agent(argv):
    """Run one host's agent until it ends, or until this program's input ends (the first host
    closed its SSH connection): then stop it."""
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)

    def watch():
        while sys.stdin.buffer.read(4096):
            pass
        stop(process)

    threading.Thread(target=watch, daemon=True).start()
    code = process.wait()
    sys.stdout.flush()
    os._exit(code if code >= 0 else 128 - code)     # not through finalization: the watch still reads stdin


def main(path):
    with open(path, encoding="utf-8") as handle:
        plan = json.load(handle)
    port = free_port()
    alive = {}
    for host in plan["hosts"]:
        if host is plan["hosts"][0]:
            process = subprocess.Popen(agent_argv(plan, host, port), env={**os.environ, **environment(plan, host)},
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        else:
            process = subprocess.Popen([*plan["ssh"], host["address"], remote_command(plan, host, port)],
                                       stdin=subprocess.PIPE)
        alive[process.pid] = process

    def end_all(*_):
        for process in list(alive.values()):
            if process.stdin is not None:
                process.stdin.close()          # the remote agent's watch stops it
            else:
                threading.Thread(target=stop, args=(process,), daemon=True).start()

    signal.signal(signal.SIGTERM, end_all)
    first_failure = 0
    while alive:
        pid, status = os.wait()
        if alive.pop(pid, None) is not None:
            code = os.waitstatus_to_exitcode(status)
            if code != 0 and first_failure == 0:
                first_failure = code if code > 0 else 128 - code
                end_all()
    return first_failure


if __name__ == "__main__":
    if sys.argv[1:2] == ["agent"]:
        sys.exit(agent(sys.argv[2:]))
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else AGENTS))
