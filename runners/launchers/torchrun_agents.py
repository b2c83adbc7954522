"""Start a torchrun job's agents and keep them what the job's size says: what horovodrun does
for a Horovod job. The runner puts this file and AGENTS (JSON, the plan) in a folder of the
job's first host (the SSH runner: the job's control folder; this machine: the job's folder) and
runs `python torchrun_agents.py agents.json` there, detached, its output going to the job's
output.log.

It picks a free port for the c10d rendezvous, which the first agent serves, and starts the
agents: each through the rank wrapper (in the job's folder, as the job's uid where it has one),
with its share of the job's processes and the job's environment; an agent on the first host
directly, one on another host over SSH (the instance's peer SSH port and key, as horovodrun
uses them). It exits with the first agent's failure (or 0), so that the follower sees one exit
code, as for horovodrun. No shell parses a word here but the remote login shell, which gets
each word quoted.

- **A job of one size**: one agent per host, with the host's GPUs, `--nnodes` the hosts. The
  first agent to fail ends the job: the others are stopped immediately, so that none waits for
  it at torchrun's exit barrier. horovodrun likewise ends a job at its first failed rank.
- **An elastic job**: one agent per GPU ("node" of one process), `--nnodes=MIN:MAX`. The portal
  writes the hosts the job holds and their GPUs to the hosts file (`name:slots` lines) at each
  resize; this program reads it every POLL_SECONDS and starts the agents of new GPUs, which join
  the rendezvous (torchrun restarts every worker in a world of the new size), and stops those
  of GPUs taken away (the others' workers fail, and torchrun restarts them without those). The
  first GPU of the first host keeps the rendezvous: a job never gives it back. Agents stopped
  this way fail nothing. Once an agent has finished its workers the job is ending: no agent is
  started any more, a later failure of another fails nothing, and those still running after
  FINISHING_SECONDS (one that joined as the job ended) are stopped.

A remote agent runs under this same program (`agent` mode) on its host, which stops it when its
SSH connection's input ends: when this program closes it, or dies (cancel), the agents over
there stop with it.

The standard library only: it runs under the job's Python, before torch is imported anywhere.
"""
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

AGENTS = "agents.json"
POLL_SECONDS = 0.05          # how often the agents are looked at (and an elastic job's hosts file read)
# Seconds the rendezvous waits for more agents once it has its minimum (torchrun's default, 30,
# would hold every start and resize of an elastic job that long).
LAST_CALL_SECONDS = 3
# An agent stopped for a shrink (or lost with its host) does not leave the rendezvous: torchrun
# keeps a signalled agent's place, so that the job can go on. The others restart without it once
# its heartbeats stop: KEEP_ALIVE_SECONDS apart, missed KEEP_ALIVE_MISSES times (torchrun's
# defaults, 5 s and 3, would hold every shrink 15 s).
KEEP_ALIVE_SECONDS = 1
KEEP_ALIVE_MISSES = 5
# An elastic job whose agent has finished its workers is ending: the agents still running this
# long after are stopped. Those of the last world end within it (torchrun's exit barrier); one
# started by a late growth waits for a rendezvous whose keeper is gone, 60 s and more.
FINISHING_SECONDS = 10


def free_port():
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


class Agent:
    """One agent to run: on `host` (a dict of the plan), its GPUs from `slot` on, `count` of
    them; `keeps_rendezvous` if it serves the c10d store."""

    def __init__(self, host, slot, count, keeps_rendezvous, here):
        self.host, self.slot, self.count, self.keeps_rendezvous = host, slot, count, keeps_rendezvous
        self.here = here           # whether its host is the one this program runs on

    @property
    def key(self):
        return self.host["name"], self.slot

    def argv(self, plan, endpoint):
        """The rank wrapper and torchrun's argv of this agent."""
        elastic = plan.get("elastic")
        nnodes = f"{elastic['min']}:{elastic['max']}" if elastic else str(len(plan["hosts"]))
        conf = f"is_host={'true' if self.keeps_rendezvous else 'false'}"
        if elastic:
            conf += (f",last_call_timeout={LAST_CALL_SECONDS},keep_alive_interval={KEEP_ALIVE_SECONDS}"
                     f",keep_alive_max_attempt={KEEP_ALIVE_MISSES}")
        return [plan["wrapper"], plan["python"], "-m", "torch.distributed.run", f"--nnodes={nnodes}",
                f"--nproc-per-node={self.count}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
                f"--rdzv-id={plan['id']}", f"--rdzv-conf={conf}", f"--local-addr={self.host['address']}",
                f"--max-restarts={plan['max_restarts']}", "-m", plan["module"]]

    def environment(self, plan):
        """The job's variables (this program's, as the runner set them), the agent's own
        (the plan's), its host's name and its first GPU's position there."""
        return {**{name: os.environ[name] for name in plan["forward"] if name in os.environ},
                **plan.get("agent_environment", {}),
                plan["host_variable"]: self.host["name"], plan["slot_variable"]: str(self.slot)}

    def start(self, plan, endpoint):
        """Start it: directly where its host is this one, else over SSH."""
        argv = self.argv(plan, endpoint)
        if self.here:
            return subprocess.Popen(argv, env={**os.environ, **self.environment(plan)},
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        words = ["env", *(f"{name}={value}" for name, value in self.environment(plan).items()),
                 plan["python"], os.path.basename(__file__), "agent", *argv]
        command = f"cd -- {shlex.quote(os.getcwd())} && exec {shlex.join(words)}"
        return subprocess.Popen([*plan["ssh"], self.host["address"], command], stdin=subprocess.PIPE)


def fixed_agents(plan):
    """A job of one size: one agent per host with all of its GPUs."""
    return [Agent(host, 0, host["slots"], index == 0, index == 0) for index, host in enumerate(plan["hosts"])]


def elastic_agents(plan, hosts_file):
    """An elastic job: one agent per GPU that the hosts file lists now (None where it cannot be
    read: the agents stay as they are)."""
    try:
        with open(hosts_file, encoding="utf-8") as handle:
            lines = [line.strip() for line in handle if line.strip()]
        listed = [(name, int(slots)) for name, _, slots in (line.rpartition(":") for line in lines)]
    except (OSError, ValueError):
        return None
    first = plan["hosts"][0]["name"]
    return [Agent({"name": name, "address": name}, slot, 1, (name, slot) == (first, 0), name == first)
            for name, slots in listed for slot in range(slots)]


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


class Job:
    """The agents of one job, started and stopped as the plan (and an elastic job's hosts file)
    says, and the exit code they add up to."""

    def __init__(self, plan):
        self.plan = plan
        self.elastic = plan.get("elastic")
        self.endpoint = f"{plan['hosts'][0]['address']}:{free_port()}"
        self.running = {}          # agent key -> process
        self.leaving = set()       # pids of agents stopped on purpose
        self.first_failure = 0
        self.finished = None       # when an agent's workers all ended well: the job is ending
        self.ending = False        # cancelled, or failed: start nothing more

    def wanted(self):
        if not self.elastic:
            return fixed_agents(self.plan)
        return elastic_agents(self.plan, self.elastic["hosts_file"])

    def reconcile(self):
        """Start the agents that should run and do not; stop those that should not."""
        agents = self.wanted()
        if self.elastic and self.finished is not None and not self.ending \
                and time.monotonic() - self.finished > FINISHING_SECONDS:
            self.end_all()
        if agents is None or self.ending or self.finished is not None:
            return
        keys = {agent.key for agent in agents}
        for key, process in list(self.running.items()):
            if key not in keys:
                self.leave(self.running.pop(key))
        for agent in agents:
            if agent.key not in self.running:
                self.running[agent.key] = agent.start(self.plan, self.endpoint)

    def leave(self, process):
        self.leaving.add(process.pid)
        if process.stdin is not None:
            process.stdin.close()          # the remote agent's watch stops it
        else:
            threading.Thread(target=stop, args=(process,), daemon=True).start()

    def end_all(self, *_):
        self.ending = True
        for process in list(self.running.values()):
            self.leave(process)

    def ended(self, key, code):
        """The agent `key` ended with `code`."""
        pid = self.running.pop(key).pid
        if pid in self.leaving:
            return
        if code == 0:
            self.finished = self.finished or time.monotonic()
        elif self.first_failure == 0 and not (self.elastic and self.finished is not None):
            self.first_failure = code if code > 0 else 128 - code
            self.end_all()

    def run(self):
        self.reconcile()
        signal.signal(signal.SIGTERM, self.end_all)
        while self.running:
            for key, process in list(self.running.items()):
                code = process.poll()          # Popen's own wait: a stop() thread may reap it too
                if code is not None:
                    self.ended(key, code)
            time.sleep(POLL_SECONDS)
            self.reconcile()
        return self.first_failure


def main(path):
    with open(path, encoding="utf-8") as handle:
        return Job(json.load(handle)).run()


if __name__ == "__main__":
    if sys.argv[1:2] == ["agent"]:
        sys.exit(agent(sys.argv[2:]))
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else AGENTS))
