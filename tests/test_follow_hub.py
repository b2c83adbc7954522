"""The follow hub: one event loop and a few threads follow every job of a worker process.

No followed job holds a thread of its own: with one each (two on Kubernetes: its log stream's
too), a worker following a thousand jobs on two cores would spend itself switching between threads.
"""
import threading
import time

import pytest

from jobs.domain.followhub import Hub
from runners.base import Bell, Waiting
from tests.conftest import wait_for

FAKE = "tests.fakebackend.FakeBackend"


def test_a_ring_before_anyone_listens_is_kept_and_a_forgotten_listener_is_not_called():
    bell, calls = Bell(), []
    bell.ring()
    bell.listen(lambda: calls.append("first"))
    assert calls == ["first"]
    bell.listen(lambda: calls.append("second"))
    bell.forget()
    bell.ring()
    assert calls == ["first"]
    bell.listen(lambda: calls.append("third"))          # the ring after forget() was kept
    assert calls == ["first", "third"]


def test_follows_wake_on_their_bell_their_descriptor_or_their_time_and_a_blocked_step_holds_no_other():
    """Two step threads and four follows: one blocks in a step for 3 s; the others still wake
    within a fraction of a second on what each waits for."""
    import os

    hub = Hub(threads=2)
    woke, bell = {}, Bell()
    read_end, write_end = os.pipe()
    release = threading.Event()

    def blocking():
        yield Waiting(seconds=0)
        release.wait(3)                                 # a cancel waiting for processes to go
        woke["blocking"] = time.monotonic()

    def on_bell():
        yield Waiting(seconds=30, bell=bell)
        woke["bell"] = time.monotonic()

    def on_fd():
        yield Waiting(seconds=30, fd=read_end)
        woke["fd"] = time.monotonic()
        os.read(read_end, 1)

    def on_time():
        yield Waiting(seconds=0.3)
        woke["time"] = time.monotonic()

    try:
        started = time.monotonic()
        followings = [hub.follow(name, steps()) for name, steps in
                      (("blocking", blocking), ("bell", on_bell), ("fd", on_fd), ("time", on_time))]
        time.sleep(0.2)                                 # every follow is waiting now (one of them blocked)
        rang = time.monotonic()
        bell.ring()
        os.write(write_end, b"x")
        for following in followings[1:]:
            following.join(5)
            assert not following.is_alive(), following.name
        assert woke["bell"] - rang < 0.5 and woke["fd"] - rang < 0.5, woke
        assert 0.3 <= woke["time"] - started < 1.0, woke
        assert "blocking" not in woke                     # still blocked, and it held no other follow
    finally:
        release.set()
        os.close(read_end)
        os.close(write_end)
    followings[0].join(5)
    assert not followings[0].is_alive()


@pytest.mark.django_db(transaction=True)
def test_a_process_follows_sixty_running_jobs_with_a_few_threads(make_user, image, settings):
    """Sixty jobs of the tests' fake backend, launched and followed by this process until they
    are cancelled: the process's threads grow by the hub's few, not by one a job, and every job
    stores its lines and ends CANCELLED once its cancel is seen."""
    from jobs.domain import dbpool, follow, live
    from jobs.models import Job, State
    from tests.fakebackend import HOLD_ENV

    settings.RINGMASTER_BACKENDS = [*settings.RINGMASTER_BACKENDS, FAKE]
    owner = make_user("alice")
    jobs = [Job.objects.create(owner=owner, image=image, gpus=1, script_path="/fake/train.py", backend="fake",
                               env={HOLD_ENV: "1"}, time_limit_minutes=5, state=State.LAUNCHING).pk
            for _ in range(60)]
    # The process's one loop for pushes to viewers is there whatever it follows: counted before,
    # so the count does not depend on whether an earlier test in this process started it.
    live._announcer_loop()
    before = {thread.ident for thread in threading.enumerate()}
    followings = [follow.start(job_id) for job_id in jobs]
    assert all(followings)
    try:
        _followed_to_the_end(jobs, followings, before, settings)
    finally:
        dbpool.pool().close_all()           # the test database is dropped at the end of the session


def _followed_to_the_end(jobs, followings, before, settings):
    from jobs.models import Job, LogLine, State

    wait_for(lambda: Job.objects.filter(pk__in=jobs, state=State.RUNNING, next_seq=3).count() == len(jobs),
             timeout=60, interval=0.2, message="every job to run and store its three lines")
    new = sorted(thread.name for thread in threading.enumerate() if thread.ident not in before)
    # The hub's step threads, and a few of the process's own (its loop, heartbeat, writer,
    # announcer, Redis listener) that start on first use: not one a job.
    assert len(new) <= settings.RINGMASTER_FOLLOW_THREADS + 8, f"{len(new)} more threads for {len(jobs)} jobs: {new}"

    Job.objects.filter(pk__in=jobs).update(cancel_requested=True)
    for following in followings:
        following.join(60)
    assert not [f.name for f in followings if f.is_alive()]
    assert set(Job.objects.filter(pk__in=jobs).values_list("state", flat=True)) == {State.CANCELLED}
    assert LogLine.objects.filter(job_id__in=jobs).count() == 3 * len(jobs)      # two lines and a metric each


@pytest.mark.django_db(transaction=True)
def test_cancels_that_take_long_keep_no_other_job_from_storing_its_lines(make_user, image, settings):
    """Twenty jobs whose processes take 5 s to go are cancelled at once, more than the hub has
    step threads: a job printing meanwhile still gets its lines stored within a second (the
    cancels wait on threads of their own), and the twenty end CANCELLED."""
    from jobs.domain import dbpool, follow
    from jobs.models import Job, State
    from tests.conftest import job_name
    from tests.fakebackend import HOLD_ENV, SLOW_CANCEL_ENV, fake_root

    settings.RINGMASTER_BACKENDS = [*settings.RINGMASTER_BACKENDS, FAKE]
    owner = make_user("alice")

    def job(**env):
        return Job.objects.create(owner=owner, image=image, gpus=1, script_path="/fake/train.py", backend="fake",
                                  env={HOLD_ENV: "1", **env}, time_limit_minutes=5, state=State.LAUNCHING).pk
    slow = [job(**{SLOW_CANCEL_ENV: "5"}) for _ in range(20)]
    printing = job()
    followings = [follow.start(job_id) for job_id in [*slow, printing]]
    try:
        wait_for(lambda: Job.objects.filter(state=State.RUNNING, next_seq=3).count() == 21,
                 timeout=60, interval=0.2, message="every job to run and store its lines")
        assert settings.RINGMASTER_FOLLOW_THREADS < len(slow)
        Job.objects.filter(pk__in=slow).update(cancel_requested=True)
        wait_for(lambda: all((fake_root() / job_name(job_id) / "cancelling").exists() for job_id in slow),
                 timeout=10, interval=0.05, message="the twenty cancels to be under way at once")
        with open(fake_root() / job_name(printing) / "output.log", "ab") as out:
            out.write(b"[0]<stdout>:printed while twenty cancels wait\n")
        printed = time.monotonic()
        wait_for(lambda: Job.objects.get(pk=printing).next_seq == 4, timeout=10, interval=0.05,
                 message="the line printed meanwhile to be stored")
        assert time.monotonic() - printed < 1.0
        assert Job.objects.filter(pk__in=slow, state=State.CANCELLED).count() < len(slow)   # still under way
        Job.objects.filter(pk=printing).update(cancel_requested=True)
        for following in followings:
            following.join(60)
        assert set(Job.objects.filter(pk__in=slow).values_list("state", flat=True)) == {State.CANCELLED}
    finally:
        dbpool.pool().close_all()
