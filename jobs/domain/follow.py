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
from jobs.domain import dbpool, elastic, failure, heartbeat, live, logbatch, recovery, states, tbmetrics, telemetry
from jobs.domain.followhub import hub
from jobs.domain.logstore import append_output
from jobs.models import ACTIVE_STATES, Job, State
from jobs.secrets import SecretError
from runners.base import Bell, Exited, Output, Requeued, Running, Status, Waiting
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
    return Job.objects.select_related("image", "script", "charged_group").get(pk=job_id)


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
        heartbeat.forget(job_id, me)


def _store_events(job_id, me, runner, spec, job, splitter):
    """The follow's steps, event by event: store output, record what the runner says, end the
    job; between events, apply a resize and read the heartbeat. Returns True where another
    follower holds the job (or refused this one's output), False once the job ended."""
    follow = _Following(job_id, me, runner, spec, job, splitter)
    try:
        # Breaking out of the loop closes the runner's generator: that is how a follow stops.
        for event in runner.follow(spec, job.output_offset, cursor=job.follow_cursor or None):
            now = time.monotonic()
            if isinstance(event, Output):
                if not follow.hand_in(event):
                    return True
                if follow.unwatched(event):
                    yield follow.gather()
            elif not isinstance(event, Waiting):
                if not follow.stored_so_far() or not follow.record(event):
                    return True
                if isinstance(event, Exited):
                    yield from follow.end(event)
                    return False
            follow.apply_size(now)
            if follow.lost_claim(now):
                return True
            if isinstance(event, Waiting):
                yield follow.capped(event)
        return False
    finally:
        follow.drain()


class _Following:
    """What one follow knows between the runner's events, and its steps."""

    def __init__(self, job_id, me, runner, spec, job, splitter):
        self.job_id, self.me, self.runner, self.spec, self.job, self.splitter = job_id, me, runner, spec, job, splitter
        self.next_host_check = self.next_size_check = self.beat_seen = 0.0
        self.settled = False
        self.resettled_at = None    # when an elastic job may be resized again after its last resize
        self.stop_reason = None
        self.pending = None         # the batch handed in last, until its answer was looked at
        self.stopping = None        # the cancel under way (on the hub's threads for slow calls)
        self.next_seq = job.next_seq  # where the job's seq stands once what was handed in is stored
        # Output is gathered only once the job is known to run: a job that ends within a gather
        # would otherwise end without its runner having been asked while it ran (a short
        # MPIJob's Running, seen only by a follow that looks).
        self.running = job.state == State.RUNNING

    def hand_in(self, event):
        """Split an Output and hand its lines to the worker's writer, which stores them with what
        its other followers print meanwhile, in one transaction. This batch is split and prepared
        while the one before it is stored; that one's answer is looked at once this one is handed
        in (a batch after a refused one is refused too: it does not start where the stored output
        ends). False: the writer refused the batch before."""
        lines = self.splitter.feed(event.data)
        end = event.offset + len(event.data)
        handed = logbatch.submit(self.job_id, lines, event.offset, end, self.splitter.state(), follower=self.me,
                                 cursor=event.cursor, first_seq=self.next_seq)
        self.next_seq += len(lines)
        refused = self.pending is not None and not self.pending.result()
        self.pending = handed
        return not refused

    def unwatched(self, event):
        """Whether the running job prints a little and nobody hears it: its output is then
        gathered (read again after a while, or when a viewer rings the bell)."""
        if not self.running or len(event.data) >= UNWATCHED_GATHER_BELOW_BYTES:
            return False
        self.viewer = Bell()                 # rung when a viewer opens the job's page
        return live.nobody_hears(self.job_id, self.viewer.ring)

    def gather(self):
        # (A cancel, the end or an elastic job's resize is seen after it.)
        return Waiting(seconds=SIZE_CHECK_SECONDS if self.spec.elastic else UNWATCHED_GATHER_SECONDS,
                       bell=self.viewer)

    def stored_so_far(self):
        """Wait until the lines handed in are stored: what an event says comes after every line
        before it. False: they were refused."""
        if self.pending is None:
            return True
        stored, self.pending = self.pending.result(), None
        return stored

    def record(self, event):
        """Record what the runner says (running, a status, the last lines at its end). False:
        the last lines were refused."""
        with dbpool.borrowed():         # given back before the runner's next event is waited for
            if isinstance(event, Running):
                _now_running(self.job_id, event.detail)
                self.running = True
            elif isinstance(event, Status):
                states.set_reason(self.job_id, event.reason, event.place)
            elif isinstance(event, Requeued):
                states.transition(self.job_id, State.LAUNCHING, expect={State.RUNNING}, reason=event.reason)
                self.running = False
            elif isinstance(event, Exited):
                lines = self.splitter.finish()
                self.job = job = Job.objects.get(pk=self.job_id)
                if lines and not append_output(self.job_id, lines, job.output_offset, job.output_offset,
                                               self.splitter.state(), follower=self.me):
                    return False
        return True

    def end(self, exited):
        """Steps that end the job once its launcher exited."""
        if self.stopping is not None:
            yield from _waited_for(self.stopping)
        if self.stop_reason or self.job.cancel_requested:
            # The launcher may have gone first (a cancel elsewhere signals it before the ranks):
            # the job ends only once every one of its processes has.
            yield from _waited_for(hub.run_slow(self.runner.cancel, self.spec))
        with dbpool.borrowed():
            finish(self.job_id, exited, self.stop_reason)

    def apply_size(self, now):
        """An elastic job: apply the size the scheduler decided (Horovod picks it up within a
        second), and once it settled at it, wake the scheduler (a queued job may shrink it now,
        or it may grow)."""
        if self.spec.elastic and self.stop_reason is None and now >= self.next_size_check:
            self.next_size_check = now + SIZE_CHECK_SECONDS
            with dbpool.borrowed():
                size = Job.objects.filter(pk=self.job_id).values_list("size", flat=True).first()
                if size and size != self.spec.gpus:
                    try:
                        self.spec = replace(self.spec, gpus=_apply_size(self.job_id))
                        self.resettled_at = now + settings.RINGMASTER_ELASTIC_SETTLE_SECONDS
                    except Exception:                    # a host it grows onto is away: try again soon
                        log.exception("job %s: applying its size %s failed", self.job_id, size)
                        self.next_size_check = now + HOST_CHECK_SECONDS
        if self.resettled_at is not None and now >= self.resettled_at:
            self.resettled_at = None
            with dbpool.borrowed():
                taskqueue.wake_scheduler()

    def lost_claim(self, now):
        """Look at what the worker's heartbeat last read of the job (a query only when there is
        work): True where another follower holds it; a cancel, a time limit or a lost host
        starts stopping it (its follow goes on to the launcher's end)."""
        reading = heartbeat.reading(self.job_id)
        if reading is None or reading.at <= self.beat_seen:
            return False
        self.beat_seen = reading.at
        if not reading.held:
            return True
        if self.stop_reason is None:
            self.stop_reason, self.settled, self.next_host_check = _look_at_reading(
                self.job_id, self.spec, reading, now, self.settled, self.next_host_check)
            if self.stop_reason is not None:
                self.stopping = hub.run_slow(self.runner.cancel, self.spec)
        return False

    def capped(self, waiting):
        """The runner's wait, cut short so the hub resumes this follow when the next beat (or
        an elastic job's size) may say something."""
        longest = SIZE_CHECK_SECONDS if self.spec.elastic else heartbeat.HEARTBEAT_SECONDS
        return waiting if waiting.seconds <= longest else replace(waiting, seconds=longest)

    def drain(self):
        """The claim is given up only once the last batch is stored or refused: a follower that
        takes the job over then starts where the stored output really ends."""
        if self.pending is not None:
            self.pending.done.wait()


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
            job = Job.objects.get(pk=job_id)
            if failure.over_time_limit(job, timezone.now()):
                stop_reason = failure.time_limit_reason(job)
    return stop_reason, settled, next_host_check


def finish(job_id, exited, stop_reason=None):
    """Record how the job ended, or how its attempt did where its recovery policy restarts it
    (jobs.domain.recovery). Idempotent: only an active job is moved. The scalars its event
    files gained since beat's last look are stored (and pushed) first, while its viewers still
    listen: a page stops listening when the job ends."""
    job = Job.objects.get(pk=job_id)
    if job.state in ACTIVE_STATES:
        try:
            tbmetrics.scrape(job)
        except Exception:          # an unreadable event file must not keep the job from ending
            log.exception("job %s: its TensorBoard event files could not be read at its end", job_id)
    if job.cancel_requested or stop_reason == "cancel":
        states.transition(job_id, State.CANCELLED, expect=ACTIVE_STATES, message="stopped: every process ended")
    elif stop_reason:
        states.transition(job_id, State.FAILED, expect=ACTIVE_STATES, reason=stop_reason,
                          exit_code=exited.code)
    elif exited.code == 0:
        states.transition(job_id, State.SUCCEEDED, expect=ACTIVE_STATES, exit_code=0, message=exited.detail)
    else:
        recovery.restart_or_fail(job, exited, failure.describe(job, exited))
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
