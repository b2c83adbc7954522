"""Many jobs followed by one worker: N running MPIJobs, each printing a line a second.

The real path: N jobs submitted over the REST API to a real uvicorn, admitted and launched by
one real Celery worker against the protocol-level fake API server of the tests (tests/fakekube,
in this process), whose launcher pods each print one line a second carrying the time it was
written. The worker follows every job (its watch, its pod polls, its launcher's log stream) and
stores every line. Once all N print, the benchmark watches for --window seconds:

- lag: a line written at the fake -> the line stored (the jobs' stored line counts are read
  every 0.1 s, so a lag is at most 0.1 s too high);
- the worker's CPU (share of one core), resident memory, threads and database connections.

The fake's operator, kubelet and API server run on the same cores: at large N their cost is part
of what the figures show. By default they run in this process; `--fake-process` runs them in a
process of their own (so that the fake's threads do not share this process's interpreter lock
with the benchmark's reads).

    .venv/bin/python bench/followers.py [--jobs 100] [--window 60] [--poll-seconds 2] [--fake-process] [--fakes 4]
"""
import argparse
import contextlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402

NS = "bench"
STAMP = re.compile(r"t=(\d+\.\d+)")
SLICE_SECONDS = 10


class Ticks:
    """A launcher's output: one line a second (the fake's step), stamped when it is written."""

    def __init__(self, count):
        self.count = count

    def __iter__(self):
        for i in range(self.count):
            yield f"[1,0]<stdout>:tick {i} t={time.time():.6f}\n".encode()


def scenario(lines):
    from tests.fakekube import Scenario

    return Scenario(attempts=[(Ticks(lines), 0)], step_seconds=1.0, pull_seconds=0.1, react_seconds=0.5)


def serve_fake(lines):
    """--serve-fake: the fake API server alone, until stdin closes; prints its kubeconfig (JSON)."""
    from tests.fakekube import FakeKube

    with FakeKube() as fake:
        fake.scenario = scenario(lines)
        print(json.dumps({"kubeconfig": fake.kubeconfig_text(namespace=NS)}), flush=True)
        sys.stdin.read()


@contextlib.contextmanager
def fake_kubeconfig(lines, own_process):
    """The kubeconfig of a fake API server playing `lines` ticks a job, here or in its own process."""
    if not own_process:
        from tests.fakekube import FakeKube

        with FakeKube() as fake:
            fake.scenario = scenario(lines)
            yield fake.kubeconfig_text(namespace=NS)
        return
    process = subprocess.Popen([sys.executable, __file__, "--serve-fake", str(lines)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        yield json.loads(process.stdout.readline())["kubeconfig"]
    finally:
        process.stdin.close()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def worker_figures(worker):
    import psutil

    from tests.integration.test_followers import database_connections

    process = psutil.Process(worker.process.pid)
    return {"rss_mib": process.memory_info().rss / 2**20, "threads": process.num_threads(),
            "db_connections": database_connections(worker.process.pid)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--window", type=float, default=60, help="seconds measured once every job prints")
    parser.add_argument("--ramp-timeout", type=float, default=900)
    parser.add_argument("--poll-seconds", type=float, default=None,
                        help="the worker's RINGMASTER_KUBE_POLL_SECONDS (how often each job's pods are looked at; 2)")
    parser.add_argument("--fake-process", action="store_true", help="the fake API server in a process of its own")
    parser.add_argument("--fakes", type=int, default=1,
                        help="fake API servers, each in a process of its own (one Python process cannot play "
                             "1,000 jobs printing a line a second)")
    parser.add_argument("--serve-fake", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fake is not None:
        return serve_fake(args.serve_fake)

    common.setup()
    from django.db.models import Q

    from jobs.backends.kubernetes.models import Cluster
    from jobs.models import Image, Job, LogLine, State

    common.header(f"followers: {args.jobs} MPIJobs printing a line a second, one worker")
    print(f"load before: {common.machine()}")
    user, token = common.bench_user()
    Image.objects.get_or_create(name="horovod-k8s", defaults={"container_image": "registry.example/horovod:0.28.1"})
    lines = int(args.ramp_timeout + args.window + 120)
    own = args.fake_process or args.fakes > 1
    print(f"the fake API server runs {'in a process of its own' if own else 'in this process'}"
          + (f", {args.fakes} of them (a cluster each, the jobs spread over them)" if args.fakes > 1 else ""))
    with contextlib.ExitStack() as stack:
        kubeconfigs = [stack.enter_context(fake_kubeconfig(lines, own)) for _ in range(args.fakes)]
        services = stack.enter_context(common.Services())
        Cluster.objects.all().delete()
        clusters = []
        for n, kubeconfig in enumerate(kubeconfigs):
            cluster = Cluster(name=f"fake-{n}", namespace=NS, gpus_per_node=1)
            cluster.set_kubeconfig(kubeconfig)
            cluster.save()
            clusters.append(cluster.name)
        url = services.web()
        worker = services.worker(concurrency=16, extra_env={} if args.poll_seconds is None else {
            "RINGMASTER_KUBE_POLL_SECONDS": str(args.poll_seconds)})
        session = common.api_session(url, token)
        started = time.monotonic()
        jobs = []
        for n in range(args.jobs):
            response = session.post(f"{session.base}/api/jobs/", json={
                "image": "horovod-k8s", "gpus": 1, "backend": "kubernetes", "script_path": "/examples/train.py",
                "cluster": clusters[n % len(clusters)]},
                timeout=60)
            response.raise_for_status()
            jobs.append(response.json()["id"])
        submitted = time.monotonic() - started
        print(f"submitted {args.jobs} jobs in {submitted:.0f} s")

        def printing():
            return Job.objects.filter(pk__in=jobs, state=State.RUNNING, next_seq__gt=0).count()
        deadline, told = time.monotonic() + args.ramp_timeout, time.monotonic()
        while (count := printing()) < args.jobs:
            if time.monotonic() - told > 30:
                told = time.monotonic()
                print(f"  {count} of {args.jobs} print after {told - started:.0f} s", flush=True)
            if time.monotonic() > deadline:
                ended = Job.objects.filter(pk__in=jobs).exclude(state__in=[State.LAUNCHING, State.RUNNING]).count()
                raise SystemExit(f"only {count} of {args.jobs} jobs print after {args.ramp_timeout:.0f} s "
                                 f"({ended} ended)")
            time.sleep(0.5)
        print(f"all {args.jobs} jobs print, {time.monotonic() - started:.0f} s after the first submit")

        seen = {}                                        # (job, seq) -> when first seen stored
        last = dict(Job.objects.filter(pk__in=jobs).values_list("pk", "next_seq"))
        cpu0, t0 = common.cpu_seconds(worker), time.monotonic()
        wall0 = time.time()
        samples = []
        while time.monotonic() - t0 < args.window:
            now = time.time()
            for pk, next_seq in Job.objects.filter(pk__anyof=jobs).values_list("pk", "next_seq"):
                for seq in range(last.get(pk, 0), next_seq):
                    seen[(pk, seq)] = now
                last[pk] = next_seq
            if len(samples) < (time.monotonic() - t0) / 10:
                samples.append(worker_figures(worker))
            time.sleep(0.1)
        cpu = (common.cpu_seconds(worker) - cpu0) / (time.monotonic() - t0)
        wall1 = time.time()
        samples.append(worker_figures(worker))
        failed = Job.objects.filter(pk__in=jobs).exclude(state=State.RUNNING).count()

    lags, late, by_slice = [], 0, {}
    for pk, seq, text in LogLine.objects.filter(Q(job_id__in=jobs)).values_list("job_id", "seq", "text").iterator():
        match = STAMP.search(text)
        if not match:
            continue
        written = float(match.group(1))
        if not wall0 + 5 <= written <= wall1 - 5:      # lines written well inside the window
            continue
        if (pk, seq) in seen:
            lags.append(seen[(pk, seq)] - written)
            by_slice.setdefault(int((written - wall0) // SLICE_SECONDS), []).append(lags[-1])
        else:
            late += 1                                    # stored after the window (or never)
    lag = common.summary(lags)
    print(f"lines written in the window: {len(lags) + late} ({(len(lags) + late) / max(1, wall1 - wall0 - 10):.0f}/s);"
          f" stored within it: {len(lags)}, later or never: {late}")
    if lags:
        print(f"lag written -> stored: p50 {lag['p50'] * 1000:.0f} ms, p99 {lag['p99'] * 1000:.0f} ms, "
              f"max {lag['max'] * 1000:.0f} ms")
        # Whether the lag settles (a backlog of the ramp drained) or grows (the worker falls behind).
        print("  by when written: " + "; ".join(
            f"{n * SLICE_SECONDS:.0f}-{(n + 1) * SLICE_SECONDS:.0f} s p50 {common.summary(v)['p50'] * 1000:.0f} / "
            f"p99 {common.summary(v)['p99'] * 1000:.0f} ms" for n, v in sorted(by_slice.items())))
    print(f"worker: {cpu * 100:.0f}% of one core; resident memory {max(s['rss_mib'] for s in samples):.0f} MiB "
          f"({max(s['rss_mib'] for s in samples) / args.jobs * 1024:.0f} KiB a job); threads "
          f"{max(s['threads'] for s in samples)}; database connections {max(s['db_connections'] for s in samples)}")
    print(f"jobs that stopped running during the window: {failed}")
    print(f"load after: {common.machine()}")


if __name__ == "__main__":
    main()
