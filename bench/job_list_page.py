"""Job list page with 100,000 jobs in the table: the whole Django request (session, middleware,
view, paginator count, template) for a staff user's first page, a staff user's deep page
(page 2,000: offset 49,975) and a user's own first page, against a bare SQL query of the same
25 rows in the same run; plus the number of queries per page, which must not grow with the page.

    BENCH_DATABASE_URL=postgres://postgres@127.0.0.1:5432/ringmaster_bench_quota \\
        .venv/bin/python bench/job_list_page.py [--requests 200]
"""
import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402

JOBS, USERS, PAGE = 100_000, 1000, 25


def populate(seed=2):
    from django.contrib.auth.models import Group, User
    from django.db import connection

    from jobs.models import Job, State

    rng = random.Random(seed)
    User.objects.filter(username__startswith="l").delete()
    Group.objects.filter(name__startswith="list-").delete()
    groups = Group.objects.bulk_create([Group(name=f"list-{g:02d}") for g in range(20)])
    users = User.objects.bulk_create([User(username=f"l{u:04d}", password="!") for u in range(USERS)])
    staff = User.objects.create(username="list-staff", password="!", is_staff=True)
    image = common.bench_image()
    states = [State.SUCCEEDED] * 60 + [State.FAILED] * 15 + [State.CANCELLED] * 10 + [State.QUEUED] * 10 + \
        [State.RUNNING] * 5
    batch = []
    for i in range(JOBS):
        user = users[i % USERS]
        batch.append(Job(owner=user, image=image, gpus=rng.choice((1, 2, 4, 8)), script_path="train.py",
                         time_limit_minutes=600, name=f"run-{i}", state=rng.choice(states),
                         charged_group=groups[(i % USERS) % 20], priority=rng.choice((0,) * 9 + (5,))))
        if len(batch) == 10_000:
            Job.objects.bulk_create(batch)
            batch = []
    with connection.cursor() as cursor:        # distinct submit times over the last 100 days
        cursor.execute(f"UPDATE {Job._meta.db_table} SET created_at = now() - (id % 100000) * interval '86 second'")
        cursor.execute(f"ANALYZE {Job._meta.db_table}")
    return staff, users[0]


def bare(owner_id, offset):
    """The same 25 rows, newest first, by one SQL statement on a cursor: nothing else."""
    from django.db import connection

    from jobs.models import Job

    where = "WHERE owner_id = %s" if owner_id else ""
    sql = (f"SELECT * FROM {Job._meta.db_table} {where} ORDER BY created_at DESC, id DESC LIMIT {PAGE} "
           f"OFFSET {offset}")
    start = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(sql, [owner_id] if owner_id else [])
        rows = cursor.fetchall()
    elapsed = time.perf_counter() - start
    assert len(rows) == PAGE
    return elapsed


def page(client, url):
    start = time.perf_counter()
    response = client.get(url)
    elapsed = time.perf_counter() - start
    assert response.status_code == 200, response.status_code
    return elapsed


def queries(client, url):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        client.get(url)
    return len(captured)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    common.setup()
    from django.test import Client

    common.header("job list page with 100,000 jobs")
    started = time.perf_counter()
    staff, user = populate()
    print(f"populated in {time.perf_counter() - started:.1f} s: {JOBS:,} jobs of {USERS:,} users")
    cases = [("staff, page 1", staff, "/", None, 0),
             ("staff, page 2,000", staff, "/?page=2000", None, (2000 - 1) * PAGE),
             ("user, own page 1", user, "/", user.pk, 0)]
    clients = {}
    for _, who, url, _, _ in cases:
        client = clients.setdefault(who.pk, Client(HTTP_HOST="localhost"))
        client.force_login(who)
        client.get(url)                                     # warm: session, templates, caches
    counts = {label: queries(clients[who.pk], url) for label, who, url, _, _ in cases}
    counts["staff, page 3 (check)"] = queries(clients[staff.pk], "/?page=3")
    print("queries per page: " + ", ".join(f"{label}: {n}" for label, n in counts.items()))
    for label, who, url, owner_id, offset in cases:
        timings, baseline = [], []
        for _ in range(args.requests):              # interleaved, so both see the same machine
            timings.append(page(clients[who.pk], url))
            baseline.append(bare(owner_id, offset))
        p = common.percentile
        print(f"{label:18} page p50 {p(timings, 50) * 1000:6.1f} ms  p95 {p(timings, 95) * 1000:6.1f} ms | "
              f"bare query p50 {p(baseline, 50) * 1000:5.2f} ms  p95 {p(baseline, 95) * 1000:5.2f} ms | "
              f"ratio p50 {p(timings, 50) / p(baseline, 50):5.1f}x  p95 {p(timings, 95) / p(baseline, 95):5.1f}x")


if __name__ == "__main__":
    main()
