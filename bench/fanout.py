"""Fan-out: many websocket viewers of one job at a steady 2,000 lines/s, against one viewer.

A helper process plays horovodrun for the local runner (it appends stamped, tagged lines of 8
ranks to the job's output.log at the rate, and is the job's pid until it writes exit_code); the
real follower (jobs.domain.follow.run) stores and announces them; N viewers, connected to a real
uvicorn with the Redis channel layer from seq 0, each check that they got every seq once and
in order, and measure lag = time received - time the line was written. Rounds alternate the
single viewer (baseline) and the N viewers (subject); medians over rounds are reported.

    .venv/bin/python bench/fanout.py [--viewers 200] [--rate 2000] [--seconds 10] [--rounds 2]
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402


def one_round(url, user, token, viewers, rate, seconds, ranks, grace, procs):
    from jobs.models import LogLine

    job = common.running_job(user, gpus=ranks, name=f"fan-out x{viewers}")
    total = int(rate * seconds)
    writer = follower = None
    with common.Viewers(url, job.pk, token, count=viewers, until_seq=total - 1, timeout=seconds + grace,
                        procs=procs) as group:
        try:
            start = time.time()
            writer = common.start_paced_writer(job.pk, rate, seconds, ranks)
            follower = common.follow_in_thread(job.pk)
            results = group.wait()
        finally:
            if writer is not None:
                writer.kill()
                writer.wait()
    if follower is not None:
        follower.join(timeout=60)
    stored = LogLine.objects.filter(job=job).count()
    first = LogLine.objects.filter(job=job, seq=0).values_list("text", flat=True).first()
    start = common.stamp_of(first) if first else start        # when the first line was written
    return start, total, stored, results


def describe(start, total, results):
    """Per-viewer figures: delivered lines/s, lag p50/p99, completeness."""
    rows = []
    for viewer in results:
        window = (viewer["last_recv"] - start) if viewer["last_recv"] else None
        rows.append({
            "complete": viewer["complete"] and viewer["lines"] == total and not viewer["dups"] and not viewer["missing"],
            "lines": viewer["lines"], "dups": viewer["dups"], "missing": viewer["missing"],
            "rate": viewer["lines"] / window if window else 0.0, "frames": viewer["frames"],
            "p50": viewer["lag"]["p50"], "p99": viewer["lag"]["p99"], "max": viewer["lag"]["max"],
            "error": viewer["error"],
        })
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--viewers", type=int, default=200)
    parser.add_argument("--rate", type=float, default=2000)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--grace", type=float, default=60, help="seconds viewers may lag behind the end")
    parser.add_argument("--procs", type=int, default=4,
                        help="helper processes the viewers are spread over (with 100 viewers in one process it fell "
                             "behind now and then: lag p99 up to 0.8 s with 2 processes, 0.1-0.15 s with 4)")
    common.add_web_options(parser)
    args = parser.parse_args()

    common.setup()
    common.header(f"fan-out: {args.viewers} websocket viewers vs 1 at {args.rate:,.0f} lines/s")
    print(f"{args.ranks} ranks, {args.seconds:g} s of output per round ({int(args.rate * args.seconds):,} lines), "
          f"viewers may finish up to {args.grace:g} s after the output ends; {args.rounds} rounds")
    user, token = common.bench_user()
    figures = {1: [], args.viewers: []}
    with common.Services() as services:
        url = common.start_web(services, args)
        one_round(url, user, token, 1, args.rate, 1, args.ranks, 10, 1)          # warm-up
        for round_ in range(args.rounds):
            for count in (1, args.viewers):
                start, total, stored, results = one_round(url, user, token, count, args.rate, args.seconds,
                                                          args.ranks, args.grace, args.procs)
                rows = describe(start, total, results)
                complete = sum(row["complete"] for row in rows)
                rates = [row["rate"] for row in rows]
                p50 = common.median([row["p50"] for row in rows])
                p99s = [row["p99"] for row in rows if row["p99"] is not None]
                failed = [row["error"] for row in rows if row["error"]]
                errors = {f"{len(failed)} viewer(s) dropped: " + e for e in sorted(set(failed))[:1]}
                figure = {"complete": complete, "rate": common.median(rates), "min_rate": min(rates),
                          "total_rate": sum(row["lines"] for row in rows) / max(
                              [(r["last_recv"] or start) - start for r in results] + [1e-9]),
                          "frames": common.median([row["frames"] for row in rows]),
                          "p50": p50, "p99": common.median(p99s), "worst_p99": max(p99s) if p99s else None,
                          "dups": sum(row["dups"] for row in rows), "missing": sum(row["missing"] for row in rows)}
                figures[count].append(figure)
                print(f"round {round_ + 1}, {count:>3} viewer(s): stored {stored:,}/{total:,}; {complete}/{count} "
                      f"got every line; per viewer {figure['rate']:,.0f} lines/s (min {figure['min_rate']:,.0f}), "
                      f"all viewers {figure['total_rate']:,.0f} lines/s in {figure['frames']:,.0f} frames each; "
                      f"lag p50 {common.fmt(p50 and p50 * 1000)} ms, "
                      f"p99 {common.fmt(figure['p99'] and figure['p99'] * 1000)} ms (worst viewer "
                      f"{common.fmt(figure['worst_p99'] and figure['worst_p99'] * 1000)} ms); dups {figure['dups']}, "
                      f"seq gaps {figure['missing']}" + (f"; errors: {sorted(errors)[:3]}" if errors else ""))

    def med(count, key):
        return common.median([f[key] for f in figures[count]])

    many = args.viewers
    print()
    for count in (1, many):
        print(f"median, {count:>3} viewer(s): {med(count, 'rate'):>8,.0f} lines/s per viewer, "
              f"lag p50 {med(count, 'p50') * 1000:,.0f} ms, p99 {med(count, 'p99') * 1000:,.0f} ms, "
              f"every line to {med(count, 'complete'):.0f}/{count} viewers")
    rate_ratio = med(many, "rate") / med(1, "rate")
    lag_ratio = med(many, "p99") / med(1, "p99")
    ok = med(many, "complete") == many and rate_ratio >= 0.95
    print(f"RESULT fan-out: per-viewer delivered rate with {many} viewers / with 1 = {rate_ratio:.2f}; "
          f"p99 lag ratio = {lag_ratio:.1f}x; every viewer got every line: "
          f"{'yes' if med(many, 'complete') == many else 'NO'} (goal: all lines to all viewers at the rate: "
          f"{'met' if ok else 'NOT met'})")
    print(f"machine at the end: {common.machine()}")


if __name__ == "__main__":
    main()
