"""Latency: a line printed by a rank -> received by a websocket client, at 8 ranks x 500 lines/s.

The real path: the job (bench/rank_printer.py, 8 ranks) is submitted over the REST API to a
real uvicorn, admitted and run by a real Celery worker (--pool threads) with the local runner
(horovodrun --gloo); the worker's follower stores and announces the lines; a websocket viewer
(a helper process, connected before the first print) records when each line arrives. Every
line carries the time.time() of its print, so latency = time received - time printed.

Baseline (the floor), in the same run and on the same lines: a tail loop in this process reads
the job's output.log (what horovodrun wrote) every 1 ms. The portal's own share is the
difference, line by line. Several runs; medians of their percentiles are reported.

    .venv/bin/python bench/latency.py [--ranks 8] [--rate 500] [--seconds 10] [--runs 3]
"""
import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402

GOAL_P99_MS = 100
SCRIPT = Path(__file__).resolve().parent / "rank_printer.py"


class Tail(threading.Thread):
    """Read a file as it grows (1 ms polls); key of each stamped line -> (printed, read) time."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path, self.seen, self.stopping = path, {}, False

    def run(self):
        while not self.path.exists() and not self.stopping:
            time.sleep(0.001)
        pending = b""
        with open(self.path, "rb") as handle:
            while True:
                data = handle.read(1 << 20)
                if not data:
                    if self.stopping:
                        return
                    time.sleep(0.001)
                    continue
                now = time.time()
                pending += data
                *complete, pending = pending.split(b"\n")
                for raw in complete:
                    text = raw.decode(errors="replace").partition(">:")[2]
                    stamp = common.stamp_of(text)
                    if stamp is not None:
                        self.seen[text.split(" ", 2)[1]] = (stamp, now)


def api(session, method, path, **kwargs):
    response = session.request(method, f"{session.base}{path}", timeout=30, **kwargs)
    response.raise_for_status()
    return response.json()


def one_run(session, url, token, ranks, rate, seconds, web, worker):
    from jobs.models import Job, LogLine, State

    script = api(session, "POST", "/api/scripts/", files={"file": ("rank_printer.py", SCRIPT.read_bytes())})
    job_id = api(session, "POST", "/api/jobs/", json={
        "image": "horovod-cpu", "gpus": ranks, "script": script["id"], "name": "latency",
        "args": ["--rate", str(rate), "--seconds", str(seconds)]})["id"]
    directory = common.job_dir(job_id)
    common.wait_for(lambda: Job.objects.get(pk=job_id).state == State.RUNNING and (directory / "output.log").exists()
                    and len(list(directory.glob("ready-*"))) == ranks, timeout=180, message="every rank to start")
    expected = int(rate * seconds) * ranks
    tail = Tail(directory / "output.log")
    tail.start()
    cpu = common.cpu_seconds(web), common.cpu_seconds(worker)
    with common.Viewers(url, job_id, token, count=1, until_stamped=expected, timeout=seconds + 120,
                        keep=True) as viewer:
        (directory / "go.tmp").write_text(f"{time.time() + 0.5:.6f}")
        (directory / "go.tmp").rename(directory / "go")
        [result] = viewer.wait()
    cpu = common.cpu_seconds(web) - cpu[0], common.cpu_seconds(worker) - cpu[1]
    common.wait_for(lambda: Job.objects.get(pk=job_id).state in (State.SUCCEEDED, State.FAILED),
                    timeout=120, message="the job to end")
    tail.stopping = True
    tail.join(timeout=10)
    job = Job.objects.get(pk=job_id)
    assert job.state == State.SUCCEEDED, (job.state, job.reason)
    assert result["complete"] and not result["dups"] and not result["missing"], result
    # LogLine.ts of an untimestamped line is when append_output began storing its batch.
    stored_at = {text.split(" ", 2)[1]: ts.timestamp() for text, ts in
                 LogLine.objects.filter(job_id=job_id, text__startswith="@").values_list("text", "ts")}
    portal, floor, added, picked, pushed = [], [], [], [], []
    for key, received in result["kept"]:
        stamp, read = tail.seen[key]
        portal.append(received - stamp)
        floor.append(read - stamp)
        added.append(received - read)
        picked.append(stored_at[key] - read)
        pushed.append(received - stored_at[key])
    figures = {name: common.summary(values) for name, values in (
        ("portal", portal), ("floor", floor), ("added", added), ("picked", picked), ("pushed", pushed))}
    figures["cpu"] = {"web": cpu[0] / expected * 1000, "worker": cpu[1] / expected * 1000}
    return figures, expected


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--rate", type=float, default=500, help="lines/s of each rank")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--runs", type=int, default=3)
    common.add_web_options(parser)
    args = parser.parse_args()

    common.setup()
    common.header(f"latency: rank print -> websocket client, {args.ranks} ranks x {args.rate:g} lines/s")
    user, token = common.bench_user()
    common.bench_image()
    runs = []
    with common.Services() as services:
        url = common.start_web(services, args)
        web = services.started[-1]
        worker = services.worker(concurrency=4)
        session = common.api_session(url, token)
        for run in range(args.runs):
            figures, lines = one_run(session, url, token, args.ranks, args.rate, args.seconds, web, worker)
            runs.append(figures)
            print(f"run {run + 1}: {lines:,} lines; " + "; ".join(
                f"{name} p50 {figures[name]['p50'] * 1000:,.1f} ms p99 {figures[name]['p99'] * 1000:,.1f} ms"
                for name in ("portal", "floor", "added", "picked", "pushed"))
                + f"; CPU per 1,000 lines: worker {figures['cpu']['worker'] * 1000:.0f} ms, "
                  f"uvicorn {figures['cpu']['web'] * 1000:.0f} ms | {common.machine()}")

    def med(name, q):
        return common.median([r[name][q] for r in runs]) * 1000

    print()
    print(f"median portal (print -> websocket):       p50 {med('portal', 'p50'):7.1f} ms   p99 {med('portal', 'p99'):7.1f} ms")
    print(f"median floor (print -> tail of the file): p50 {med('floor', 'p50'):7.1f} ms   p99 {med('floor', 'p99'):7.1f} ms")
    print(f"median portal's own share (per line):     p50 {med('added', 'p50'):7.1f} ms   p99 {med('added', 'p99'):7.1f} ms")
    print(f"  of which file -> storing begins:         p50 {med('picked', 'p50'):7.1f} ms   p99 {med('picked', 'p99'):7.1f} ms"
          "   (follower poll, read, split)")
    print(f"  of which storing -> websocket client:    p50 {med('pushed', 'p50'):7.1f} ms   p99 {med('pushed', 'p99'):7.1f} ms"
          "   (COPY, commit, Redis, consumer query + serialise, send)")
    print(f"CPU per 1,000 lines: Celery worker (follower) {common.median([r['cpu']['worker'] for r in runs]) * 1000:.0f} ms, "
          f"uvicorn (consumer) {common.median([r['cpu']['web'] for r in runs]) * 1000:.0f} ms")
    p99 = med("portal", "p99")
    print(f"RESULT latency p99 = {p99:.1f} ms, {p99 / med('floor', 'p99'):.1f}x the floor's p99; p50 ratio "
          f"{med('portal', 'p50') / med('floor', 'p50'):.1f}x (goal p99 < {GOAL_P99_MS} ms: "
          f"{'met' if p99 < GOAL_P99_MS else 'NOT met'})")
    print(f"machine at the end: {common.machine()}")


if __name__ == "__main__":
    main()
