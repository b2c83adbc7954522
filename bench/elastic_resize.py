"""Elastic resizes through the whole portal (issue #15): how long from GPUs freed to an elastic
job training at its new size, and from a queued job's arrival to the shrink that admits it.

This machine offers 4 slots. An elastic job of 1..4 trains (real horovodrun in elastic mode,
Gloo, a Linear model, a commit every step; rank 0 prints `STEP n size=k`). Each round:

1. a fixed 3-slot job arrives (POST /api/jobs/): the scheduler shrinks the elastic job to 1 and
   admits it. Measured: its arrival -> the shrink event (the decision), and -> the first step
   the elastic job trains on 1 rank (the decision applied by Horovod);
2. the fixed job ends: the scheduler grows the elastic job to 4. Measured: the end of the
   fixed job (its GPUs freed) -> the grow event, and -> the first step on 4 ranks.

Step times are the times the follower stored the lines. Growing includes starting three Python
ranks (importing torch and Horovod), which is most of it; see BENCHMARKS.md.

    .venv/bin/python bench/elastic_resize.py [--rounds 20]
"""
import argparse
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402

SETTLE = 15
ELASTIC = b"""
import os, time
import horovod.torch as hvd
import torch

hvd.init()
model = torch.nn.Linear(4, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())


@hvd.elastic.run
def train(state):
    while True:
        stop = hvd.allreduce(torch.tensor([1.0 if os.path.exists("stop") else 0.0]), name="stop").item()
        if stop > 0:
            return
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        state.step += 1
        if hvd.rank() == 0:
            print(f"STEP {state.step} size={hvd.size()}", flush=True)
        state.commit()
        time.sleep(0.05)


state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)
train(state)
"""
# The fixed job: its ranks wait for a file in the job folder, without importing anything heavy.
FIXED = b"""
import os, time
while not os.path.exists("go"):
    time.sleep(0.05)
"""
STEP = re.compile(r"STEP (\d+) size=(\d+)")


def first_step_at(job_id, size, after):
    """The time the first line of a step on `size` ranks was stored after `after`, or None."""
    from jobs.models import LogLine

    for ts, text in (LogLine.objects.filter(job_id=job_id, ts__gt=after, text__startswith="STEP")
                     .order_by("seq").values_list("ts", "text")):
        match = STEP.search(text)
        if match and int(match[2]) == size:
            return ts
    return None


def event_at(job_id, gpus, after):
    from jobs.models import JobEvent

    return (JobEvent.objects.filter(job_id=job_id, gpus=gpus, ts__gt=after).order_by("ts")
            .values_list("ts", flat=True).first())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    common.header("elastic resizes: GPUs freed -> grown, queued job -> shrunk")
    common.setup()
    from django.conf import settings

    from jobs.models import Job, State

    settings.RINGMASTER_ELASTIC_SETTLE_SECONDS = SETTLE
    env = {"RINGMASTER_LOCAL_GPUS": "4", "RINGMASTER_ELASTIC_SETTLE_SECONDS": str(SETTLE)}
    user, token = common.bench_user()
    common.bench_image()
    with common.Services() as services:
        url = services.web(env)
        services.worker(concurrency=8, extra_env=env)
        http = common.api_session(url, token)

        def upload(content, name):
            response = http.post(f"{url}/api/scripts/", files={"file": (name, content)})
            response.raise_for_status()
            return response.json()["id"]

        def submit(**fields):
            response = http.post(f"{url}/api/jobs/", json={"image": "horovod-cpu", **fields})
            assert response.status_code == 201, response.text
            return response.json()["id"]

        def wait(condition, message, timeout=120):
            return common.wait_for(condition, timeout=timeout, interval=0.05, message=message)

        elastic_script, fixed_script = upload(ELASTIC, "elastic.py"), upload(FIXED, "fixed.py")
        elastic = submit(script=elastic_script, gpus=1, max_gpus=4, name="elastic")
        start = time.time()
        wait(lambda: first_step_at(elastic, 4, Job.objects.get(pk=elastic).created_at), "the job to grow to 4")
        print(f"elastic job {elastic} trains on 4 ranks, {time.time() - start:.1f} s after submit")
        shrink_decided, shrink_applied, grow_decided, grow_applied = [], [], [], []
        for round_ in range(args.rounds):
            fixed = submit(script=fixed_script, gpus=3, name=f"fixed-{round_}")
            arrived = Job.objects.get(pk=fixed).created_at
            decided = wait(lambda: event_at(elastic, 1, arrived), "the shrink")
            applied = wait(lambda: first_step_at(elastic, 1, decided), "a step on 1 rank")
            shrink_decided.append((decided - arrived).total_seconds())
            shrink_applied.append((applied - arrived).total_seconds())
            wait(lambda: Job.objects.get(pk=fixed).state == State.RUNNING, "the fixed job to run")
            go_file(fixed).touch()
            freed = wait(lambda: Job.objects.get(pk=fixed).finished_at, "the fixed job to end")
            decided = wait(lambda: event_at(elastic, 4, freed), "the growth")
            applied = wait(lambda: first_step_at(elastic, 4, decided), "a step on 4 ranks")
            grow_decided.append((decided - freed).total_seconds())
            grow_applied.append((applied - freed).total_seconds())
            print(f"round {round_ + 1}: shrink decided {shrink_decided[-1] * 1000:.0f} ms, applied "
                  f"{shrink_applied[-1]:.2f} s; grow decided {grow_decided[-1] * 1000:.0f} ms, applied "
                  f"{grow_applied[-1]:.2f} s", flush=True)
        go_file(elastic, "stop").touch()
        wait(lambda: Job.objects.get(pk=elastic).state in (State.SUCCEEDED, State.FAILED), "the elastic job to end")
        final = Job.objects.get(pk=elastic)
        print(f"elastic job ended {final.state} after {2 * args.rounds + 1} resizes")
    print()
    for label, values, unit in (("queued job arrives -> shrink decided (it is admitted)", shrink_decided, 1000),
                                ("queued job arrives -> elastic job training on 1 rank", shrink_applied, 1),
                                ("GPUs freed -> growth decided", grow_decided, 1000),
                                ("GPUs freed -> elastic job training on 4 ranks", grow_applied, 1)):
        suffix = "ms" if unit == 1000 else "s"
        print(f"{label}: median {common.median(values) * unit:,.{0 if unit == 1000 else 2}f} {suffix}, "
              f"p95 {common.percentile(values, 95) * unit:,.{0 if unit == 1000 else 2}f} {suffix} "
              f"over {len(values)}")
    print(f"machine after: {common.machine()}")


def go_file(job_id, name="go"):
    from jobs.backends import job_spec
    from jobs.models import Job

    spec_name = job_spec(Job.objects.select_related("image", "script").get(pk=job_id)).name
    return Path(os.environ["RINGMASTER_JOBS_DIR"]) / spec_name / name


if __name__ == "__main__":
    main()
