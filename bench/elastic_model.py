"""A model of bench/elastic_trace.py's two arms, to say what one trace can show before an hour
of real runs does: the scheduler's elastic rules as jobs.domain.elastic states them, in
simulated time, with the costs the real runs show as parameters. It is a model of the rules,
not the portal (the portal is what elastic_trace.py measures).

- Admission in arrival order; the first job that does not fit holds everything behind it (no
  backfill). A job that does not fit first shrinks running elastic jobs that have settled
  (the newest first, never below their minimum).
- After the pass, running elastic jobs grow into what is free (the oldest first), also while a
  job waits for more than is free: the GPUs are lent, and the waiting job takes them back by
  the first rule (`--no-lend`: they stay idle, a scheduler that does not lend); a job admitted in
  that pass starts at the size it grows to.
- A job's start costs START seconds of no progress (horovodrun, the ranks' imports), a growth
  GROW (a reset, a new rank's start), a shrink SHRINK; a job can be resized once it has run
  SETTLE seconds since its start and since its last resize. Work is done at one GPU-second
  per slot-second (linear scaling, as the trace's sleep-based steps do).

    .venv/bin/python bench/elastic_model.py [--scale 3] [--seeds 1-20] [--start 12 --grow 8] [--no-lend]
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.elastic_trace import SETTLE, SLOTS, trace  # noqa: E402

DT = 0.1


def simulate(jobs, elastic, start=12.0, grow=8.0, shrink=3.0, settle=SETTLE, lend=True):
    """Each job's completion time (arrival -> end), in seconds of simulated time."""
    n = len(jobs)
    low = [gpus for _, gpus, _, _ in jobs]
    high = [min(SLOTS, 4 * gpus) if elastic and may_grow else gpus for _, gpus, _, may_grow in jobs]
    size, left = [0] * n, [work for _, _, work, _ in jobs]
    began, ended, paused, resizable = [None] * n, [None] * n, [0.0] * n, [0.0] * n
    now = 0.0
    while None in ended:
        waiting = [i for i in range(n) if began[i] is None and jobs[i][0] <= now]
        blocked, fresh = False, set()
        for i in waiting:
            missing = low[i] - (SLOTS - sum(size))
            if missing > 0:
                donors = sorted((j for j in range(n) if began[j] is not None and ended[j] is None
                                 and size[j] > low[j] and now >= resizable[j]), key=lambda j: -began[j])
                if sum(size[j] - low[j] for j in donors) < missing:
                    blocked = True
                    break
                for j in donors:
                    give = min(size[j] - low[j], max(missing, 0))
                    if give:
                        size[j] -= give
                        missing -= give
                        paused[j], resizable[j] = max(paused[j], shrink), now + settle
            size[i], began[i], paused[i], resizable[i] = low[i], now, start, now + settle
            fresh.add(i)
        if lend or not blocked:
            free = SLOTS - sum(size)
            for j in sorted((j for j in range(n) if began[j] is not None and ended[j] is None
                             and size[j] < high[j]), key=lambda j: began[j]):
                if free <= 0:
                    break
                if j not in fresh and now < resizable[j]:
                    continue
                more = min(free, high[j] - size[j])
                size[j] += more
                free -= more
                if j not in fresh:
                    paused[j], resizable[j] = max(paused[j], grow), now + settle
        for j in range(n):
            if began[j] is None or ended[j] is not None:
                continue
            if paused[j] > 0:
                paused[j] -= DT
                continue
            left[j] -= size[j] * DT
            if left[j] <= 0:
                ended[j], size[j] = now, 0
        now += DT
    return [ended[i] - jobs[i][0] for i in range(n)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--gap", type=float, default=14.0)
    parser.add_argument("--scale", type=int, default=3)
    parser.add_argument("--seeds", default="1-20", help="a range, first-last")
    parser.add_argument("--start", type=float, default=12.0, help="seconds a job's start costs")
    parser.add_argument("--grow", type=float, default=8.0, help="seconds a growth costs the job")
    parser.add_argument("--shrink", type=float, default=3.0, help="seconds a shrink costs the job")
    parser.add_argument("--no-lend", action="store_true", help="GPUs a waiting job reserved stay idle")
    args = parser.parse_args()
    first, _, last = args.seeds.partition("-")
    lowers = []
    print("seed  fixed mean s  elastic mean s  lower  worst job elastic/fixed")
    for seed in range(int(first), int(last or first) + 1):
        jobs = trace(args.jobs, args.gap, seed, args.scale)
        fixed = simulate(jobs, False, args.start, args.grow, args.shrink)
        elastic = simulate(jobs, True, args.start, args.grow, args.shrink, lend=not args.no_lend)
        lower = 1 - statistics.mean(elastic) / statistics.mean(fixed)
        worst = max(e / f for e, f in zip(elastic, fixed))
        lowers.append(lower)
        print(f"{seed:4d}  {statistics.mean(fixed):12.1f}  {statistics.mean(elastic):14.1f}  {lower:5.0%}  {worst:.2f}")
    print(f"lower by: median {statistics.median(lowers):.0%}, range {min(lowers):.0%} to {max(lowers):.0%} "
          f"over {len(lowers)} seeds (scale {args.scale}, start {args.start} s, growth {args.grow} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
