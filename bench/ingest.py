"""Ingest: synthetic 64-rank horovodrun output through the portal's whole path, against
PostgreSQL COPY of the same lines into the same table.

Portal path (the subject): the job's output.log is written in full, then the real follower
(jobs.domain.follow.run: runners.local reads it in its own chunks of up to 1 MiB, runners.output splits
it, jobs.domain.logstore.append_output stores every chunk's lines and metric points and announces
them) runs to the job's end, while one websocket viewer connected to a real uvicorn with the
Redis channel layer receives every line. Throughput = lines / (last line received by the viewer
- follower start). Baseline: the same lines, already split, formatted and sent with one COPY
into jobs_logline in one transaction. Rounds alternate which goes first; medians are reported.

    .venv/bin/python bench/ingest.py [--ranks 64] [--lines-per-rank 300] [--rounds 5]
"""
import argparse
import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402

GOAL = 0.5


def _copy_escape(text):
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def copy_run(user, lines):
    """Seconds to COPY `lines` [(rank, stream, text)] into jobs_logline for a new job."""
    from django.db import connection, transaction
    from django.utils import timezone

    from jobs.models import LogLine

    job = common.running_job(user, gpus=64, name="copy baseline")
    start = time.time()
    now = timezone.now().isoformat()
    buffer = io.StringIO()
    for seq, (rank, stream, text) in enumerate(lines):
        buffer.write(f"{job.pk}\t{seq}\t{rank}\t{stream}\t{now}\t{_copy_escape(text)}\n")
    buffer.seek(0)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.copy_expert(f"COPY {LogLine._meta.db_table} (job_id, seq, rank, stream, ts, text) FROM STDIN", buffer)
    elapsed = time.time() - start
    assert LogLine.objects.filter(job=job).count() == len(lines)
    return elapsed


def portal_run(url, user, token, data, expected_lines, expected_points):
    """(seconds until stored, seconds until the viewer had every line) through the portal."""
    from jobs.domain import follow
    from jobs.models import LogLine, MetricPoint, State

    job = common.running_job(user, gpus=64, name="ingest")
    directory = common.job_dir(job.pk)
    directory.mkdir(parents=True)
    (directory / "output.log").write_bytes(data)
    (directory / "exit_code").write_text("0\n")
    with common.Viewers(url, job.pk, token, count=1, until_seq=expected_lines - 1, timeout=600) as viewers:
        start = time.time()
        follow.run(job.pk)
        stored = time.time()
        [viewer] = viewers.wait()
    job.refresh_from_db()
    assert job.state == State.SUCCEEDED, (job.state, job.reason)
    seqs = list(LogLine.objects.filter(job=job).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(expected_lines)), "stored lines are not gap-free"
    assert MetricPoint.objects.filter(job=job).count() == expected_points
    assert viewer["complete"] and viewer["lines"] == expected_lines and not viewer["dups"] and \
        not viewer["missing"], viewer
    return stored - start, viewer["last_recv"] - start


def split_only(data, chunk, splitter_class=None):
    """Seconds for runners.output alone: split in the follower's chunks and extract metrics."""
    from runners.output import OutputSplitter, extract_metrics

    start = time.time()
    splitter = (splitter_class or OutputSplitter)()
    count = 0
    for offset in range(0, len(data), chunk):
        for line in splitter.feed(data[offset:offset + chunk]):
            extract_metrics(line.text)
            count += 1
        splitter.state()
    splitter.finish()
    return time.time() - start, count


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--lines-per-rank", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    common.setup()
    from runners.local import READ_CHUNK
    from runners.output import extract_metrics

    lines = common.synthetic_lines(args.ranks, args.lines_per_rank)
    data = common.gloo_bytes(lines)
    points = sum(len(extract_metrics(text)) for _, _, text in lines)
    n = len(lines)
    common.header("ingest: 64-rank output -> split -> PostgreSQL -> websocket viewer, vs COPY")
    print(f"{n:,} lines ({len(data) / 1e6:.1f} MB, {len(data) / n:.0f} bytes/line, {points:,} metric points) "
          f"from {args.ranks} ranks; follower chunks of up to {READ_CHUNK >> 10} KiB; {args.rounds} rounds")

    user, token = common.bench_user()
    rows = []
    with common.Services() as services:
        url = services.web()
        # Warm up: first connections, first queries, Python imports in uvicorn.
        portal_run(url, user, token, common.gloo_bytes(lines[:2000]), 2000,
                   sum(len(extract_metrics(t)) for _, _, t in lines[:2000]))
        copy_run(user, lines[:2000])
        for round_ in range(args.rounds):
            order = ("copy", "portal") if round_ % 2 == 0 else ("portal", "copy")
            result = {}
            for which in order:
                if which == "copy":
                    result["copy"] = copy_run(user, lines)
                else:
                    result["stored"], result["viewed"] = portal_run(url, user, token, data, n, points)
            result["split"] = split_only(data, READ_CHUNK)[0]
            rows.append(result)
            print(f"round {round_ + 1}: COPY {n / result['copy']:,.0f} lines/s | portal stored "
                  f"{n / result['stored']:,.0f} lines/s, viewer got all {n / result['viewed']:,.0f} lines/s | "
                  f"split+metrics alone {n / result['split']:,.0f} lines/s")

    copy_rate = common.median([n / r["copy"] for r in rows])
    stored_rate = common.median([n / r["stored"] for r in rows])
    viewed_rate = common.median([n / r["viewed"] for r in rows])
    split_rate = common.median([n / r["split"] for r in rows])
    ratio = common.median([r["copy"] / r["viewed"] for r in rows])
    stored_ratio = common.median([r["copy"] / r["stored"] for r in rows])
    print()
    print(f"median COPY baseline:          {copy_rate:>10,.0f} lines/s")
    print(f"median portal, stored:         {stored_rate:>10,.0f} lines/s  ({stored_ratio:.2f}x COPY)")
    print(f"median portal, viewer has all: {viewed_rate:>10,.0f} lines/s  ({ratio:.2f}x COPY)")
    print(f"median split+metrics alone:    {split_rate:>10,.0f} lines/s")
    print(f"RESULT ingest ratio (portal end to end / COPY) = {ratio:.2f} "
          f"(goal >= {GOAL}: {'met' if ratio >= GOAL else 'NOT met'})")
    print(f"machine at the end: {common.machine()}")


if __name__ == "__main__":
    main()
