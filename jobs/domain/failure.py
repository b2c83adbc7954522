"""Why a job failed, in one line: the rank whose error came first, not the first rank that
horovodrun reaped. When rank 1 raises, rank 0 then dies of HorovodInternalError ("Horovod has
been shut down") and horovodrun may name process 0; the reason names rank 1 and its exception,
and says what the others then did: `rank 1: RuntimeError: boom (rank 0 then stopped:
HorovodInternalError)`. A rank killed by a signal (the OOM killer's SIGKILL) says so, and so does
a job that ran into its limit of processes or memory (runners.limits): as the runner saw it (a
cgroup's count), or as the job's own lines show it. A rank that the rank launcher stopped because
its script made a world of another size than the job's (a Horovod script under torchrun) gives its
message alone, whatever the others did. Shared by every backend: it reads the stored, per-rank log."""
from datetime import timedelta

from jobs.domain import accounting
from jobs.domain.logstore import last_lines
from jobs.models import JobAttempt, LogLine
from runners.limits import printed_hit
from runners.output import TRACEBACK, exception_line, exception_name, is_secondary, signal_exit, world_size_mismatch

LINES_AFTER_TRACEBACK = 400        # a traceback longer than this is read no further
OTHERS_SHOWN = 3


def rank_errors(job):
    """[(rank, exception line)] of the ranks that printed a Python traceback in the job's current
    attempt, in the order their tracebacks began."""
    starts = {}
    # The current attempt's lines only: an earlier attempt's traceback is its own failure.
    first = (JobAttempt.objects.filter(job=job, number=job.attempt).values_list("first_seq", flat=True).first()
             or 0)
    for rank, seq in (LogLine.objects.filter(job=job, rank__isnull=False, text=TRACEBACK, seq__gte=first)
                      .order_by("seq").values_list("rank", "seq")):
        starts.setdefault(rank, seq)
    errors = []
    for rank, seq in sorted(starts.items(), key=lambda item: item[1]):
        after = list(LogLine.objects.filter(job=job, rank=rank, seq__gt=seq, stream="stderr")
                     .order_by("seq").values_list("text", flat=True)[:LINES_AFTER_TRACEBACK])
        line = exception_line(after)
        if line:
            errors.append((rank, line))
    return errors


def limit_hit(job, errors, rlimits):
    """Words for a limit held by an rlimit that the job's lines show it ran into (a refused
    allocation or fork: runners.limits.printed_hit), or ""."""
    if not rlimits:
        return ""
    ranks = {rank for rank, _ in errors} | {job.failed_rank}
    texts = [line for _, line in errors] + [text for rank in ranks for text in last_lines(job, rank=rank)]
    return printed_hit(texts, rlimits)


def _then(errors, cause_rank):
    others = [f"rank {rank} then stopped: {exception_name(line)}" for rank, line in errors if rank != cause_rank]
    if not others:
        return ""
    shown = others[:OTHERS_SHOWN] + ([f"{len(others) - OTHERS_SHOWN} more ranks too"]
                                     if len(others) > OTHERS_SHOWN else [])
    return f" ({'; '.join(shown)})"


def describe(job, exited):
    """The fields of a failed job: exit code, failing rank and reason (and what the backend saw
    that explains it, e.g. an OOMKilled pod)."""
    errors = rank_errors(job)
    explained = exited.cause or limit_hit(job, errors, exited.rlimits)
    cause = f" ({explained})" if explained else ""
    code = job.exit_code if job.exit_code is not None else exited.code
    wrong_world = next(((rank, world_size_mismatch(line)) for rank, line in errors if world_size_mismatch(line)), None)
    if wrong_world is not None:                     # the launcher does not fit the script
        rank, message = wrong_world
        return {"exit_code": code, "failed_rank": rank, "reason": message[:500]}
    first = next(((rank, line) for rank, line in errors if not is_secondary(line)), None)
    if first is not None:                           # a rank raised, and not because another one did
        rank, line = first
        reason = f"rank {rank}: {line}{cause}{_then(errors, rank)}"
        return {"exit_code": code, "failed_rank": rank, "reason": reason[:500]}
    if job.failed_rank is not None:                 # the launcher names the rank that ended first
        rank = job.failed_rank
        reason = f"rank {rank} exited with code {job.exit_code}{cause}"
        killed = signal_exit(job.exit_code)
        tail = last_lines(job, rank=rank, count=1)
        if killed:
            reason += f": {killed}"
        elif rank in dict(errors):
            reason += f": {dict(errors)[rank]}"
        elif tail:
            reason += f": {tail[-1]}"
        return {"exit_code": job.exit_code, "failed_rank": rank, "reason": (reason + _then(errors, rank))[:500]}
    if exited.code is None:
        return {"reason": ((exited.detail or "the launcher disappeared") + cause)[:500]}
    tail = last_lines(job, rank=None, count=1)
    reason = (exited.detail or f"exited with code {exited.code}") + cause + (f": {tail[-1]}" if tail else "")
    return {"exit_code": exited.code, "reason": reason[:500]}


SILENT_SECONDS = 10          # a rank quiet this long (and twice as long as the rest) is named
RANKS_LOOKED_AT = 64


def over_time_limit(job, now):
    """Whether the job has run longer than its time limit. Time that the cluster's queue held it
    after a preemption does not count; wall time since its first start is an upper bound, so the
    events are read only once that has passed."""
    limit = timedelta(minutes=job.time_limit_minutes)
    if job.started_at is None or now - job.started_at <= limit:
        return False
    return accounting.running_seconds(job, now) > limit.total_seconds()


def time_limit_reason(job, now=None):
    """`time limit of 30 minutes exceeded; rank 1 printed nothing for the last 25 min (its last
    line: '...')`: which rank hung, where one did, else that they were all still printing."""
    from django.utils import timezone

    now = now or timezone.now()
    minutes = job.time_limit_minutes
    reason = f"time limit of {minutes} minute{'' if minutes == 1 else 's'} exceeded"
    if job.gpus > RANKS_LOOKED_AT:
        return reason
    last = {}
    for rank in range(job.gpus):
        line = LogLine.objects.filter(job=job, rank=rank).order_by("-seq").values_list("ts", "text").first()
        if line:
            last[rank] = line
    never = [rank for rank in range(job.gpus) if rank not in last]
    if never:
        return f"{reason}; {_ranks(never)} printed nothing at all"
    silent = sorted(((now - ts).total_seconds(), rank, text) for rank, (ts, text) in last.items())
    longest, rank, text = silent[-1]
    rest = silent[-2][0] if len(silent) > 1 else 0
    if longest >= SILENT_SECONDS and longest >= 2 * rest:
        return f"{reason}; rank {rank} printed nothing for the last {_duration(longest)} (its last line: {text[:120]!r})"
    return f"{reason}; every rank printed within the last {_duration(longest)}"


def _ranks(ranks):
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _duration(seconds):
    seconds = max(0, round(seconds))
    if seconds < 120:
        return f"{seconds} s"
    return f"{round(seconds / 60)} min"
