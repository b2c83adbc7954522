"""SSH follow: a line printed by a rank on an instance -> the follower has it, streamed vs polled.

The real path of the `instances` backend below the database: a real sshd on loopback (127.0.0.8,
generated keys), the SSH runner's launch (horovodrun --gloo, 2 ranks) and follow. Each rank
prints `tick <time.time()>` lines at a steady rate; the follower's Output events are timed as
they come, so lag = time the follower had the line - time printed.

Two hosts, one sshd each, alternated run by run in one invocation:
  streamed  the host's GNU tail: the follower reads output.log through one `tail -f` channel
  polled    a host whose tail has no --pid (a stand-in, as on busybox): the follower polls
            output.log over SFTP every poll interval (0.2 s, the default), as on a host that cannot stream

Also the follower's CPU per 1,000 lines (this process: the runner's threads and paramiko's),
and during a quiet stretch of the job (no output), its CPU per second.

    .venv/bin/python bench/ssh_follow.py [--rate 50] [--seconds 10] [--quiet 10] [--runs 3]
"""
import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402
from tests import sshd  # noqa: E402

TICK = re.compile(rb"tick (\d+\.\d+)$")
JOB = """import sys, time
rate, seconds, quiet = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
start = time.time() + 1
for i in range(int(rate * seconds)):
    pause = start + i / rate - time.time()
    if pause > 0:
        time.sleep(pause)
    print(f"tick {time.time():.6f}", flush=True)
print("quiet", flush=True)
time.sleep(quiet)
"""


def host(server, key, work_dir):
    from runners.ssh import Host

    return Host(name=server.address, address=server.address, port=server.port, user="root",
                private_key=Path(key).read_text(), slots=2, work_dir=str(work_dir), network_interface="lo")


def one_run(runner, job_id, rate, seconds, quiet):
    from runners.base import Exited, JobSpec, Output, waited

    spec = JobSpec(job_id=job_id, gpus=2, python=sys.executable, script_name="ticks.py", script_content=JOB,
                   script_path=None, args=(str(rate), str(seconds), str(quiet)))
    runner.launch(spec)
    lags, pending, quiet_began, quiet_cpu, ended = [], b"", None, None, None
    cpu = time.process_time()
    for event in waited(runner.follow(spec, 0)):   # what the follow hub does for it
        if isinstance(event, Output):
            now = time.time()
            pending += event.data
            *complete, pending = pending.split(b"\n")
            for line in complete:
                found = TICK.search(line)
                if found:
                    lags.append(now - float(found.group(1)))
                elif line.endswith(b"quiet") and quiet_began is None:
                    busy_cpu = time.process_time() - cpu
                    quiet_began = time.monotonic(), time.process_time()
        elif isinstance(event, Exited):
            ended = event
            break
    if quiet_began:
        quiet_cpu = (time.process_time() - quiet_began[1]) / (time.monotonic() - quiet_began[0])
    assert ended is not None and ended.code == 0, ended
    expected = int(rate * seconds) * 2
    assert len(lags) == expected, (len(lags), expected)
    return common.summary(lags), busy_cpu / expected * 1000 * 1000, quiet_cpu      # ms per 1,000 lines, s/s


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=50, help="lines/s of each of the 2 ranks")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--quiet", type=float, default=10, help="seconds the job then prints nothing")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    common.header(f"ssh follow: rank print -> follower, 2 ranks x {args.rate:g} lines/s, streamed vs polled")

    from runners.ssh import SSHRunner

    directory = Path(tempfile.mkdtemp(prefix="ringmaster-bench-ssh-"))
    key = sshd.keygen(directory / "user_key")
    no_pid = directory / "bin"
    no_pid.mkdir()
    (no_pid / "tail").write_text('#!/bin/sh\ncase "$*" in *--pid*) exit 1;; esac\nexec /usr/bin/tail "$@"\n')
    (no_pid / "tail").chmod(0o755)
    port = sshd.free_port_on(["127.0.0.8", "127.0.0.9"])
    servers = {"streamed": sshd.Sshd(directory, "127.0.0.8", port, f"{key}.pub").start(),
               "polled": sshd.Sshd(directory, "127.0.0.9", port, f"{key}.pub", path_first=no_pid).start()}
    results = {mode: [] for mode in servers}
    job_id = 880000
    try:
        for run in range(args.runs):
            for mode, server in servers.items():
                job_id += 1
                runner = SSHRunner([host(server, key, directory / "work")])
                lag, cpu, quiet_cpu = one_run(runner, job_id, args.rate, args.seconds, args.quiet)
                results[mode].append((lag, cpu, quiet_cpu))
                print(f"run {run + 1} {mode:8}: lag p50 {lag['p50'] * 1000:6.1f} ms  p99 {lag['p99'] * 1000:6.1f} ms  "
                      f"max {lag['max'] * 1000:6.1f} ms; follower CPU {cpu:5.0f} ms per 1,000 lines, "
                      f"{quiet_cpu * 1000:5.1f} ms/s while quiet | {common.machine()}")
    finally:
        for server in servers.values():
            server.stop()

    def med(mode, pick):
        return common.median([pick(r) for r in results[mode]])

    print()
    for mode in servers:
        print(f"median {mode:8}: lag p50 {med(mode, lambda r: r[0]['p50']) * 1000:6.1f} ms  "
              f"p99 {med(mode, lambda r: r[0]['p99']) * 1000:6.1f} ms; follower CPU "
              f"{med(mode, lambda r: r[1]):.0f} ms per 1,000 lines, {med(mode, lambda r: r[2]) * 1000:.1f} ms/s quiet")
    ratio = med("streamed", lambda r: r[0]["p99"]) / med("polled", lambda r: r[0]["p99"])
    print(f"RESULT streamed/polled lag p99 = {ratio:.2f}x, p50 = "
          f"{med('streamed', lambda r: r[0]['p50']) / med('polled', lambda r: r[0]['p50']):.2f}x")
    print(f"machine at the end: {common.machine()}")


if __name__ == "__main__":
    main()
