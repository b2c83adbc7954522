"""Job network: the two user-mode network stacks that can give a job's namespace its way out,
pasta (Debian's `passt`, what runners.supervisor uses) and slirp4netns, side by side: how long
each takes to connect a held bubblewrap sandbox, and the TCP throughput of a download through it
from a server that stands in for the internet (a network namespace of its own behind a veth
pair). Arms alternate. Needs root, bubblewrap, pasta and slirp4netns; no database, no services.

    .venv/bin/python bench/job_network.py [--rounds 6] [--megabytes 300]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402
from tests.netns import outside_server  # noqa: E402

SERVE = """
import socket, sys
server = socket.create_server(("0.0.0.0", 9000))
chunk = b"x" * (1 << 20)
print("up", flush=True)
while True:
    connection, _ = server.accept()
    try:
        for _ in range(int(sys.argv[1])):
            connection.sendall(chunk)
    except OSError:
        pass
    connection.close()
"""
FETCH = """
import socket, sys, time
started, received = time.monotonic(), 0
with socket.create_connection((sys.argv[1], 9000)) as connection:
    while True:
        data = connection.recv(1 << 20)
        if not data:
            break
        received += len(data)
print(received / (time.monotonic() - started) / 1e6)
"""


def child_pid(fd):
    data = b""
    while True:
        data += os.read(fd, 4096)
        try:
            return json.loads(data)["child-pid"]
        except ValueError:
            continue


def connect(tool, pid):
    """Start `tool` on the namespace of `pid`; return it once the namespace can reach out."""
    if tool == "slirp4netns":
        ready, told = os.pipe()
        process = subprocess.Popen(["slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback",
                                    "--ready-fd", str(told), str(pid), "tap0"], pass_fds=(told,),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(told)
        if not os.read(ready, 1):
            raise RuntimeError("slirp4netns did not start")
        return process
    namespace = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    process = subprocess.Popen(["pasta", "--foreground", "--quiet", "--config-net", "--runas", "0", "--no-map-gw",
                                "-t", "none", "-u", "none", "-T", "none", "-U", "none",
                                "--netns", f"/proc/self/fd/{namespace}"], pass_fds=(namespace,),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(namespace)
    while "default" not in subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "ip", "route", "show", "default"],
                                          capture_output=True, text=True).stdout:
        time.sleep(0.005)
    return process


def one_run(tool, folder, server):
    info_read, info_write = os.pipe()
    hold_read, hold_write = os.pipe()
    started = time.perf_counter()
    sandbox = subprocess.Popen(
        ["bwrap", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--unshare-net", "--unshare-pid",
         "--cap-drop", "ALL", "--info-fd", str(info_write), "--block-fd", str(hold_read), "--",
         sys.executable, "-I", str(folder / "fetch.py"), server], pass_fds=(info_write, hold_read),
        stdout=subprocess.PIPE, text=True)
    os.close(info_write)
    os.close(hold_read)
    network = connect(tool, child_pid(info_read))
    connected = time.perf_counter() - started
    os.write(hold_write, b"1")
    os.close(hold_write)
    rate = float(sandbox.communicate()[0])
    network.kill()
    network.wait()
    return connected * 1000, rate


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--megabytes", type=int, default=300)
    args = parser.parse_args()
    common.header("job_network: pasta against slirp4netns, set-up and download throughput")
    folder = Path(tempfile.mkdtemp(dir="/var/tmp"))
    (folder / "fetch.py").write_text(FETCH)
    os.chmod(folder, 0o755)
    try:
        with outside_server(SERVE, str(args.megabytes)) as server:
            results = {"pasta": [], "slirp4netns": []}
            for round_ in range(args.rounds):
                for tool in (("pasta", "slirp4netns") if round_ % 2 == 0 else ("slirp4netns", "pasta")):
                    results[tool].append(one_run(tool, folder, server))
                print(f"round {round_ + 1}: " + ", ".join(
                    f"{tool} {runs[-1][0]:.0f} ms, {runs[-1][1]:.0f} MB/s" for tool, runs in results.items()))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for tool, runs in results.items():
        print(f"{tool}: set-up median {statistics.median(r[0] for r in runs):.0f} ms, "
              f"throughput median {statistics.median(r[1] for r in runs):.0f} MB/s")
    ratio = statistics.median(r[1] for r in results["pasta"]) / statistics.median(r[1] for r in results["slirp4netns"])
    print(f"RESULT pasta / slirp4netns throughput = {ratio:.2f}")
    print(f"machine after: {common.machine()}")


if __name__ == "__main__":
    main()
