"""Horovod's horovodrun (Gloo): it starts every rank, on every host, and prefixes each line of
their output with the rank (`[<rank>]<stdout>:`). runners.base.horovodrun_argv builds its
command line."""
from ..base import horovodrun_argv


PROGRAM = "horovodrun"          # what the job's messages call it

def environment(spec):
    """What every rank's environment adds, whatever the backend: the job's size, which the rank
    launcher checks hvd.init()'s world against."""
    return spec.world_size_env()


def single_host_argv(spec, start_timeout):
    """horovodrun's argv for every rank on this machine (localhost), run as a module of the
    job's Python (the sandbox has no horovodrun script on its PATH), and the files it needs in
    the job's folder (none)."""
    # Elastic mode probes the network interfaces first and hangs here without one named.
    extra = ["--network-interface", "lo"] if spec.elastic else []
    return horovodrun_argv([spec.python, "-m", "horovod.runner.launch"], spec, f"localhost:{spec.gpus}",
                           start_timeout, extra), {}


# The Kubernetes backend runs a Horovod job as an MPIJob (a module name: the runner imports it).
KUBERNETES = "runners.mpijob"


def over_ssh(spec, placement):
    """horovodrun's argv on the first host (it starts the other hosts' ranks over SSH), and the
    files it needs in the control folder (none)."""
    extra = []
    if len(placement.hosts) > 1 or spec.elastic:
        if placement.ssh_port:
            extra += ["-p", str(placement.ssh_port)]
        if placement.ssh_key:
            extra += ["-i", placement.ssh_key]
    if placement.network_interface:
        extra += ["--network-interface", placement.network_interface]
    hosts = ",".join(f"{name}:{slots}" for name, _, slots in placement.hosts)
    return horovodrun_argv(["horovodrun"], spec, hosts, placement.start_timeout, extra,
                           wrapper=placement.wrapper), {}
