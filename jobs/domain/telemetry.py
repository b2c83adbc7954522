"""System metrics of running jobs: sampled by the follower, stored, pushed, summarised.

While a follower follows a job, a Sampler (a follow of the process's follow hub, so no thread
of its own) asks the runner's probe (its hosts' GPUs, or its processes' CPU and memory) every
RINGMASTER_TELEMETRY_SECONDS, stores the samples (SystemSample) and then tells live viewers.
Trouble sampling never touches the job.
"""
import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import Avg, Count, Max, Min
from django.utils import timezone

from jobs import backends
from jobs.domain import dbpool, live
from jobs.domain.followhub import hub
from jobs.models import SystemSample
from runners.base import Bell, Waiting

log = logging.getLogger(__name__)
IDLE_WINDOW = timedelta(minutes=10)
IDLE_BELOW_PERCENT = 30
IDLE_MIN_SAMPLES = 6


def as_dict(sample):
    return {"id": sample.id, "ts": sample.ts, "host": sample.host, "device": sample.device, "utilization": sample.utilization,
            "memory_used": sample.memory_used, "memory_total": sample.memory_total, "power": sample.power}


def store(job_id, samples, now=None):
    """Store what one probe saw (runners.telemetry.Sample), all at the same time."""
    now = now or timezone.now()
    rows = SystemSample.objects.bulk_create([
        SystemSample(job_id=job_id, ts=now, **sample.as_dict()) for sample in samples])
    return rows


def idle_hint(job_id, now=None):
    """A sentence for a job whose GPUs sit mostly idle over the last ten minutes, or ""."""
    now = now or timezone.now()
    recent = SystemSample.objects.filter(job_id=job_id, device__startswith="gpu", ts__gte=now - IDLE_WINDOW,
                                         utilization__isnull=False)
    if recent.count() < IDLE_MIN_SAMPLES:
        return ""
    mean = recent.aggregate(mean=Avg("utilization"))["mean"]
    first = recent.order_by("ts").values_list("ts", flat=True).first()
    minutes = max(1, round((now - first).total_seconds() / 60))
    if mean >= IDLE_BELOW_PERCENT:
        return ""
    return (f"GPU utilization {mean:.0f}% over the last {minutes} minute{'s' if minutes != 1 else ''}: "
            f"is the input pipeline the bottleneck?")


def gpus_idle(job_id, since, below, now=None):
    """Whether every GPU sample of the job since `since` shows utilization under `below` %, and
    the samples cover that time (the first within a minute, or three sampling intervals, of it)."""
    now = now or timezone.now()
    seen = SystemSample.objects.filter(job_id=job_id, device__startswith="gpu", ts__gte=since, ts__lte=now,
                                       utilization__isnull=False).aggregate(n=Count("id"), top=Max("utilization"),
                                                                            first=Min("ts"))
    slack = timedelta(seconds=max(60, 3 * settings.RINGMASTER_TELEMETRY_SECONDS))
    return seen["n"] >= 2 and seen["top"] < below and seen["first"] <= since + slack


def summary(job):
    """The system group of the metrics API: whether it is collected here, the samples, a hint."""
    try:
        backend = backends.of(job)
    except backends.UnknownBackend:
        return {"collected": False, "note": "", "hint": "", "samples": []}
    collected = backend.collects_system_metrics
    return {
        "collected": collected,
        "note": "" if collected else backend.system_metrics_note,
        "hint": idle_hint(job.pk) if collected else "",
        "samples": [as_dict(s) for s in SystemSample.objects.filter(job=job).order_by("ts", "id")] if collected else [],
    }


class Sampler:
    """Samples a job's hosts while the follower is in it (the hub drives it), until stopped. A
    sample being taken when it stops is its last; the probe is closed then."""

    def __init__(self, job_id, probe, interval=None):
        self.job_id, self.probe = job_id, probe
        self.interval = settings.RINGMASTER_TELEMETRY_SECONDS if interval is None else interval
        self.stopped, self.stop_bell = False, Bell()
        self.failures = 0

    def __enter__(self):
        if self.probe is not None and self.interval > 0:
            hub.follow(f"job {self.job_id}'s telemetry", self._run())
        return self

    def __exit__(self, *exc):
        self.stopped = True
        self.stop_bell.ring()
        return False

    def _delays(self):
        """Two quick looks first (a CPU rate needs two readings), so that even a job of a few
        seconds has something to show; then one every interval."""
        yield min(1.0, self.interval)
        yield min(1.0, self.interval)
        while True:
            yield self.interval

    def _run(self):
        try:
            for delay in self._delays():
                yield Waiting(seconds=delay, bell=self.stop_bell)
                if self.stopped:
                    break
                self.sample_once()
        finally:
            self.probe.close()

    def sample_once(self):
        try:
            samples = self.probe.sample()
        except Exception as exc:  # a host that does not answer now may answer next time
            self.failures += 1
            if self.failures in (1, 10) or self.failures % 100 == 0:
                log.warning("job %s: system sample failed (%d times): %s", self.job_id, self.failures, exc)
            return []
        if not samples or self.stopped:
            return []
        with dbpool.borrowed():             # not while the probe waits on a host
            rows = store(self.job_id, samples)
            live.publish_system(self.job_id, [as_dict(row) for row in rows], idle_hint(self.job_id))
        return rows
