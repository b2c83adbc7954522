"""Training overhead: Horovod synthetic-benchmark throughput (img/s) of a 2-rank job run through
the portal, against the same command run directly with its launcher (horovodrun, or torchrun
with --launcher torchrun: the same benchmark with DistributedDataParallel), in the same invocation.

Portal: jobs/examples/synthetic_benchmark.py is uploaded and submitted over the REST API to a
real uvicorn, admitted and run by a real Celery worker (--pool threads) with the local runner,
which follows and stores its output; the figure is the metric point `total_img_per_sec` that
runners.output extracted from the job's "Total img/sec on 2 CPU(s): ..." line. Direct: the very
argv and environment the local runner builds (LocalRunner.command / .environment), run with
subprocess in a scratch folder and a session of its own, its output parsed by the same runners.output functions. Runs
alternate portal/direct in ABBA order; the ratio of the medians is reported (goal >= 0.98).
On this machine the ranks run on CPUs (no GPU is lent): each "GPU" is one CPU process, and
(unless --no-pin) rank i is pinned to CPU i, so ranks neither migrate nor share a core with
each other: what varies between runs is what else runs beside them. Besides each run's total,
every rank's per-iteration img/s is kept: their medians per run give the ratio a second reading.
What the portal costs is printed beside the ratio: the CPU of the Celery worker, uvicorn, and
PostgreSQL+Redis (every such process of the machine) while the portal's job ran and while the
direct run ran (when the portal only idles), as a share of one core; the difference is what
following the job costs (this benchmark's own wait for the job's end, a query every 2 s, in it).
The same is read over the benchmark's timed windows alone (a prelude prints when they began and
ended; the CPU readings, every 0.5 s, are interpolated there): what the portal takes while the
job trains, the seconds whose img/s is reported, without the launch and the end.

    .venv/bin/python bench/training.py [--pairs 3] [--num-iters 20] [--num-batches-per-iter 10] [--no-pin]
                                       [--embedded] [--launcher horovod|torchrun]
"""
import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402

GOAL = 0.98
SCRIPT = common.ROOT / "jobs" / "examples" / "synthetic_benchmark.py"
METRIC = "total_img_per_sec"
PER_ITER = "img_per_sec"
# Put before the benchmark's own text: each rank on one CPU of its own (its local rank's).
PIN = """import os as _os
_cpus = sorted(_os.sched_getaffinity(0))
_local = _os.environ.get("HOROVOD_LOCAL_RANK", _os.environ.get("LOCAL_RANK", "0"))
_os.sched_setaffinity(0, {_cpus[int(_local) % len(_cpus)]})
"""
# Put before it always: when the benchmark's timed windows began and ended. Every call of
# timeit.timeit but the first (the warmup) is a timed window; at exit the wall-clock times of the
# first one's start and the last one's end are printed as a metric line, so that what the portal's
# processes used is read over the very seconds whose img/s is reported (not the launch, not the end).
WINDOW = """import atexit as _atexit, json as _json, time as _time, timeit as _timeit
_window = {"calls": 0}


def _timed(*args, _timeit_timeit=_timeit.timeit, **kwargs):
    started = _time.time()
    elapsed = _timeit_timeit(*args, **kwargs)
    _window["calls"] += 1
    if _window["calls"] > 1:
        _window.setdefault("timed_from", started)
        _window["timed_to"] = _time.time()
    return elapsed


_timeit.timeit = _timed
_atexit.register(lambda: print("RINGMASTER_METRIC " + _json.dumps(
    {name: _window[name] for name in ("timed_from", "timed_to") if name in _window}), flush=True))
"""
WINDOW_METRICS = ("timed_from", "timed_to")
# How often this benchmark asks whether the portal's job ended: its own queries (and their
# PostgreSQL CPU) run beside the ranks in the portal's runs only, so they are few. The img/s is
# the job's own; when the end is seen only bounds the whole-job figures' span.
END_POLL_SECONDS = 2.0


def api(session, method, path, **kwargs):
    response = session.request(method, f"{session.base}{path}", timeout=30, **kwargs)
    response.raise_for_status()
    return response.json()


def portal_run(session, script_id, args, gpus, launcher):
    from jobs.models import Job, MetricPoint, State

    job_id = api(session, "POST", "/api/jobs/", json={"image": "horovod-cpu", "gpus": gpus, "script": script_id,
                                                      "args": args, "name": "synthetic benchmark",
                                                      "launcher": launcher})["id"]
    job = common.wait_for(lambda: Job.objects.filter(pk=job_id, state__in=[State.SUCCEEDED, State.FAILED,
                                                                             State.CANCELLED]).first(),
                          timeout=900, interval=END_POLL_SECONDS, message="the portal's job to end")
    assert job.state == State.SUCCEEDED, (job.state, job.reason)
    points = list(MetricPoint.objects.filter(job_id=job_id, name=METRIC).values_list("value", flat=True))
    assert len(points) == 1, f"expected one {METRIC} point, got {points}"
    per_iter = list(MetricPoint.objects.filter(job_id=job_id, name=PER_ITER).values_list("value", flat=True))
    window = MetricPoint.objects.filter(job_id=job_id, name__in=WINDOW_METRICS).values_list("name", "value")
    return points[0], common.median(per_iter), (job.finished_at - job.started_at).total_seconds(), timed_window(window)


def direct_run(spec, runner, scratch):
    """The local runner's own argv and environment, run directly; (img/s, per-iteration median,
    seconds, timed window)."""
    from runners.output import OutputSplitter, extract_metrics

    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    (scratch / spec.script_name).write_text(spec.script_content)
    name, content = spec.argv_file()             # what the rank launcher (ringmaster_rank) runs
    (scratch / name).write_bytes(content)
    start = time.time()
    # A session of its own, as in a terminal and as the local runner does: with the kernel's
    # autogroup scheduling, a session is what CPU time is shared between on a busy machine.
    done = subprocess.run(runner.command(spec)[0], cwd=scratch, env=runner.environment(spec), stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900, start_new_session=True)
    elapsed = time.time() - start
    splitter = OutputSplitter()
    lines = splitter.feed(done.stdout) + splitter.finish()
    assert done.returncode == 0, done.stdout.decode(errors="replace")[-2000:]
    values = [m.value for line in lines for m in extract_metrics(line.text) if m.name == METRIC]
    assert len(values) == 1, f"expected one {METRIC} line, got {values}"
    per_iter = [m.value for line in lines for m in extract_metrics(line.text) if m.name == PER_ITER]
    window = [(m.name, m.value) for line in lines for m in extract_metrics(line.text) if m.name in WINDOW_METRICS]
    return values[0], common.median(per_iter), elapsed, timed_window(window)


def timed_window(values):
    """(from, to): the wall-clock span of every rank's timed windows, from WINDOW's (name, value)s."""
    starts = [value for name, value in values if name == "timed_from"]
    ends = [value for name, value in values if name == "timed_to"]
    assert starts and ends, f"no timed window printed: {values}"
    return min(starts), max(ends)


class CpuLog:
    """The CPU seconds used so far by the worker, uvicorn and the databases, read every
    `interval` seconds in a thread of its own, so that their use over any span of a run can be
    read afterwards (interpolated between readings)."""

    def __init__(self, worker, web, interval=0.5):
        import threading

        self.readings, self._stop = [], threading.Event()
        self._read = lambda: (time.time(), cpu_seconds([worker.process.pid]), cpu_seconds([web.process.pid]),
                              database_cpu_seconds())
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)

    def __enter__(self):
        self.readings.append(self._read())
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.readings.append(self._read())

    def _run(self, interval):
        while not self._stop.wait(interval):
            self.readings.append(self._read())

    def shares(self, start, end):
        """(worker, uvicorn, databases): each one's CPU over [start, end] as a share of one core."""
        at_start, at_end = self._at(start), self._at(end)
        return tuple((b - a) / (end - start) for a, b in zip(at_start, at_end))

    def _at(self, moment):
        for before, after in zip(self.readings, self.readings[1:]):
            if before[0] <= moment <= after[0]:
                weight = (moment - before[0]) / (after[0] - before[0]) if after[0] > before[0] else 0.0
                return [b + (a - b) * weight for b, a in zip(before[1:], after[1:])]
        raise ValueError(f"{moment} is outside the readings ({self.readings[0][0]}-{self.readings[-1][0]})")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3, help="portal runs (and as many direct runs)")
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--num-iters", type=int, default=20)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--no-pin", dest="pin", action="store_false", help="let the kernel place the ranks")
    parser.add_argument("--embedded", action="store_true",
                        help="the portal as `make run` with nothing set: SQLite, no Redis")
    parser.add_argument("--launcher", choices=["horovod", "torchrun"], default="horovod")
    args = parser.parse_args()

    common.setup(embedded=args.embedded)
    from runners.base import JobSpec
    from runners.local import LocalRunner

    script_args = ["--num-iters", str(args.num_iters), "--num-batches-per-iter", str(args.num_batches_per_iter)]
    runner = LocalRunner(common.jobs_root() / "direct")   # under the jobs folder: cleaned up at the end
    script = (PIN if args.pin else "") + WINDOW + SCRIPT.read_text()
    spec = JobSpec(job_id=0, gpus=args.gpus, python=common.PYTHON, script_name=SCRIPT.name,
                   script_content=script, script_path=None, args=tuple(script_args), launcher=args.launcher)
    common.header(f"training overhead: {args.gpus}-rank synthetic benchmark through the portal "
                  f"({'embedded: SQLite, no Redis' if args.embedded else 'PostgreSQL and Redis'}) vs {args.launcher}")
    print("direct command: " + " ".join(runner.command(spec)[0]) + ("  (ranks pinned to CPUs)" if args.pin else ""))
    user, token = common.bench_user()
    common.bench_image(launchers="horovod,torchrun")
    order = [("portal", "direct") if k % 2 == 0 else ("direct", "portal") for k in range(args.pairs)]
    results = {"portal": [], "direct": [], "portal_iter": [], "direct_iter": []}
    cpu = {kind: {"worker": [], "web": [], "db": []} for kind in ("portal", "direct")}
    timed_cpu = {kind: {"worker": [], "web": [], "db": []} for kind in ("portal", "direct")}
    with common.Services() as services:
        session = common.api_session(services.web(), token)
        web = services.started[-1]
        worker = services.worker(concurrency=4)
        script_id = api(session, "POST", "/api/scripts/", files={"file": (SCRIPT.name, script.encode())})["id"]
        for pair, kinds in enumerate(order):
            for kind in kinds:
                with CpuLog(worker, web) as cpu_log:
                    if kind == "portal":
                        value, per_iter, seconds, window = portal_run(session, script_id, script_args, args.gpus,
                                                                      args.launcher)
                    else:
                        value, per_iter, seconds, window = direct_run(spec, runner, runner.job_dir(spec))
                (_, *before), (_, *after) = cpu_log.readings[0], cpu_log.readings[-1]
                for name, start, end in zip(("worker", "web", "db"), before, after):
                    cpu[kind][name].append((end - start) / seconds)
                for name, share in zip(("worker", "web", "db"), cpu_log.shares(*window)):
                    timed_cpu[kind][name].append(share)
                results[kind].append(value)
                results[f"{kind}_iter"].append(per_iter)
                print(f"pair {pair + 1}, {kind:>6}: {value:8.1f} img/s total, per rank and iteration median "
                      f"{per_iter:6.1f} ({seconds:.0f} s from start to end) | {common.machine()}")

    portal, direct = common.median(results["portal"]), common.median(results["direct"])
    ratio = portal / direct
    pair_ratios = [p / d for p, d in zip(results["portal"], results["direct"])]
    print()
    print(f"median through the portal: {portal:8.1f} img/s   (runs: {', '.join(f'{v:.0f}' for v in results['portal'])})")
    print(f"median direct {args.launcher:>10}: {direct:8.1f} img/s   (runs: {', '.join(f'{v:.0f}' for v in results['direct'])})")
    print(f"pair ratios: {', '.join(f'{r:.3f}' for r in pair_ratios)}")
    iter_ratio = common.median(results["portal_iter"]) / common.median(results["direct_iter"])
    print(f"per rank and iteration, ratio of the medians of the runs' medians: {iter_ratio:.3f} (pairs: "
          f"{', '.join(f'{p / d:.3f}' for p, d in zip(results['portal_iter'], results['direct_iter']))})")
    share = {kind: {name: common.median(values) * 100 for name, values in shares.items()} for kind, shares in cpu.items()}
    for kind, label in (("portal", "while the portal's job ran"), ("direct", f"while {args.launcher} ran directly")):
        print(f"portal's own CPU {label}: Celery worker {share[kind]['worker']:.2f}%, uvicorn {share[kind]['web']:.2f}%, "
              f"PostgreSQL+Redis {share[kind]['db']:.2f}% of a core (medians over runs)")
    cost = sum(share["portal"].values()) - sum(share["direct"].values())
    print(f"what following the job costs (portal runs less direct runs, all three): {cost:.2f}% of a core")
    timed = {kind: {name: common.median(values) * 100 for name, values in shares.items()}
             for kind, shares in timed_cpu.items()}
    for kind, label in (("portal", "through the portal"), ("direct", "directly")):
        print(f"the same over the timed windows only (the seconds the img/s is of), {label}: Celery worker "
              f"{timed[kind]['worker']:.2f}%, uvicorn {timed[kind]['web']:.2f}%, PostgreSQL+Redis {timed[kind]['db']:.2f}%")
    timed_cost = sum(timed["portal"].values()) - sum(timed["direct"].values())
    bound = (f" (every core a rank's: the ratio it allows is about {1 - timed_cost / 100:.3f})"
             if args.pin and args.gpus >= os.cpu_count() else "")
    print(f"RESULT what following the job costs while it trains = {timed_cost:.2f}% of a core{bound}")
    low, high = ratio_interval(results["portal"], results["direct"])
    print(f"95% bootstrap interval of the ratio of the medians (pairs resampled): {low:.3f}-{high:.3f}: "
          + ("resolves the goal" if low >= GOAL or high < GOAL else f"too wide to tell {GOAL} from the ratio"))
    paired = common.median(pair_ratios)
    low, high = median_interval(pair_ratios)
    print(f"median of the pair ratios: {paired:.3f}, 95% bootstrap interval {low:.3f}-{high:.3f} (each portal run "
          "against the direct run beside it, so a drift of the machine's speed over the session cancels)")
    print(f"RESULT training ratio (portal / direct) = {ratio:.3f} (goal >= {GOAL}: {'met' if ratio >= GOAL else 'NOT met'})")
    print(f"machine at the end: {common.machine()}")


_threads_seen = {}              # (pid, tid) -> its CPU seconds when last seen


def cpu_seconds(pids):
    """CPU time used so far by the processes `pids`, every thread of theirs, from the scheduler's
    own count in nanoseconds (/proc/<pid>/task/<tid>/schedstat): the user and system times of
    /proc/<pid>/stat count 10 ms ticks, an eighth of a percent of one core over a timed window of
    8 s, as coarse as the differences read here. A thread that has ended counts with what it had
    used when last read."""
    for pid in pids:
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    with open(f"/proc/{pid}/task/{tid}/schedstat") as stat:
                        _threads_seen[pid, tid] = int(stat.read().split()[0]) / 1e9
    wanted = set(pids)
    return sum(seconds for (pid, _), seconds in _threads_seen.items() if pid in wanted)


_databases = {}                 # pid -> whether it is PostgreSQL's or Redis's
_ended_databases = [0.0]        # CPU seconds of their processes that have ended, when last read


def database_cpu_seconds():
    """cpu_seconds of every PostgreSQL and Redis process of this machine (the portal's statements
    and publishes run there; between runs only their own housekeeping), and of those that have
    ended since the first reading: a connection's backend ends when CONN_MAX_AGE has passed, and
    its minutes of CPU must not leave the sum. Each process is named once (psutil.process_iter
    over the machine's processes costs 2.4 ms a reading, beside the ranks)."""
    import psutil

    pids = psutil.pids()
    for pid in set(_databases) - set(pids):
        if _databases.pop(pid):
            ended = [key for key in _threads_seen if key[0] == pid]
            _ended_databases[0] += sum(_threads_seen.pop(key) for key in ended)
    for pid in pids:
        if pid not in _databases:
            try:
                _databases[pid] = psutil.Process(pid).name().startswith(("postgres", "redis-server"))
            except psutil.Error:
                continue
    return _ended_databases[0] + cpu_seconds([pid for pid, database in _databases.items() if database])


def ratio_interval(portal, direct, resamples=10_000, seed=0):
    """A 95% percentile-bootstrap interval of median(portal) / median(direct), resampling the
    alternated pairs together (what one more invocation of the same runs could give)."""
    import random

    rng = random.Random(seed)
    pairs = list(zip(portal, direct))
    ratios = sorted(
        common.median([p for p, _ in sample]) / common.median([d for _, d in sample])
        for sample in ([rng.choice(pairs) for _ in pairs] for _ in range(resamples)))
    return ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1]


def median_interval(values, resamples=10_000, seed=0):
    """A 95% percentile-bootstrap interval of the median of `values`."""
    import random

    rng = random.Random(seed)
    medians = sorted(common.median([rng.choice(values) for _ in values]) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


if __name__ == "__main__":
    main()
