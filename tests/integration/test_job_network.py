"""A job's network on this machine (RINGMASTER_JOB_NETWORK), with the real bubblewrap, pasta,
horovodrun and Horovod: under "none" and "outbound" a 2-rank job all-reduces over a namespace of
its own and reaches none of this machine's services (PostgreSQL, Redis, the broker, a web port)
on loopback or on any address of the machine; under "outbound" it reaches a server that stands in
for the internet (in a network namespace of its own, behind a veth pair), and under "none" not.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from runners.base import JOB_DIR_VAR, JobSpec
from runners.local import LocalRunner
from runners.sandbox import find
from tests.conftest import processes_marked, run_to_end, wait_for
from tests.netns import outside_server

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bwrap") or not shutil.which("pasta"),
                       reason="needs root, bubblewrap and pasta (apt-get install bubblewrap passt)"),
]

PROBE = """
import json, socket, sys
import horovod.torch as hvd
import torch

hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), name="sum", op=hvd.Sum).item()
reached, outside = [], None
if hvd.rank() == 0:
    for host, port in json.loads(sys.argv[1]):
        try:
            socket.create_connection((host, port), timeout=3).close()
            reached.append([host, port])
        except OSError:
            pass
    try:
        with socket.create_connection(tuple(json.loads(sys.argv[2])), timeout=5) as connection:
            outside = connection.recv(64).decode()
    except OSError as exc:
        outside = type(exc).__name__
    try:                                   # the cloud's instance metadata: refused by a route
        socket.create_connection(("169.254.169.254", 80), timeout=3).close()
        metadata = "connected"
    except OSError as exc:
        metadata = type(exc).__name__
print("NET " + json.dumps({"rank": hvd.rank(), "sum": total, "reached": reached, "outside": outside,
                           "metadata": metadata if hvd.rank() == 0 else None}), flush=True)
"""


@pytest.fixture(scope="module")
def internet():
    """A TCP server behind a veth pair in a network namespace of its own (tests.netns): (its
    address, its port). It answers every connection with "hello from outside"."""
    serve = ("import socket\ns = socket.create_server(('0.0.0.0', 8080))\nprint('up', flush=True)\n"
             "while True:\n    c, _ = s.accept()\n    c.sendall(b'hello from outside')\n    c.close()\n")
    with outside_server(serve) as address:
        yield address, 8080


@pytest.fixture(scope="module")
def portal_services():
    """(address, port) of every service of this machine a job must not reach, wherever this
    machine reaches it: PostgreSQL, Redis, RabbitMQ where it runs, and a web port opened here on
    every address, each on loopback and on every address of the machine."""
    web = socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    stop = threading.Event()

    def accept():
        web.settimeout(0.2)
        while not stop.is_set():
            try:
                web.accept()[0].close()
            except OSError:
                pass
    threading.Thread(target=accept, daemon=True).start()
    listening = {connection.laddr.port for connection in psutil.net_connections("tcp")
                 if connection.status == psutil.CONN_LISTEN}
    ports = [port for port in (5432, 6379, 5672) if port in listening] + [web.getsockname()[1]]
    addresses = ["127.0.0.1", "::1"] + [
        address.address for addresses in psutil.net_if_addrs().values() for address in addresses
        if address.family in (socket.AF_INET, socket.AF_INET6) and "%" not in address.address
        and address.address not in ("127.0.0.1", "::1")]
    yield [[address, port] for address in addresses for port in ports if reachable((address, port))]
    stop.set()
    web.close()


def reachable(target):
    try:
        socket.create_connection(target, timeout=3).close()
        return True
    except OSError:
        return False


def run_probe(tmp_path, network, targets, outside):
    sandbox = find("bwrap", (str(tmp_path / "data"),), str(Path.home()), network)
    spec = JobSpec(job_id=4300, gpus=2, python=sys.executable, script_name="probe.py", script_content=PROBE,
                   script_path=None, args=(json.dumps(targets), json.dumps(outside)))
    runner = LocalRunner(tmp_path / "jobs", sandbox=sandbox)
    lines, exited = run_to_end(runner, spec)
    assert exited.code == 0, [line.text for line in lines][-20:]
    # Nothing of the job outlives it: pasta (which carries the job's marker) ended with it.
    marker = str(runner.job_dir(spec).resolve())
    wait_for(lambda: not processes_marked(marker, JOB_DIR_VAR), timeout=10, message="the job's processes to end")
    return {seen["rank"]: seen for seen in (json.loads(line.text[4:]) for line in lines if line.text.startswith("NET "))}


@pytest.mark.parametrize("network, reaches_outside", [("none", False), ("outbound", True)])
def test_a_job_all_reduces_reaches_no_service_of_the_machine_and_the_outside_only_if_allowed(
        tmp_path, internet, portal_services, network, reaches_outside):
    # The services are there (the web port on every address), and the outside is reached from
    # this machine.
    assert {port for _, port in portal_services} >= {5432, 6379}
    assert len(portal_services) >= len(psutil.net_if_addrs()) + 3
    with socket.create_connection(internet, timeout=3) as connection:
        assert connection.recv(64) == b"hello from outside"

    seen = run_probe(tmp_path, network, portal_services, internet)

    assert sorted(seen) == [0, 1] and {ranks["sum"] for ranks in seen.values()} == {3.0}
    assert seen[0]["reached"] == []
    assert (seen[0]["outside"] == "hello from outside") is reaches_outside, seen[0]["outside"]
    # Not the metadata address either: no route with none, a prohibiting one with outbound.
    assert seen[0]["metadata"] == ("PermissionError" if reaches_outside else "OSError"), seen[0]["metadata"]


@pytest.mark.parametrize("network, says", [
    ("host", "(ringmaster.W001) RINGMASTER_JOB_NETWORK=host: jobs on this machine share its network"),
    ("internet", "(ringmaster.E002) RINGMASTER_JOB_NETWORK is 'internet': it must be one of none, outbound, host."),
])
def test_manage_py_check_warns_of_the_host_network_and_refuses_an_unknown_one(tmp_path, network, says):
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "REDIS_URL")}
    env.update(RINGMASTER_JOB_NETWORK=network, RINGMASTER_DATA_DIR=str(tmp_path))
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=Path(__file__).resolve().parents[2],
                            env=env, capture_output=True, text=True, timeout=120)
    assert says in result.stderr, result.stderr


@pytest.mark.django_db
def test_every_admin_page_warns_while_jobs_share_the_machines_network(client, django_user_model, settings):
    admin = django_user_model.objects.create_superuser("root", password="pw")
    client.force_login(admin)
    warning = "RINGMASTER_JOB_NETWORK=host: jobs on this machine share its network"
    settings.RINGMASTER_JOB_NETWORK = "outbound"
    assert warning not in client.get("/admin/").content.decode()
    settings.RINGMASTER_JOB_NETWORK = "host"
    for page in ("/admin/", "/admin/instances/instance/"):
        assert warning in client.get(page).content.decode()
