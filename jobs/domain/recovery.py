"""A job's recovery policy: an attempt that fails with a cause the policy names starts the job's
next attempt, while restarts remain, instead of failing the job.

The policy is the job's: max_restarts, restart_on_exit_codes, and restart_on (the causes of
jobs.models.RESTART_CAUSES). What each cause is, as a failed attempt shows it:
- an exit code: the failing rank's (as the launcher names it) or the launcher's own;
- "signal": a rank or the launcher killed by a signal (-9, or 128 + 9 as launchers report it);
- "oom": the job out of memory (its memory limit hit, an OOMKilled pod, a rank's MemoryError or
  CUDA out-of-memory error);
- "lost_host" and "preempted": a backend that restarts jobs and can lose a host or be preempted
  reports them in Exited.cause; none of those that restart jobs now can.

A restart (states.restart) frees the job's GPUs and queues it again with the next attempt's
number; the scheduler admits it once the backoff (RINGMASTER_RESTART_BACKOFF_SECONDS) is over. The
next attempt resumes from the job's newest checkpoint (artifacts.newest_checkpoint over its
checkpoint pattern), given to it in RINGMASTER_CHECKPOINT, where the job has a pattern and one
matches. A time limit or a cancel never restarts a job.
"""
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from jobs import taskqueue
from jobs.domain import artifacts, states
from jobs.models import State
from runners.limits import says_out_of_memory
from runners.output import signal_exit

LOST_HOST, PREEMPTED = "lost_host", "preempted"


def causes(job, exited, described):
    """The causes of the policy's vocabulary that the failed attempt shows: "exit_code" (one of
    restart_on_exit_codes), "signal", "oom", "lost_host", "preempted"."""
    codes = {code for code in (described.get("exit_code"), exited.code) if code is not None}
    found = []
    if codes & set(job.restart_on_exit_codes):
        found.append("exit_code")
    if any(signal_exit(code) for code in codes):
        found.append("signal")
    words = " ".join((described.get("reason") or "", exited.cause or ""))
    if says_out_of_memory(words):
        found.append("oom")
    found += [cause for cause in (LOST_HOST, PREEMPTED) if cause in (exited.cause or "").split()]
    return found


def earns_restart(job, found):
    return "exit_code" in found or bool(set(found) & set(job.restart_on))


def restarts_left(job):
    """How many more times the job may be restarted."""
    return max(0, job.max_restarts - (job.attempt - 1))


def restart_or_fail(job, exited, described):
    """End the failed attempt of `job` (`described`: failure.describe's fields): restart the job
    where its policy says so and restarts remain, else fail it."""
    found = causes(job, exited, described)
    if earns_restart(job, found):
        left = restarts_left(job)
        if left:
            _restart(job, described, left - 1)
            return
        described = {**described, "reason": (f"{described.get('reason', '')} "
                                             f"(no restarts left: {job.max_restarts} used)")[:500]}
    states.transition(job.pk, State.FAILED, expect={State.LAUNCHING, State.RUNNING},
                      **described)


def _restart(job, described, left):
    code, reason = described.get("exit_code"), described.get("reason", "")
    what = f"exit code {code}: {reason}" if code is not None else reason
    message = (f"attempt {job.attempt} ended ({what}); restarting "
               f"({left} of {job.max_restarts} restart{'' if job.max_restarts == 1 else 's'} left)")
    backoff = settings.RINGMASTER_RESTART_BACKOFF_SECONDS
    after = timezone.now() + timedelta(seconds=backoff) if backoff > 0 else None
    checkpoint = artifacts.newest_checkpoint(job)
    if checkpoint is not None:
        message += f", from {checkpoint}"
    if states.restart(job.pk, reason=reason, exit_code=code, message=message[:2000], restart_after=after,
                      checkpoint=checkpoint) is not None and after is not None:
        taskqueue.wake_scheduler_after(backoff)
