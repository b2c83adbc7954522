"""The follower's guarantees, each shown on real parts: one follower writes a job's log (two racing
ones write it once); a stale follower is replaced by another worker and the log has no gap or
repeat; a launch that hangs is failed; a job over its time limit is stopped.

The worker tests run a web server and workers of their own, on a queue of their own, with short
timeouts (the follower goes stale after 3 s, a launch may take 3 s), so they need not wait for
the defaults."""
import json
import os
import re
import signal
import socket
import threading
from datetime import timedelta

import pytest
import requests
from django.utils import timezone

from jobs.domain import tokens
from jobs.domain.logstore import append_output
from jobs.backends.instances.models import Instance
from jobs.models import Job, LogLine, State
from runners.output import OutputSplitter
from tests.conftest import WebServer, Worker, job_processes, wait_for
from tests.integration.test_job_lifecycle import assert_succeeded_with_every_line, submit, upload, wait_state

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
ENDED = {State.SUCCEEDED, State.FAILED, State.CANCELLED}
STALE_SECONDS = 3


# --- one writer of a job's log -----------------------------------------------------------------

def running_job(make_user, image, follower=""):
    return Job.objects.create(owner=make_user("alice"), image=image, gpus=2, script_path="t.py",
                              time_limit_minutes=5, state=State.RUNNING, follower=follower,
                              follower_heartbeat=timezone.now())


CHUNK = b"".join(b"[%d]<stdout>:rank=%d line=%d\n" % (rank, rank, i) for i in range(50) for rank in (0, 1))


def lines_of(chunk):
    splitter = OutputSplitter()
    return splitter.feed(chunk), splitter.state()


def assert_chunk_stored_once(job):
    """CHUNK's 100 lines are the job's log, seq 0 to 99, and the job's seq and offset follow them."""
    assert list(LogLine.objects.filter(job=job).order_by("seq").values_list("seq", flat=True)) == list(range(100))
    job.refresh_from_db()
    assert (job.next_seq, job.output_offset) == (100, len(CHUNK))


def test_followers_racing_on_one_chunk_store_it_once(make_user, image):
    """Eight followers store the same output bytes at the same moment (a re-attach racing a slow
    old follower): the compare-and-set on the byte offset lets exactly one of them through."""
    job = running_job(make_user, image)
    lines, state = lines_of(CHUNK)
    results, barrier = [], threading.Barrier(8)

    def store():
        from django.db import connection

        try:
            barrier.wait(timeout=10)
            results.append(append_output(job.pk, lines, 0, len(CHUNK), state))
        finally:
            connection.close()

    threads = [threading.Thread(target=store) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(results) == [False] * 7 + [True]
    stored = list(LogLine.objects.filter(job=job).order_by("seq").values_list("seq", "text"))
    assert [seq for seq, _ in stored] == list(range(100))
    assert sorted(text for _, text in stored) == sorted(f"rank={r} line={i}" for i in range(50) for r in (0, 1))
    assert Job.objects.get(pk=job.pk).output_offset == len(CHUNK)


def test_a_follower_that_lost_its_claim_stores_nothing(make_user, image):
    """A follower replaced while it was stopped (its claim now held by another) may hold the very
    next bytes; it must store nothing, so the new follower's copy is the only one."""
    job = running_job(make_user, image, follower="host:2:new")
    lines, state = lines_of(CHUNK)
    assert append_output(job.pk, lines, 0, len(CHUNK), state, follower="host:1:old") is False
    assert append_output(job.pk, lines, 5, len(CHUNK), state, follower="host:2:new") is False   # wrong offset
    assert not LogLine.objects.filter(job=job).exists()
    assert append_output(job.pk, lines, 0, len(CHUNK), state, follower="host:2:new") is True
    assert LogLine.objects.filter(job=job).count() == 100


def test_followers_storing_at_once_share_transactions_and_each_job_keeps_its_own_checks(make_user, image):
    """Twenty followers of twenty jobs hand in ten batches each, all at once, through the
    worker's group writer (one transaction a round, borrowed from the followers' few
    connections): every job gets its 1,000 lines once and in order, with its offset, cursor and
    seq, in fewer transactions than batches; a batch at a wrong offset and one from a follower
    that lost its claim, handed in among them, are refused and store nothing."""
    from django.db import connection

    from jobs.domain import logbatch
    from jobs.domain.heartbeat import Heartbeat

    owner = make_user("alice")
    jobs = [Job.objects.create(owner=owner, image=image, gpus=2, script_path="t.py", time_limit_minutes=5,
                               state=State.RUNNING, follower=f"host:1:{n}", follower_heartbeat=timezone.now())
            for n in range(20)]
    lines, state = lines_of(CHUNK)
    results, refused, barrier = {}, [], threading.Barrier(22)
    commits = []
    real_store = logbatch._store

    def counting_store(batches):
        commits.append(len(batches))
        real_store(batches)

    def follower(n, job):
        barrier.wait(timeout=10)
        results[job.pk] = [logbatch.append(job.pk, lines, i * len(CHUNK), (i + 1) * len(CHUNK), state,
                                           follower=f"host:1:{n}", cursor={"batch": i}) for i in range(10)]

    def intruder(follower_id, start):
        barrier.wait(timeout=10)
        refused.append(logbatch.append(jobs[0].pk, lines, start, start + len(CHUNK), state, follower=follower_id))

    beat, beating, beats = Heartbeat(), threading.Event(), []
    for n, job in enumerate(jobs):
        beat._followed[job.pk] = f"host:1:{n}"           # as follow() does, without its thread

    def heartbeat():                                    # the worker's heartbeat locks the same rows meanwhile
        while not beating.is_set():
            beat.beat()
            beats.append(1)

    logbatch._store = counting_store
    try:
        threads = [threading.Thread(target=follower, args=(n, job)) for n, job in enumerate(jobs)]
        threads += [threading.Thread(target=intruder, args=("host:1:0", 7)),              # not where it ends
                    threading.Thread(target=intruder, args=("host:9:old", 0))]            # not its follower
        beating_thread = threading.Thread(target=heartbeat)
        beating_thread.start()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        beating.set()
        beating_thread.join(timeout=60)
    finally:
        logbatch._store = real_store
        from jobs.domain import dbpool
        dbpool.pool().close_all()
        connection.close()
    assert refused == [False, False] and beats
    assert all(results[job.pk] == [True] * 10 for job in jobs), results
    assert sum(commits) == 202 and len(commits) < 202                    # shared rounds
    for job in jobs:
        stored = list(LogLine.objects.filter(job=job).order_by("seq").values_list("seq", "text"))
        assert [seq for seq, _ in stored] == list(range(1000))
        assert [text for _, text in stored] == [line.text for _ in range(10) for line in lines]
        job.refresh_from_db()
        assert (job.output_offset, job.next_seq, job.follow_cursor) == (10 * len(CHUNK), 1000, {"batch": 9})
        assert job.output_state == state


def test_each_job_of_a_shared_round_pushes_its_own_lines_to_its_viewers(make_user, image):
    """The rounds' pushes, sent together after each commit, reach each job's viewers (a
    subscriber of the jobs' groups, as a web process is) with that job's lines and nothing else:
    seq ranges that follow one another from the first line to the last, no line of another job."""
    import asyncio

    from channels.layers import get_channel_layer
    from django.db import connection

    from jobs.domain import dbpool, live, logbatch

    owner = make_user("alice")
    jobs = [Job.objects.create(owner=owner, image=image, gpus=2, script_path="t.py", time_limit_minutes=5,
                               state=State.RUNNING, follower=f"host:1:{n}", follower_heartbeat=timezone.now())
            for n in range(8)]
    chunks = {job.pk: b"".join(b"[0]<stdout>:job=%d line=%d\n" % (job.pk, i) for i in range(100)) for job in jobs}
    pushes, subscribed, received = {job.pk: [] for job in jobs}, threading.Event(), threading.Event()
    groups = [live.group_name(job.pk) for job in jobs]      # (the installation's id read here, not on the loop)

    async def listen():
        layer = get_channel_layer()
        channel = await layer.new_channel()
        for group in groups:
            await layer.group_add(group, channel)
        subscribed.set()
        loop, deadline = asyncio.get_running_loop(), asyncio.get_running_loop().time() + 60
        while not all(p and p[-1]["last_seq"] == 499 for p in pushes.values()) and loop.time() < deadline:
            message = await asyncio.wait_for(layer.receive(channel), deadline - loop.time())
            job_id = next(pk for pk in pushes if f"job={pk} " in message.get("lines", ""))
            pushes[job_id].append(message)
        received.set()

    listener = threading.Thread(target=lambda: asyncio.run(listen()))
    listener.start()
    assert subscribed.wait(10)

    def follower(n, job):
        splitter = OutputSplitter()
        for i in range(5):
            lines = splitter.feed(chunks[job.pk])
            assert logbatch.append(job.pk, lines, i * len(chunks[job.pk]), (i + 1) * len(chunks[job.pk]),
                                   splitter.state(), follower=f"host:1:{n}")

    try:
        threads = [threading.Thread(target=follower, args=(n, job)) for n, job in enumerate(jobs)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert received.wait(60)
        listener.join(10)
    finally:
        dbpool.pool().close_all()
        connection.close()
    for job in jobs:
        ranges = [(push["after"], push["last_seq"]) for push in sorted(pushes[job.pk], key=lambda p: p["after"])]
        assert ranges[0][0] == -1 and ranges[-1][1] == 499
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), ranges
        texts = [line["text"] for push in pushes[job.pk] for line in json.loads(push["lines"])["lines"]]
        assert sorted(texts) == sorted(f"job={job.pk} line={i}" for i in range(100) for _ in range(5))


def test_a_batch_that_cannot_be_stored_fails_only_its_own_follower(make_user, image):
    """A round in which one job's batch cannot be stored (here: a splitter state that is not
    JSON) is stored again batch by batch: that follower gets the error, the others of the round
    have their lines stored."""
    from jobs.domain import dbpool, logbatch

    owner = make_user("alice")
    jobs = [Job.objects.create(owner=owner, image=image, gpus=2, script_path="t.py", time_limit_minutes=5,
                               state=State.RUNNING, follower=f"host:1:{n}", follower_heartbeat=timezone.now())
            for n in range(4)]
    lines, state = lines_of(CHUNK)
    outcomes, barrier = {}, threading.Barrier(4)

    def follower(n, job):
        barrier.wait(timeout=10)
        try:
            outcomes[n] = logbatch.append(job.pk, lines, 0, len(CHUNK), {"bad": {1}} if n == 2 else state,
                                          follower=f"host:1:{n}")
        except TypeError as exc:
            outcomes[n] = exc

    threads = [threading.Thread(target=follower, args=(n, job)) for n, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    dbpool.pool().close_all()
    assert isinstance(outcomes.pop(2), TypeError)
    assert outcomes == {0: True, 1: True, 3: True}
    assert [LogLine.objects.filter(job=job).count() for job in jobs] == [100, 100, 0, 100]


def test_a_big_round_gets_the_gil_back_sooner_and_the_worker_its_switch_interval_after(make_user, image, monkeypatch):
    """A round of a job that printed a lot runs with a 0.5 ms switch interval (the writer is then
    what the job's viewers wait for); small rounds, and the worker once any round ended, failed
    ones too, keep the interval they had (0.5 ms all the time costs a worker of many jobs more
    CPU)."""
    import sys

    from jobs.domain import dbpool, logbatch

    seen, real_store = [], logbatch._store

    def store(batches):
        seen.append(sys.getswitchinterval())
        return real_store(batches)

    monkeypatch.setattr(logbatch, "_store", store)
    default = sys.getswitchinterval()
    job = running_job(make_user, image, follower="host:1:big")
    big = b"".join(b"[%d]<stdout>:line %d\n" % (i % 8, i) for i in range(logbatch.BIG_ROUND_LINES))
    small = CHUNK
    try:
        lines, state = lines_of(small)
        assert logbatch.append(job.pk, lines, 0, len(small), state, follower="host:1:big")
        lines, state = lines_of(big)
        assert logbatch.append(job.pk, lines, len(small), len(small) + len(big), state, follower="host:1:big")
        with pytest.raises(TypeError):          # a splitter state that is not JSON: the round fails
            logbatch.append(job.pk, lines, len(small) + len(big), len(small) + 2 * len(big), {"bad": {1}},
                            follower="host:1:big")
    finally:
        dbpool.pool().close_all()
    lowered = logbatch.BIG_ROUND_SWITCH_SECONDS
    assert seen[:2] == [default, lowered] and set(seen[2:]) == {lowered}
    assert sys.getswitchinterval() == default
    assert LogLine.objects.filter(job=job).count() == len(CHUNK.splitlines()) + logbatch.BIG_ROUND_LINES


def test_one_beat_keeps_every_claim_of_the_process_fresh_and_tells_each_follower_what_changed(make_user, image):
    """The worker's heartbeat refreshes the claims its followers hold, all in one beat, and
    tells each follower whether its claim still holds and whether its job was cancelled; a claim
    another follower took over is neither refreshed nor held."""
    from jobs.domain import dbpool
    from jobs.domain.heartbeat import Heartbeat

    long_ago = timezone.now() - timedelta(minutes=5)
    owner = make_user("alice")
    kept, taken, cancelled = (Job.objects.create(owner=owner, image=image, gpus=1, script_path="t.py",
                                                 state=State.RUNNING, time_limit_minutes=5, follower=f"host:1:{n}")
                                 for n in range(3))
    Job.objects.update(follower_heartbeat=long_ago)
    Job.objects.filter(pk=taken.pk).update(follower="host:2:other")
    Job.objects.filter(pk=cancelled.pk).update(cancel_requested=True)
    beat = Heartbeat()
    for job, n in ((kept, 0), (taken, 1), (cancelled, 2)):
        beat._followed[job.pk] = f"host:1:{n}"           # as follow() does, without its thread
    assert beat.reading(kept.pk) is None                 # nothing read yet

    try:
        beat.beat()
    finally:
        dbpool.pool().close_all()           # the test database is dropped at the end of the session
    fresh = {job.pk: job.follower_heartbeat > long_ago for job in Job.objects.all()}
    assert fresh == {kept.pk: True, taken.pk: False, cancelled.pk: True}
    assert (beat.reading(kept.pk).held, beat.reading(kept.pk).cancel_requested) == (True, False)
    assert beat.reading(taken.pk).held is False
    assert (beat.reading(cancelled.pk).held, beat.reading(cancelled.pk).cancel_requested) == (True, True)
    beat.forget(kept.pk)
    assert beat.reading(kept.pk) is None


# --- on the real worker ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def services(service_env, tmp_path_factory):
    """This module's uvicorn and a way to start workers, all on a queue of their own."""
    queue = f"ringmaster-followers-{os.getpid()}"
    env = {**service_env, "RINGMASTER_QUEUE": queue, "RINGMASTER_FOLLOWER_STALE_SECONDS": str(STALE_SECONDS),
           "RINGMASTER_LAUNCH_TIMEOUT_SECONDS": "3", "RINGMASTER_SSH_CONNECT_TIMEOUT_SECONDS": "20"}
    logs = tmp_path_factory.mktemp("follower-logs")
    workers = []

    def start_worker(name, concurrency=4, **settings):
        worker = Worker(name, {**env, **settings}, logs / f"{name}.log", queue=queue, concurrency=concurrency)
        workers.append(worker)
        return worker.start().ready()

    web = WebServer(env, logs / "web.log")
    try:
        web.start()
        yield web.url, queue, start_worker, workers
    finally:
        web.stop()
        for worker in workers:
            _continue(worker)
            worker.stop()


def _continue(worker):
    if worker.process and worker.process.poll() is None:
        os.killpg(worker.process.pid, signal.SIGCONT)


@pytest.fixture
def api(services, image, make_user):
    url, queue, start_worker, workers = services
    session = requests.Session()
    session.headers["Authorization"] = f"Token {tokens.issue(make_user('alice')).key}"
    session.base, session.queue, session.start_worker = url, queue, start_worker
    session.stop_workers = lambda: [worker.stop() for worker in workers if worker.alive()]
    session.a_worker = lambda: next((w.resume() for w in workers if w.alive()), None) or start_worker(
        f"worker{len(workers)}")
    yield session
    for worker in workers:
        _continue(worker)
    for job_id in Job.objects.filter(state__in={State.LAUNCHING, State.RUNNING}).values_list("pk", flat=True):
        session.post(f"{url}/api/jobs/{job_id}/cancel/")
    for worker in workers:
        worker.drain()          # before the test database is reset (tests.conftest.Worker)


def reconcile(queue):
    """What beat does every 15 s, now."""
    from portal.celery import app

    app.send_task("jobs.tasks.reconcile", queue=queue)


def follower_pid(job_id):
    follower = Job.objects.get(pk=job_id).follower
    return int(follower.split(":")[1]) if follower else None


def test_a_stale_follower_is_replaced_and_the_log_has_no_gap_or_repeat(api):
    first = api.start_worker("first")
    job_id = submit(api, gpus=2, script=upload(api), args=["--lines", "80", "--interval", "0.25"])
    wait_for(lambda: Job.objects.get(pk=job_id).next_seq >= 6, timeout=120, message="the first lines")
    assert follower_pid(job_id) == first.process.pid

    os.killpg(first.process.pid, signal.SIGSTOP)            # alive, but silent: its claim goes stale
    second = api.start_worker("second")                     # (its start-up reconcile may take over already)
    asked = []

    def taken_over():
        if follower_pid(job_id) == second.process.pid:
            return True
        heartbeat = Job.objects.get(pk=job_id).follower_heartbeat
        if not asked and heartbeat and heartbeat < timezone.now() - timedelta(seconds=STALE_SECONDS + 1):
            reconcile(api.queue)                             # what beat would do within 15 s
            asked.append(True)
        return False
    wait_for(taken_over, timeout=60, interval=0.2, message="the second worker to follow the job")
    _continue(first)                                           # the old one wakes up and must write nothing

    assert_succeeded_with_every_line(job_id, 80)


def test_jobs_being_followed_never_keep_a_launch_waiting(api):
    """A worker with one pool thread and three 20 s jobs: each is launched while the ones before
    it are followed (in threads outside the pool), so all three run at once. (Followed in the
    pool, the second would start only when the first ended: with the default 16 threads the 17th
    job would sit LAUNCHING.)"""
    single = api.start_worker("single", concurrency=1)
    try:
        script = upload(api)
        jobs = [submit(api, gpus=1, script=script, args=["--lines", "100", "--interval", "0.2"]) for _ in range(3)]

        wait_for(lambda: all(job.state == State.RUNNING and job.next_seq > 0
                             for job in Job.objects.filter(pk__in=jobs)),
                 timeout=60, interval=0.2, message="all three jobs to run and print")
        assert not Job.objects.filter(pk__in=jobs, state__in=ENDED).exists()     # at once, not one after another
        for job_id in jobs:
            assert_succeeded_with_every_line(job_id, 100, ranks=(0,))
        single.drain()
    finally:
        single.stop()                  # later tests of this module get a worker of the usual size


def database_connections(pid):
    """How many connections to the test database the process `pid` holds now."""
    import psutil
    from django.conf import settings

    port = int(settings.DATABASES["default"].get("PORT") or 5432)
    return sum(1 for c in psutil.Process(pid).net_connections(kind="tcp")
               if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def test_a_worker_follows_more_jobs_than_it_has_database_connections(api):
    """Six jobs followed at once by a worker whose followers share two database connections
    (RINGMASTER_FOLLOWER_DB_CONNECTIONS): the worker holds at most those two and its one pool
    thread's, and every job ends with every line. (A connection of its own for each follower and
    each of its job's telemetry samplers would be up to 12 here: a worker following 50 jobs would go
    past PostgreSQL's default max_connections and the next follower could not connect.)"""
    api.stop_workers()                # this worker alone admits (with room for six) and follows them
    worker = api.start_worker("frugal", concurrency=1, RINGMASTER_FOLLOWER_DB_CONNECTIONS="2",
                              RINGMASTER_LOCAL_GPUS="6")
    try:
        script = upload(api)
        jobs = [submit(api, gpus=1, script=script, args=["--lines", "60", "--interval", "0.25"]) for _ in range(6)]
        held = []

        def all_running():
            held.append(database_connections(worker.process.pid))
            return all(job.state == State.RUNNING and job.next_seq > 0 for job in Job.objects.filter(pk__in=jobs))
        wait_for(all_running, timeout=180, interval=0.2, message="all six jobs to run and print")

        def all_ended():
            held.append(database_connections(worker.process.pid))
            return not Job.objects.filter(pk__in=jobs).exclude(state__in=ENDED).exists()
        wait_for(all_ended, timeout=120, interval=0.2, message="all six jobs to end")
        assert max(held) <= 3, held
        for job_id in jobs:
            assert_succeeded_with_every_line(job_id, 60, ranks=(0,))
        worker.drain()
    finally:
        worker.stop()


@pytest.fixture
def silent_instance(make_user):
    """A healthy instance whose 'sshd' accepts connections and never says a word."""
    import paramiko

    from runners.ssh import host_key_line

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    key = paramiko.RSAKey.generate(2048)
    text = _private_key_text(key)
    instance = Instance(name="silent", host="127.0.0.1", port=server.getsockname()[1], user="nobody", gpus=2,
                        healthy=True, health_reason="ok (test)", host_key=host_key_line(key))
    instance.set_private_key(text)
    instance.save()
    yield instance
    server.close()


def _private_key_text(key):
    import io

    out = io.StringIO()
    key.write_private_key(out)
    return out.getvalue()


def test_a_launch_that_hangs_is_failed(api, silent_instance):
    api.a_worker()
    job_id = submit(api, gpus=1, backend="instances", script=upload(api))
    wait_state(job_id, {State.LAUNCHING}, timeout=60)
    wait_for(lambda: Job.objects.get(pk=job_id).follower_heartbeat < timezone.now() - timedelta(
        seconds=STALE_SECONDS + 1), timeout=30, message="the launching follower to go silent")
    reconcile(api.queue)

    job = wait_state(job_id, ENDED, timeout=30)
    assert job.state == State.FAILED
    assert job.reason == "the launch did not start within 3 s"


def test_a_job_over_its_time_limit_is_stopped(api):
    api.a_worker()
    job_id = submit(api, gpus=2, script=upload(api), args=["--lines", "600", "--interval", "0.2"],
                    time_limit_minutes=1)
    wait_for(lambda: set(LogLine.objects.filter(job_id=job_id).values_list("rank", flat=True)) >= {0, 1},
             timeout=120, message="both ranks to print")
    assert job_processes(job_id)
    # As if it had started two minutes ago: the follower's next check finds the limit passed.
    Job.objects.filter(pk=job_id).update(started_at=timezone.now() - timedelta(minutes=2))

    job = wait_state(job_id, ENDED, timeout=60)
    assert job.state == State.FAILED
    assert re.fullmatch(r"time limit of 1 minute exceeded; every rank printed within the last \d s", job.reason)
    assert job_processes(job_id) == []


RANK_1_HANGS = b"""
import os, sys, time
rank = int(os.environ["HOROVOD_RANK"])
print(f"rank {rank} starts", flush=True)
if rank == 1:
    print("rank 1 waits for data that never comes", flush=True)
    time.sleep(600)
for i in range(3000):
    print(f"rank 0 step {i}", flush=True)
    time.sleep(0.2)
"""


def test_a_rank_that_hangs_past_the_time_limit_is_named(api):
    api.a_worker()
    job_id = submit(api, gpus=2, script=upload(api, RANK_1_HANGS, "hang.py"), time_limit_minutes=1)
    # Both ranks have printed (rank 0 keeps printing), so only rank 1 can be the silent one.
    wait_for(lambda: LogLine.objects.filter(job_id=job_id, rank=1, text__contains="never").exists()
             and LogLine.objects.filter(job_id=job_id, rank=0, text__startswith="rank 0 step").exists(), timeout=120,
             message="both ranks to print")
    # As if rank 1 had said its last line 30 s ago and the job had started two minutes ago.
    LogLine.objects.filter(job_id=job_id, rank=1).update(ts=timezone.now() - timedelta(seconds=30))
    Job.objects.filter(pk=job_id).update(started_at=timezone.now() - timedelta(minutes=2))

    job = wait_state(job_id, ENDED, timeout=60)
    assert job.state == State.FAILED
    assert re.fullmatch(r"time limit of 1 minute exceeded; rank 1 printed nothing for the last 3\d s "
                        r"\(its last line: 'rank 1 waits for data that never comes'\)", job.reason), job.reason

def test_a_large_batch_reaches_viewers_as_pushes_that_carry_its_lines(make_user, image):
    """A batch far larger than one push may carry (a 64-rank job's 3 MB at once) goes out as
    several pushes, in seq order, each with its lines: a viewer at the place forwards them all,
    and none has to read the batch back from the database."""
    import asyncio

    from channels.layers import get_channel_layer
    from django.db import connection

    from jobs.domain import dbpool, live, logbatch

    job = Job.objects.create(owner=make_user("alice"), image=image, gpus=64, script_path="t.py",
                             time_limit_minutes=5, state=State.RUNNING, follower="host:1:big",
                             follower_heartbeat=timezone.now())
    chunk = b"".join(b"[%d]<stdout>:step %d of a long run, loss 0.%06d and a little more text to carry\n"
                     % (i % 64, i, i) for i in range(30_000))
    pushes, subscribed = [], threading.Event()

    async def listen():
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(live.group_name(job.pk), channel)
        subscribed.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while not (pushes and pushes[-1]["last_seq"] == 29_999) and loop.time() < deadline:
            pushes.append(await asyncio.wait_for(layer.receive(channel), deadline - loop.time()))

    listener = threading.Thread(target=lambda: asyncio.run(listen()))
    listener.start()
    try:
        assert subscribed.wait(10)
        splitter = OutputSplitter()
        lines = splitter.feed(chunk)
        assert logbatch.submit(job.pk, lines, 0, len(chunk), splitter.state(), follower="host:1:big",
                               first_seq=0).result()
        listener.join(60)
    finally:
        dbpool.pool().close_all()
        connection.close()
    assert len(chunk) > 2 * live.MAX_PUSH_BYTES and len(pushes) > 2
    assert all("lines" in push and len(push["lines"]) <= live.MAX_PUSH_BYTES for push in pushes)
    assert [push["after"] for push in pushes] == [-1] + [push["last_seq"] for push in pushes[:-1]]
    seqs = [line["seq"] for push in pushes for line in json.loads(push["lines"])["lines"]]
    assert seqs == list(range(30_000))


def test_a_batch_handed_in_for_another_seq_is_refused(make_user, image):
    """A follower counts where its job's seq stands to prepare its batch; a batch prepared for
    another place (a count gone wrong) is refused and stores nothing, as one from another byte
    offset is; one for the right place is stored from there."""
    from django.db import connection

    from jobs.domain import dbpool, logbatch

    job = running_job(make_user, image, follower="host:1:me")
    lines, state = lines_of(CHUNK)
    try:
        assert logbatch.submit(job.pk, lines, 0, len(CHUNK), state, follower="host:1:me", first_seq=5).result() is False
        assert LogLine.objects.filter(job=job).count() == 0
        assert logbatch.submit(job.pk, lines, 0, len(CHUNK), state, follower="host:1:me", first_seq=0).result()
    finally:
        dbpool.pool().close_all()
        connection.close()
    assert_chunk_stored_once(job)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")     # the writer's end
def test_batches_handed_in_after_the_writer_ended_are_stored_by_a_new_one(make_user, image):
    """The worker's writer thread ends only on a BaseException (an interpreter shutting down,
    an interrupt). The batch of that round gets the error, and a batch handed in afterwards is
    stored by a new writer: no follower waits for an answer that never comes."""
    from django.db import connection

    from jobs.domain import dbpool, logbatch

    class Interrupted(BaseException):
        pass

    job = running_job(make_user, image, follower="host:1:me")
    lines, state = lines_of(CHUNK)
    real_store = logbatch._store

    def interrupted_store(batches):
        logbatch._store = real_store                 # once
        raise Interrupted()

    logbatch._store = interrupted_store
    try:
        first = logbatch.submit(job.pk, lines, 0, len(CHUNK), state, follower="host:1:me", first_seq=0)
        assert first.done.wait(30)
        with pytest.raises(Interrupted):
            first.result()
        wait_for(lambda: not logbatch._writer._thread, timeout=10, message="the writer to end")
        second = logbatch.submit(job.pk, lines, 0, len(CHUNK), state, follower="host:1:me", first_seq=0)
        assert second.done.wait(30), "a batch handed in after the writer ended was never answered"
        assert second.result()
    finally:
        logbatch._store = real_store
        dbpool.pool().close_all()
        connection.close()
    assert LogLine.objects.filter(job=job).count() == 100


def test_the_writer_stores_on_after_its_database_connection_is_new(make_user, image, monkeypatch):
    """The writer's two statements are prepared once on each database connection. A connection
    made anew (CONN_MAX_AGE passed) has none: the next round prepares them again and stores,
    where an EXECUTE of a statement the new session does not know would fail the follower."""
    from django.db import connection

    from jobs.domain import dbpool, logbatch

    monkeypatch.setattr(dbpool, "_pool", dbpool.Pool(1))    # RINGMASTER_FOLLOWER_DB_CONNECTIONS=1: one connection
    job = running_job(make_user, image, follower="host:1:me")
    chunks = [CHUNK[:len(CHUNK) // 2], CHUNK[len(CHUNK) // 2:]]
    splitter, offset = OutputSplitter(), 0

    def store(chunk):
        nonlocal offset
        assert logbatch.append(job.pk, splitter.feed(chunk), offset, offset + len(chunk), splitter.state(),
                               follower="host:1:me")
        offset += len(chunk)

    try:
        store(chunks[0])
        dbpool.pool().close_all()       # as when CONN_MAX_AGE has passed: the next round opens another
        store(chunks[1])
    finally:
        dbpool.pool().close_all()
        connection.close()
    assert_chunk_stored_once(job)
