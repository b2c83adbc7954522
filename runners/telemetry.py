"""What a running job's hosts show: one Sample per GPU of the job, or, on a host without GPUs,
one for the job's processes (CPU and memory), so there is always something to see.

A runner that can look at its hosts returns a probe from Runner.system_probe(spec); the
follower calls probe.sample() every few seconds and probe.close() at the end.
"""
import time
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Sample:
    host: str
    device: str                      # "gpu<index>" or "cpu"
    utilization: float | None        # % (a GPU's; for "cpu": % of one core, summed over processes)
    memory_used: float | None        # MiB
    memory_total: float | None       # MiB
    power: float | None = None       # W

    def as_dict(self):
        return asdict(self)


def gpu_samples(host, gpu_samples_seen):
    return [Sample(host, f"gpu{s.index}", s.utilization, s.memory_used, s.memory_total, s.power)
            for s in gpu_samples_seen]


class CpuRate:
    """CPU % of one core between two readings of the processes' cumulative CPU seconds (the
    first reading of a host gives no rate yet)."""

    def __init__(self):
        self.last = {}

    def percent(self, host, cpu_seconds, now=None):
        now = time.monotonic() if now is None else now
        previous, self.last[host] = self.last.get(host), (cpu_seconds, now)
        if previous is None or now <= previous[1]:
            return None
        return max(cpu_seconds - previous[0], 0.0) / (now - previous[1]) * 100.0
