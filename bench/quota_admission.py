"""Admission pass: jobs.domain.scheduler.admit() over 10,000 queued jobs of 1,000 users, against a bare
query of the same queued rows in the same run.

The cluster: 1,000 users in 50 groups of 20 (each group a pooled quota of 64 GPUs and 20,000
GPU-hours per 30 days), a site default per user (16 GPUs, 4 jobs, 8 GPUs per job, 1,000
GPU-hours per 30 days), a personal quota for every 10th user, 50,000 finished jobs over the last
40 days (the GPU-hour windows read them), 1,000 running jobs, 10,000 queued jobs (1-8 GPUs, a
few with a priority) and 3,000 GPUs of capacity.

Figures (each pass runs in the real admit(), with its row lock and transaction):
- first pass: the one after the queue was filled (admits what fits, writes 10,000 reasons);
- steady pass: nothing changed since the last pass (the common case: beat every 15 s);
- pass after 20 jobs end: admits what the freed GPUs allow and rewrites the reasons that
  changed, inside a transaction rolled back afterwards so every round starts alike;
- bare query: the queued rows with the same columns in the scheduler's order, nothing else.

    BENCH_DATABASE_URL=postgres://postgres@127.0.0.1:5432/ringmaster_bench_quota \\
        .venv/bin/python bench/quota_admission.py [--rounds 30]
"""
import argparse
import random
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402

USERS, GROUPS, QUEUED, RUNNING, FINISHED, CAPACITY = 1000, 50, 10_000, 1000, 50_000, 3000


def populate(seed=1):
    from django.conf import settings
    from django.contrib.auth.models import Group, User
    from django.db import connection
    from django.utils import timezone

    from jobs.models import Job, Quota, State

    rng = random.Random(seed)
    settings.RINGMASTER_LOCAL_GPUS = CAPACITY
    settings.RINGMASTER_DEFAULT_QUOTA_GPUS = 16
    settings.RINGMASTER_DEFAULT_QUOTA_JOBS = 4
    settings.RINGMASTER_DEFAULT_QUOTA_GPUS_PER_JOB = 8
    settings.RINGMASTER_DEFAULT_QUOTA_GPU_HOURS = 1000
    Quota.objects.all().delete()
    User.objects.filter(username__startswith="q").delete()
    Group.objects.filter(name__startswith="team-").delete()
    groups = Group.objects.bulk_create([Group(name=f"team-{g:02d}") for g in range(GROUPS)])
    users = User.objects.bulk_create([User(username=f"q{u:04d}", password="!") for u in range(USERS)])
    membership = User.groups.through
    membership.objects.bulk_create([membership(user_id=u.pk, group_id=groups[i * GROUPS // USERS].pk)
                                    for i, u in enumerate(users)])
    Quota.objects.bulk_create([Quota(group=g, gpus=64, gpu_hours=20_000, window_days=30) for g in groups])
    Quota.objects.bulk_create([Quota(user=u, gpus=32, jobs=8) for u in users[::10]])
    image = common.bench_image()
    now = timezone.now()
    group_of = {u.pk: groups[i * GROUPS // USERS] for i, u in enumerate(users)}

    def job(user, state, gpus, **extra):
        return Job(owner=user, image=image, gpus=gpus, script_path="train.py", time_limit_minutes=600,
                   charged_group=group_of[user.pk], state=state, **extra)

    finished = []
    for _ in range(FINISHED):
        user, gpus = rng.choice(users), rng.choice((1, 2, 4, 8))
        end = now - timedelta(seconds=rng.uniform(0, 40 * 86400))
        start = end - timedelta(seconds=rng.uniform(60, 4 * 3600))
        finished.append(job(user, rng.choice((State.SUCCEEDED, State.FAILED, State.CANCELLED)), gpus,
                            started_at=start, finished_at=end, gpu_seconds=(end - start).total_seconds() * gpus))
    Job.objects.bulk_create(finished, batch_size=5000)
    running = [job(u, State.RUNNING, rng.choice((1, 2, 4)), started_at=now - timedelta(seconds=rng.uniform(60, 7200)))
               for u in users[:RUNNING]]
    Job.objects.bulk_create(running, batch_size=5000)
    queued = [job(users[i % USERS], State.QUEUED, rng.randint(1, 8), reason="waiting for the scheduler",
                  priority=rng.choice((0,) * 20 + (1, 5))) for i in range(QUEUED)]
    Job.objects.bulk_create(queued, batch_size=5000)
    with connection.cursor() as cursor:       # distinct submit times over the last day
        cursor.execute(f"UPDATE {Job._meta.db_table} SET created_at = now() - (id % 86400) * interval '1 second'")
        cursor.execute(f"ANALYZE {Job._meta.db_table}")


def bare_query():
    from jobs.models import Job, State

    start = time.perf_counter()
    rows = list(Job.objects.filter(state=State.QUEUED, cancel_requested=False).order_by("-priority", "created_at", "id")
                .values_list("id", "owner_id", "owner__username", "charged_group_id", "charged_group__name",
                             "backend", "gpus", "held", "held_by__username", "reason"))
    return time.perf_counter() - start, len(rows)


def timed_admit():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobs.domain import scheduler

    with CaptureQueriesContext(connection) as queries:
        start = time.perf_counter()
        admitted = scheduler.admit()
        elapsed = time.perf_counter() - start
    return elapsed, len(admitted), len(queries)


def after_ends(count):
    """Seconds of admit() after `count` running jobs end; rolled back afterwards."""
    from django.db import transaction
    from django.utils import timezone

    from jobs.models import Job, State

    from jobs.models import JobEvent

    with transaction.atomic():
        ending = list(Job.objects.filter(state=State.RUNNING).order_by("?").values_list("pk", flat=True)[:count])
        Job.objects.filter(pk__in=ending).update(state=State.SUCCEEDED, finished_at=timezone.now())
        events = JobEvent.objects.count()
        elapsed, admitted, queries = timed_admit()
        reasons = JobEvent.objects.count() - events - admitted
        transaction.set_rollback(True)
    return elapsed, admitted, reasons


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    common.setup()
    common.header("quota admission: admit() with 10,000 queued jobs of 1,000 users")
    started = time.perf_counter()
    populate()
    print(f"populated in {time.perf_counter() - started:.1f} s: {USERS:,} users, {GROUPS} groups, "
          f"{QUEUED:,} queued, {RUNNING:,} running, {FINISHED:,} finished jobs, {CAPACITY:,} GPUs")

    from django.db import transaction

    from jobs.models import JobEvent

    bare_query()                                                   # warm the caches alike
    events = JobEvent.objects.count()
    start = time.perf_counter()
    with transaction.atomic():        # so that the on-commit announcements can be timed apart
        first, first_admitted, first_queries = timed_admit()
    announced = time.perf_counter() - start - first
    bare_first, rows = bare_query()
    print(f"first pass: {first * 1000:,.0f} ms to decide and store (admitted {first_admitted}, "
          f"{JobEvent.objects.count() - events - first_admitted:,} reasons written, {first_queries} queries), "
          f"then {announced * 1000:,.0f} ms announcing them to live viewers after commit "
          f"(bare query of the {rows:,} queued rows: {bare_first * 1000:.1f} ms)")

    steady, busy, bare, counts = [], [], [], set()
    for _ in range(args.rounds):
        elapsed, _, queries = timed_admit()
        steady.append(elapsed)
        counts.add(queries)
        busy.append(after_ends(20))
        bare.append(bare_query()[0])
    p = common.percentile
    base50, base95 = p(bare, 50), p(bare, 95)
    print(f"bare query:                 p50 {base50 * 1000:7.1f} ms   p95 {base95 * 1000:7.1f} ms")
    for label, values in (("steady pass", steady), ("pass after 20 jobs end", [b[0] for b in busy])):
        print(f"{label + ':':27} p50 {p(values, 50) * 1000:7.1f} ms   p95 {p(values, 95) * 1000:7.1f} ms   "
              f"ratio to the bare query: p50 {p(values, 50) / base50:.1f}x, p95 {p(values, 95) / base95:.1f}x")
    print(f"queries per steady pass: {sorted(counts)}; after 20 ends: median {common.median([b[1] for b in busy]):.0f} "
          f"jobs admitted, {common.median([b[2] for b in busy]):.0f} reasons rewritten (rolled back: not announced)")


if __name__ == "__main__":
    main()
