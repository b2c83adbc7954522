"""Running a job to its end: launch, follow its output into the database, finish it.

A follower claims a job (Job.follower, refreshed by a heartbeat). If its worker dies, the claim
goes stale and reconcile() starts a new follower, which re-attaches where the stored output ends
(runners are idempotent, the log store is a compare-and-set), so nothing is lost or repeated.

The run_job task launches; the follow runs in the worker process's follow hub (followhub: one
event loop waits for every followed job, a few threads run what a job's news asks), not in the
task pool, so jobs being followed never keep a launch (or a cancel) waiting for a free pool
thread, and a followed job costs no thread of its own. A follow holds no database connection of
its own either: it borrows one of the few its worker's followers share (dbpool) for what each
event of its job asks, so the number of jobs a worker follows is bounded by neither its threads
nor PostgreSQL's max_connections.
"""
import logging
import os
import socket
import time
from dataclasses import replace
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from jobs import backends, taskqueue
from jobs.backends import job_spec
from jobs.domain import dbpool, elastic, failure, heartbeat, live, logbatch, states, telemetry
from jobs.domain.followhub import hub
from jobs.domain.logstore import append_output
from jobs.models import ACTIVE_STATES, Job, State
from jobs.secrets import SecretError
from runners.base import Bell, Exited, Output, Running, Status, Waiting
from runners.output import OutputSplitter

log = logging.getLogger(__name__)
SIZE_CHECK_SECONDS = 0.25       # how soon an elastic job's follower sees that the scheduler resized it
HOST_CHECK_SECONDS = 5          # how often an elastic job's hosts are looked at (a lost one is dropped)
# A job nobody watches (jobs.domain.audience) that prints a little at a time has what it prints
# gathered for this long before its follow reads on: one writer round a second instead of one a
# line. Ungathered, a training job's progress line every 0.1-0.2 s costs a round each (the
# worker's wake-up, read and split, five round trips to PostgreSQL and their commit), for nobody:
# following it costs 1.9-2.6% of one core, 0.6% gathered (BENCHMARKS.md, training). Its first
# viewer reads what is stored and gets the rest live; from then on every line is stored and
# pushed as it comes.
UNWATCHED_GATHER_SECONDS = 1.0
UNWATCHED_GATHER_BELOW_BYTES = 64 << 10      # a larger read: the job prints a lot, read on at once


def follower_id():
    return f"{socket.gethostname()}:{os.getpid()}:{time.monotonic_ns()}"


def _stale_before():
    return timezone.now() - timedelta(seconds=settings.RINGMASTER_FOLLOWER_STALE_SECONDS)


def _dead_here(follower):
    """True if `follower` ran on this host in a process that no longer exists."""
    host, _, rest = follower.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def claim(job_id, me):
    """Take the job for follower `me` unless a live follower holds it."""
    active = Job.objects.filter(pk=job_id, state__in=ACTIVE_STATES)
    free = Q(follower="") | Q(follower_heartbeat__lt=_stale_before()) | Q(follower_heartbeat__isnull=True)
    if active.filter(free).update(follower=me, follower_heartbeat=timezone.now()):
        return True
    holder = active.values_list("follower", flat=True).first()
    if holder and _dead_here(holder):
        return active.filter(follower=holder).update(follower=me, follower_heartbeat=timezone.now()) == 1
    return False


def release(job_id, me):
    Job.objects.filter(pk=job_id, follower=me).update(follower="", follower_heartbeat=None)


def hold_for_launch(job_id):
    """A pending claim on a just-admitted job: reconcile leaves it to the run_job task that
    the scheduler sends, until that claim goes stale."""
    Job.objects.filter(pk=job_id).update(follower_heartbeat=timezone.now())


def hand_over(job):
    """Free an orphaned job's claim for a new follower, holding it meanwhile so the next
    reconcile does not send another. False if its follower changed since it was read."""
    return Job.objects.filter(pk=job.pk, follower=job.follower).update(
        follower="", follower_heartbeat=timezone.now()) == 1


def run(job_id):
    """Launch (if needed) and follow one job until it ends, returning then. Safe to call more
    than once."""
    following = start(job_id)
    if following is not None:
        following.join()


def start(job_id):
    """Launch the job if it is LAUNCHING, then hand it to the process's follow hub, which
    follows it to its end: the caller (a worker's task) is free again once the launch is done,
    so a launch never waits for a job being followed. Returns the hub's Following (join() waits
    for the end); None when there is nothing to follow (the job ended, or another follower
    holds it)."""
    me = follower_id()
    if not claim(job_id, me):
        log.info("job %s: not active or followed elsewhere", job_id)
        return None
    try:
        launched = _launch(job_id)
    except BaseException:
        release(job_id, me)
        raise
    if launched is None:
        release(job_id, me)
        return None
    return hub.follow(f"job {job_id}", _follow_to_end(job_id, me, *launched))


def _follow_to_end(job_id, me, runner, spec):
    """The job's follow, as steps for the hub: each yields the runner's Waiting."""
    log.info("job %s: following", job_id)
    try:
        yield from _follow(job_id, me, runner, spec)
    except Exception:
        # The claim is released: the next reconcile hands the job to a new follower.
        log.exception("job %s: its follower failed", job_id)
    finally:
        try:
            with dbpool.borrowed():
                release(job_id, me)
        finally:
            log.info("job %s: follow ended", job_id)


def _launch(job_id):
    """Launch a LAUNCHING job; (runner, spec) to follow it with, or None if it ended instead."""
    job = _load(job_id)
    backend = backends.of(job)
    runner = _runner_or_fail(job)
    if runner is None:
        return None
    spec = job_spec(job)
    if job.state == State.LAUNCHING:
        if job.cancel_requested:
            states.transition(job_id, State.CANCELLED, expect={State.LAUNCHING}, message="cancelled before launch")
            return None
        try:
            started = runner.launch(spec)
        except Exception as exc:
            log.exception("job %s: launch failed", job_id)
            backend.after_launch(job, runner, exc)
            states.transition(job_id, State.FAILED, expect={State.LAUNCHING}, reason=f"launch failed: {exc}"[:500])
            _after_end()
            return None
        backend.after_launch(job, runner)
        if runner.reports_running:
            # The job runs when the runner says so (follow yields Running); until then, say what happened.
            states.set_reason(job_id, started.detail)
        else:
            _now_running(job_id, started.detail)
    return runner, spec


def _now_running(job_id, detail):
    job = states.transition(job_id, State.RUNNING, expect={State.LAUNCHING}, message=detail)
    if job is not None and job.max_gpus:
        taskqueue.wake_scheduler()          # an elastic job may grow into what is free now


def _load(job_id):
    return Job.objects.select_related("image", "script", "cluster", "charged_group").get(pk=job_id)


def _apply_size(job_id):
    """Make an elastic job's hosts what the scheduler decided (a runner made for the hosts the
    job holds now); returns the size applied."""
    job = _load(job_id)
    spec = job_spec(job)
    backends.of(job).runner(job).resize(spec)
    return spec.gpus


def _runner_or_fail(job):
    """The job's runner; None after failing the job if the portal cannot reach where it runs
    (a stored secret it needs cannot be decrypted): retrying could never succeed."""
    try:
        return backends.of(job).runner(job)
    except SecretError as exc:
        log.error("job %s: %s", job.pk, exc)
        launched = job.state != State.LAUNCHING
        reason = (f"cannot reach the job{' (it may still run there; the portal cannot stop it)' if launched else ''}: "
                  f"{exc}")
        states.transition(job.pk, State.FAILED, expect=set(ACTIVE_STATES), reason=reason[:500])
        _after_end()
        return None


def _follow(job_id, me, runner, spec):
    with dbpool.borrowed():
        job = Job.objects.get(pk=job_id)
        if spec.elastic:
            # A follower that takes over mid-resize applies what the scheduler decided last.
            spec = replace(spec, gpus=_apply_size(job_id))
    splitter = OutputSplitter(state=job.output_state or None)
    with telemetry.Sampler(job_id, runner.system_probe(spec)):
        lost = yield from _follow_events(job_id, me, runner, spec, job, splitter)
    if lost:
        log.warning("job %s: another follower took over; this one stops", job_id)


def _follow_events(job_id, me, runner, spec, job, splitter):
    """Store the runner's events until the job ends (False) or another follower took it (True)."""
    heartbeat.follow(job_id, me)
    try:
        return (yield from _store_events(job_id, me, runner, spec, job, splitter))
    finally:
        heartbeat.forget(job_id)


def _store_events(job_id, me, runner, spec, job, splitter):
    next_host_check = next_size_check = beat_seen = 0.0
    settled = False
    resettled_at = None     # when an elastic job may be resized again after its last resize
    stop_reason = None
    pending = None          # the batch handed in last, until its answer was looked at
    stopping = None         # the cancel under way (on the hub's threads for slow calls)
    next_seq = job.next_seq  # where the job's seq stands once what was handed in is stored
    # Output is gathered only once the job is known to run: a job that ends within a gather would
    # otherwise end without its runner having been asked while it ran (a short MPIJob's
    # Running, seen only by a follow that looks).
    running = job.state == State.RUNNING
    try:
        # Breaking out of the loop closes the runner's generator: that is how a follow stops.
        for event in runner.follow(spec, job.output_offset, cursor=job.follow_cursor or None):
            now = time.monotonic()
            if isinstance(event, Output):
                # Stored by the worker's writer with what its other followers print meanwhile, in one
                # transaction. This batch is split and prepared while the one before it is stored;
                # that one's answer is looked at once this one is handed in (a batch after a
                # refused one is refused too: it does not start where the stored output ends).
                lines = splitter.feed(event.data)
                end = event.offset + len(event.data)
                handed = logbatch.submit(job_id, lines, event.offset, end, splitter.state(), follower=me,
                                         cursor=event.cursor, first_seq=next_seq)
                next_seq += len(lines)
                if pending is not None and not pending.result():
                    return True
                pending = handed
                if running and len(event.data) < UNWATCHED_GATHER_BELOW_BYTES:
                    viewer = Bell()                 # rung when a viewer opens the job's page
                    if live.nobody_hears(job_id, viewer.ring):
                        # (A cancel, the end or an elastic job's resize is seen after it.)
                        yield Waiting(seconds=SIZE_CHECK_SECONDS if spec.elastic else UNWATCHED_GATHER_SECONDS,
                                      bell=viewer)
            elif not isinstance(event, Waiting):
                if pending is not None:         # what the event says comes after every line before it
                    stored, pending = pending.result(), None
                    if not stored:
                        return True
                with dbpool.borrowed():         # given back before the runner's next event is waited for
                    if isinstance(event, Running):
                        _now_running(job_id, event.detail)
                        running = True
                    elif isinstance(event, Status):
                        states.set_reason(job_id, event.reason)
                    elif isinstance(event, Exited):
                        lines = splitter.finish()
                        job = Job.objects.get(pk=job_id)
                        if lines and not append_output(job_id, lines, job.output_offset, job.output_offset,
                                                       splitter.state(), follower=me):
                            return True
                if isinstance(event, Exited):
                    if stopping is not None:
                        yield from _waited_for(stopping)
                    if stop_reason or job.cancel_requested:
                        # The launcher may have gone first (a cancel elsewhere signals it before the
                        # ranks): the job ends only once every one of its processes has.
                        yield from _waited_for(hub.run_slow(runner.cancel, spec))
                    with dbpool.borrowed():
                        finish(job_id, event, stop_reason)
                    return False
            if spec.elastic and stop_reason is None and now >= next_size_check:
                # The scheduler resized the job: Horovod picks it up within a second of this.
                next_size_check = now + SIZE_CHECK_SECONDS
                with dbpool.borrowed():
                    size = Job.objects.filter(pk=job_id).values_list("size", flat=True).first()
                    if size and size != spec.gpus:
                        try:
                            spec = replace(spec, gpus=_apply_size(job_id))
                            resettled_at = now + settings.RINGMASTER_ELASTIC_SETTLE_SECONDS
                        except Exception:                    # a host it grows onto is away: try again soon
                            log.exception("job %s: applying its size %s failed", job_id, size)
                            next_size_check = now + HOST_CHECK_SECONDS
            if resettled_at is not None and now >= resettled_at:
                # Settled at its new size: a queued job may shrink it now, or it may grow.
                resettled_at = None
                with dbpool.borrowed():
                    taskqueue.wake_scheduler()
            # What the worker's heartbeat last read of the job (a query only when there is work).
            reading = heartbeat.reading(job_id)
            if reading is not None and reading.at > beat_seen:
                beat_seen = reading.at
                if not reading.held:
                    return True
                if stop_reason is None:
                    stop_reason, settled, next_host_check = _look_at_reading(
                        job_id, spec, reading, now, settled, next_host_check)
                    if stop_reason is not None:         # its follow goes on to the launcher's end
                        stopping = hub.run_slow(runner.cancel, spec)
            if isinstance(event, Waiting):
                # Nothing new: the hub resumes this follow when the runner's wait is over, or
                # when the next beat (or the elastic job's size) may say something.
                longest = SIZE_CHECK_SECONDS if spec.elastic else heartbeat.HEARTBEAT_SECONDS
                yield event if event.seconds <= longest else replace(event, seconds=longest)
        return False
    finally:
        # The claim is given up only once the last batch is stored or refused: a follower that
        # takes the job over then starts where the stored output really ends.
        if pending is not None:
            pending.done.wait()


def _waited_for(future):
    """Steps that wait (without a step thread) for `future` to be done; its result."""
    done = Bell()
    future.add_done_callback(lambda _: done.ring())
    while not future.done():
        yield Waiting(seconds=heartbeat.HEARTBEAT_SECONDS, bell=done)
    return future.result()


def _look_at_reading(job_id, spec, reading, now, settled, next_host_check):
    """Look at a new beat's reading of a job that is not being stopped: an elastic job's hosts
    and first settling, a cancel, the time limit. Returns (stop_reason: why the job must be
    stopped now, or None; settled, next_host_check)."""
    stop_reason = None
    if spec.elastic:
        if now >= next_host_check:
            next_host_check = now + HOST_CHECK_SECONDS
            with dbpool.borrowed():
                try:
                    current = Job.objects.get(pk=job_id)
                    backends.of(current).watch_hosts(current)
                except Exception:                # never the end of the job's follower
                    log.exception("job %s: looking at its hosts failed", job_id)
        if not settled and reading.started_at and reading.started_at <= elastic.settled_since():
            settled = True
            with dbpool.borrowed():
                taskqueue.wake_scheduler()      # it may grow now (or shrink for a queued job)
    if reading.cancel_requested:
        stop_reason = "cancel"
    elif reading.started_at and (timezone.now() - reading.started_at
                                 > timedelta(minutes=reading.time_limit_minutes)):
        with dbpool.borrowed():
            stop_reason = failure.time_limit_reason(Job.objects.get(pk=job_id))
    return stop_reason, settled, next_host_check


def finish(job_id, exited, stop_reason=None):
    """Record how the job ended. Idempotent: only an active job is moved."""
    job = Job.objects.get(pk=job_id)
    if job.cancel_requested or stop_reason == "cancel":
        states.transition(job_id, State.CANCELLED, expect=ACTIVE_STATES, message="stopped: every process ended")
    elif stop_reason:
        states.transition(job_id, State.FAILED, expect=ACTIVE_STATES, reason=stop_reason,
                          exit_code=exited.code)
    elif exited.code == 0:
        states.transition(job_id, State.SUCCEEDED, expect=ACTIVE_STATES, exit_code=0, message=exited.detail)
    else:
        states.transition(job_id, State.FAILED, expect=ACTIVE_STATES, **failure.describe(job, exited))
    _after_end()


def _after_end():
    """Capacity freed: let the scheduler admit what waits."""
    taskqueue.wake_scheduler()


def stop(job_id):
    """Stop every process of a job whose cancel was requested (the follower finishes it)."""
    job = _load(job_id)
    if job.is_terminal or not job.cancel_requested:
        return
    runner = _runner_or_fail(job)
    if runner is None:
        return
    if job.state == State.LAUNCHING and not job.follower:
        if runner.reports_running:
            # Its launch may have created what runs it (an MPIJob) before the follower went away.
            runner.cancel(job_spec(job))
        states.transition(job_id, State.CANCELLED, expect={State.LAUNCHING}, message="cancelled before launch")
        return
    runner.cancel(job_spec(job))
    # If no live follower holds the job, follow it here to its end (it ends at once).
    run(job_id)


def orphaned_jobs():
    """Active jobs whose follower stopped reporting, or died on this host."""
    active = Job.objects.filter(state__in=ACTIVE_STATES)
    stale = active.filter(Q(follower_heartbeat__lt=_stale_before()) | Q(follower_heartbeat__isnull=True))
    dead_here = [job.pk for job in active.exclude(follower="") if _dead_here(job.follower)]
    return active.filter(Q(pk__in=stale.values("pk")) | Q(pk__in=dead_here))
