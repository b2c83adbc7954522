"""Training throughput of an elastic job at its full size against a fixed job of that size
(issue #15's goal: >= 0.95), alternated pair by pair in one run through the whole portal.

Both jobs run the same training step (a 512x512 Linear layer, batch 64, one thread per rank,
Horovod's allreduce over Gloo) on this machine's 4 slots:
- fixed: 4 ranks from the start (`gpus: 4`);
- elastic: `gpus: 2, max_gpus: 4`: it finds 4 slots free, so it is launched at 4 (horovodrun in
  elastic mode, hosts from the discovery script); the loop runs under `@hvd.elastic.run` and
  commits every 10 steps (the cost a user pays for being elastic).

Rank 0 times STEPS steps at 4 ranks, after WARMUP steps at 4 ranks, and prints `RATE <steps/s>`.

Each round runs the fixed job, then the elastic job once for each commit interval of
--commit-every (default: 10 and 100 steps, and 100000: no commit while timed, which is Horovod's
elastic mode alone). A commit is `state.save()` and a sync of host updates across the ranks
(a broadcast), so it costs about what a step's allreduce costs; the interval is the user's
trade between that cost and the steps redone after a resize.

    .venv/bin/python bench/elastic_throughput.py [--pairs 3] [--commit-every 10 100 100000]
"""
import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402

SETTLE, WARMUP, STEPS = 15, 20, 300
TRAIN = b"""
import sys, time
import horovod.torch as hvd
import torch

ELASTIC = "--elastic" in sys.argv
COMMIT_EVERY = int(sys.argv[sys.argv.index("--commit-every") + 1]) if "--commit-every" in sys.argv else 10
WARMUP, STEPS = %d, %d
torch.set_num_threads(1)
hvd.init()
model = torch.nn.Linear(512, 512)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.001),
                                     named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
timing = {}


def step():
    loss = model(torch.randn(64, 512)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def train(state):
    while True:
        step()
        state.step += 1
        if hvd.size() == 4:
            state.at_four += 1
            if state.at_four == WARMUP:
                timing["start"] = time.perf_counter()
            if state.at_four == WARMUP + STEPS:
                if hvd.rank() == 0:
                    print(f"RATE {STEPS / (time.perf_counter() - timing['start']):.3f}", flush=True)
                return
        if ELASTIC and state.step %% COMMIT_EVERY == 0:
            state.commit()


if ELASTIC:
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0, at_four=0)
    state.register_reset_callbacks([lambda: timing.clear()])
    hvd.elastic.run(train)(state)
else:
    class Plain:
        step = at_four = 0
    train(Plain())
""" % (WARMUP, STEPS)
RATE = re.compile(r"RATE ([0-9.]+)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--commit-every", type=int, nargs="+", default=[10, 100, 100000],
                        help="steps between the elastic job's commits (one elastic run per value each round)")
    args = parser.parse_args()
    common.header("elastic job at 4 ranks vs a fixed 4-rank job")
    common.setup()
    from jobs.models import Job, LogLine, State

    env = {"RINGMASTER_LOCAL_GPUS": "4", "RINGMASTER_ELASTIC_SETTLE_SECONDS": str(SETTLE)}
    _, token = common.bench_user()
    common.bench_image()
    with common.Services() as services:
        url = services.web(env)
        services.worker(concurrency=4, extra_env=env)
        http = common.api_session(url, token)
        response = http.post(f"{url}/api/scripts/", files={"file": ("throughput.py", TRAIN)})
        response.raise_for_status()
        script = response.json()["id"]

        def run(**fields):
            response = http.post(f"{url}/api/jobs/", json={"image": "horovod-cpu", "script": script, **fields})
            assert response.status_code == 201, response.text
            job_id = response.json()["id"]
            job = common.wait_for(lambda: (j := Job.objects.get(pk=job_id)).finished_at and j, timeout=600,
                                  interval=0.2, message=f"job {job_id} to end")
            assert job.state == State.SUCCEEDED, job.reason
            text = LogLine.objects.filter(job_id=job_id, text__startswith="RATE").values_list("text", flat=True)
            return float(RATE.search(text[0])[1])

        ratios = {every: [] for every in args.commit_every}
        for pair in range(args.pairs):
            fixed = run(gpus=4, name=f"fixed-{pair}")
            line = [f"round {pair + 1}: fixed {fixed:.1f} steps/s"]
            for every in args.commit_every:
                elastic = run(gpus=2, max_gpus=4, args=["--elastic", "--commit-every", str(every)],
                              name=f"elastic-{pair}-{every}")
                ratios[every].append(elastic / fixed)
                line.append(f"elastic, commit every {every}: {elastic:.1f} ({ratios[every][-1]:.3f})")
            print("; ".join(line) + f" | {common.machine()}", flush=True)
    for every, values in ratios.items():
        print(f"elastic (commit every {every} steps) / fixed: median {common.median(values):.3f} over "
              f"{len(values)} rounds (min {min(values):.3f}, max {max(values):.3f})")
    print(f"machine after: {common.machine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
