"""What elasticity buys (issue #15): one trace of jobs arriving over time on 8 slots, run twice
through the whole portal (real scheduler, real Celery worker, real horovodrun), once with every
job at its requested size and once with half of them elastic. Compared: each job's completion
time (submitted -> finished), their mean, and the worst job's ratio elastic / fixed.

The trace (seeded): JOBS jobs, exponential gaps of mean GAP seconds, sizes 1, 2 or 4, each a
fixed amount of work in GPU-seconds (40 to 120, times SCALE) done in STEPS steps; a step sleeps
work / STEPS / size seconds after an allreduce, so a job's time falls with its size as real data-parallel
training does, and two cores can hold eight ranks. In the elastic run every other job may grow
to 4x its size (at most 8): it runs its loop under `@hvd.elastic.run` with a commit each step.
Its minimum is its size. The other jobs, and every job of the fixed run, run the same loop
plainly.

SCALE multiplies every job's work and every gap between arrivals (the offered load stays the
same): at 1 a job's start (horovodrun, every rank importing torch: 8-12 s on two cores) is
a tenth to a half of its run, and a growth's new rank as much again; at 3 (the default) jobs
run 2-6 minutes of one GPU's work and a start is a few percent of it, as it is for real
training.

    .venv/bin/python bench/elastic_trace.py [--jobs 30] [--gap 14] [--scale 3] [--seed 7]
        [--only fixed|elastic] [--results FILE]

--results keeps each arm's completion times in a JSON file (with the trace they ran): with
--only, one arm runs and is compared with the other arm kept there by an earlier run of the same
trace (an arm takes 20 minutes at scale 3).
"""
import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402

SLOTS, SETTLE, STEPS = 8, 10, 40
TRAIN = b"""
import sys, time
import horovod.torch as hvd
import torch

work, steps = float(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(1)
hvd.init()


def train(state):
    while state.step < steps:
        hvd.allreduce(torch.zeros(1), name="sync")
        time.sleep(work / steps / hvd.size())
        state.step += 1
        if "--elastic" in sys.argv:
            state.commit()


if "--elastic" in sys.argv:
    hvd.elastic.run(train)(hvd.elastic.TorchState(step=0))
else:
    class Plain:
        step = 0
    train(Plain())
"""


def trace(count, gap, seed, scale=1):
    """[(arrival offset s, GPUs, work GPU-s, may be elastic)]: the same draws at every `scale`."""
    rng = random.Random(seed)
    at, jobs = 0.0, []
    for index in range(count):
        jobs.append((round(at * scale, 1), rng.choice((1, 2, 2, 4)), scale * rng.choice((40, 60, 80, 120)),
                     index % 2 == 1))
        at += rng.expovariate(1 / gap)
    return jobs


def run_trace(http, url, script, jobs, elastic, label):
    """Submit `jobs` at their offsets; wait for all to end. Returns {index: completion seconds}
    (and prints how long they waited to start)."""
    from jobs.models import Job, State

    started, ids = time.monotonic(), {}
    for index, (offset, gpus, work, may_grow) in enumerate(jobs):
        time.sleep(max(0.0, started + offset - time.monotonic()))
        fields = {"image": "horovod-cpu", "script": script, "gpus": gpus, "name": f"{label}-{index}",
                  "args": [str(work), str(STEPS)], "time_limit_minutes": 60}
        if elastic and may_grow:
            fields.update(max_gpus=min(SLOTS, 4 * gpus), args=[str(work), str(STEPS), "--elastic"])
        response = http.post(f"{url}/api/jobs/", json=fields)
        assert response.status_code == 201, response.text
        ids[index] = response.json()["id"]
    done = common.wait_for(
        lambda: (rows := list(Job.objects.filter(pk__in=ids.values(), finished_at__isnull=False)))
        and len(rows) == len(ids) and rows, timeout=3600, interval=1, message=f"the {label} run's jobs to end")
    by_id = {job.pk: job for job in done}
    failed = [(job.pk, job.reason) for job in done if job.state != State.SUCCEEDED]
    assert not failed, failed
    waited = [(by_id[pk].started_at - by_id[pk].created_at).total_seconds() for pk in ids.values()]
    print(f"{label} run: waited for a start (submitted -> running) mean {sum(waited) / len(waited):.1f} s, "
          f"max {max(waited):.1f} s", flush=True)
    return {index: (by_id[pk].finished_at - by_id[pk].created_at).total_seconds() for index, pk in ids.items()}


def kept_times(path, jobs):
    """{arm: [completion s by job index]} kept in `path` by runs of this very trace."""
    if path is None or not path.exists():
        return {}
    kept = json.loads(path.read_text())
    if [list(job) for job in jobs] != kept.pop("trace"):
        raise SystemExit(f"{path} holds the times of another trace")
    return kept


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--gap", type=float, default=14.0, help="mean seconds between arrivals")
    parser.add_argument("--scale", type=int, default=3, help="multiplies every job's work and every gap")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--elastic-first", action="store_true", help="run the elastic arm before the fixed one")
    parser.add_argument("--only", choices=("fixed", "elastic"), help="run one arm (the other from --results)")
    parser.add_argument("--results", type=Path, help="JSON file of each arm's completion times, kept and read")
    args = parser.parse_args()
    common.header("what elasticity buys: one trace, fixed sizes vs half elastic")
    common.setup()
    from django.conf import settings

    settings.RINGMASTER_ELASTIC_SETTLE_SECONDS = SETTLE
    env = {"RINGMASTER_LOCAL_GPUS": str(SLOTS), "RINGMASTER_ELASTIC_SETTLE_SECONDS": str(SETTLE)}
    jobs = trace(args.jobs, args.gap, args.seed, args.scale)
    offered = sum(work for _, _, work, _ in jobs) / (jobs[-1][0] + args.gap * args.scale) / SLOTS
    print(f"{len(jobs)} jobs over {jobs[-1][0]:.0f} s (scale {args.scale}), sizes {sorted(g for _, g, _, _ in jobs)}, "
          f"offered load {offered:.2f} of {SLOTS} slots", flush=True)
    _, token = common.bench_user()
    common.bench_image()
    with common.Services() as services:
        url = services.web(env)
        services.worker(concurrency=2 * args.jobs, extra_env=env)
        http = common.api_session(url, token)
        response = http.post(f"{url}/api/scripts/", files={"file": ("trace_job.py", TRAIN)})
        response.raise_for_status()
        script = response.json()["id"]
        times = kept_times(args.results, jobs)
        arms = [("fixed", False), ("elastic", True)]
        for label, elastic in (arms[::-1] if args.elastic_first else arms):
            if args.only and label != args.only:
                continue
            # The arm before leaves the load average high with its own ranks: start on a quiet machine.
            common.wait_for(lambda: os.getloadavg()[0] < 1.5, timeout=600, interval=5, message="a load below 1.5")
            print(f"{label} run: load before {common.machine()}", flush=True)
            ran = run_trace(http, url, script, jobs, elastic, label)
            times[label] = [ran[index] for index in range(len(jobs))]
            print(f"{label} run: completion mean {sum(times[label]) / len(jobs):.1f} s, median "
                  f"{common.median(times[label]):.1f} s; load after {common.machine()}", flush=True)
            if args.results:
                args.results.write_text(json.dumps({"trace": jobs, **times}))
    if "fixed" not in times or "elastic" not in times:
        print(f"not compared: no {'fixed' if 'fixed' not in times else 'elastic'} arm in {args.results}")
        return 1
    print()
    print("job  GPUs  work  elastic  fixed s  elastic s  ratio")
    ratios = []
    for index, (offset, gpus, work, may_grow) in enumerate(jobs):
        fixed, elastic = times["fixed"][index], times["elastic"][index]
        ratios.append(elastic / fixed)
        print(f"{index:3d}  {gpus:4d}  {work:4d}  {'yes' if may_grow else 'no':>7}  {fixed:7.1f}  {elastic:9.1f}  "
              f"{ratios[-1]:.2f}")
    mean_fixed = sum(times["fixed"]) / len(jobs)
    mean_elastic = sum(times["elastic"]) / len(jobs)
    print(f"mean completion: fixed {mean_fixed:.1f} s, elastic {mean_elastic:.1f} s: "
          f"{(1 - mean_elastic / mean_fixed) * 100:.0f}% lower (goal >= 30%)")
    print(f"worst job elastic / fixed: {max(ratios):.2f} (goal <= 1.5); "
          f"elastic jobs alone: mean ratio {sum(r for r, j in zip(ratios, jobs) if j[3]) / sum(j[3] for j in jobs):.2f}, "
          f"fixed-size jobs alone: {sum(r for r, j in zip(ratios, jobs) if not j[3]) / sum(not j[3] for j in jobs):.2f}")
    print(f"machine after: {common.machine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
