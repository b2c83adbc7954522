"""Job start: how long the local runner takes from launch() to a job's first line of output, for
each way a job can be kept apart, so that what the network namespace and the job's own user add
reads as a difference of medians measured in the same run. No database, no services.

Arms (interleaved, their order rotating each round):
- bare: no sandbox (RINGMASTER_LOCAL_SANDBOX=none);
- host: the sandbox on the machine's network (RINGMASTER_JOB_NETWORK=host);
- none: the sandbox in a network namespace of its own;
- outbound: the sandbox with pasta and the machine's addresses prohibited (the default).
With root, every sandboxed arm also runs as a uid of its own, as the portal does.

The job is one process (gpus=1) of the runner's own python printing one line: horovodrun and
the interpreter's start are in every arm alike.

    .venv/bin/python bench/job_start.py [--rounds 15]
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402

ARMS = ("bare", "host", "none", "outbound")


def first_line_seconds(runner, spec):
    from runners.base import Exited, Output, waited

    started = time.perf_counter()
    runner.launch(spec)
    first = None
    for event in waited(runner.follow(spec, 0)):
        if isinstance(event, Output) and first is None and b"up" in event.data:
            first = time.perf_counter() - started
        elif isinstance(event, Exited):
            if event.code != 0:
                raise RuntimeError(f"the job failed: {event.reason}")
            break
    return first


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()

    from runners.base import JobSpec
    from runners.local import LocalRunner
    from runners.sandbox import find

    common.header("job_start: launch() → first line, local runner, by isolation")
    seconds = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        runners = {arm: LocalRunner(root / arm, sandbox=None if arm == "bare" else
                                    find("bwrap", (str(root),), str(Path.home()), arm)) for arm in ARMS}
        job = 0
        for round_ in range(args.rounds + 1):                     # round 0 warms up
            order = ARMS[round_ % len(ARMS):] + ARMS[:round_ % len(ARMS)]
            for arm in order:
                job += 1
                spec = JobSpec(job_id=job, gpus=1, python=sys.executable, script_name="s.py",
                               script_content="print('up', flush=True)\n", script_path=None)
                took = first_line_seconds(runners[arm], spec)
                if round_:
                    seconds[arm].append(took)
            if round_:
                print(f"round {round_}: " + ", ".join(f"{arm} {seconds[arm][-1] * 1000:.0f} ms" for arm in ARMS))
    medians = {arm: statistics.median(values) * 1000 for arm, values in seconds.items()}
    print("medians: " + ", ".join(f"{arm} {ms:.0f} ms" for arm, ms in medians.items()))
    for arm in ("host", "none", "outbound"):
        print(f"{arm} adds {medians[arm] - medians['bare']:+.0f} ms to bare; "
              f"{medians[arm] - medians['host']:+.0f} ms to the sandbox on the machine's network")
    print(f"machine after: {common.machine()}")


if __name__ == "__main__":
    main()
