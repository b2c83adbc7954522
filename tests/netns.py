"""A server that stands in for the internet: in a network namespace of its own, reached from this
machine through a veth pair, so that a job's way out (RINGMASTER_JOB_NETWORK=outbound) can be
tried without the internet. Needs root and iproute2."""
import os
import subprocess
import sys
from contextlib import contextmanager


def _ip(*argv):
    subprocess.run(["ip", *argv], check=True, capture_output=True)


@contextmanager
def outside_server(source, *args):
    """Run python `source` (with `args`) in a new network namespace whose veth pair sits on a /30
    of 10.251.0.0/16 picked by this process's pid; `source` prints "up" once it listens. Yields
    the server's address; the namespace, the pair and the server are gone afterwards."""
    pid = os.getpid()
    name, here, there = f"rm-inet-{pid}", f"rmi{pid}a", f"rmi{pid}b"
    prefix, base = f"10.251.{(pid >> 6) & 255}", (pid & 63) * 4
    near, far = f"{prefix}.{base + 1}", f"{prefix}.{base + 2}"
    _ip("netns", "add", name)
    server = None
    try:
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        _ip("link", "set", there, "netns", name)
        _ip("addr", "add", f"{near}/30", "dev", here)
        _ip("link", "set", here, "up")
        _ip("netns", "exec", name, "ip", "addr", "add", f"{far}/30", "dev", there)
        _ip("netns", "exec", name, "ip", "link", "set", there, "up")
        _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        server = subprocess.Popen(["ip", "netns", "exec", name, sys.executable, "-c", source, *args],
                                  stdout=subprocess.PIPE, text=True)
        if server.stdout.readline().strip() != "up":
            raise RuntimeError("the outside server did not start")
        yield far
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
