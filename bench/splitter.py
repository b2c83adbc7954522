"""Splitter: runners.output alone (OutputSplitter.feed in the follower's chunks, extract_metrics on
every line, a state snapshot per chunk) on the ingest benchmark's 64-rank output, with the fast
path for whole Gloo records against the general way only (the same class with `_fast_path` off).
Rounds alternate which goes first; medians are reported. No database, no services.

    .venv/bin/python bench/splitter.py [--ranks 64] [--lines-per-rank 300] [--rounds 9]
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402
from bench.ingest import split_only  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--lines-per-rank", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()

    from runners.local import READ_CHUNK
    from runners.output import OutputSplitter

    class General(OutputSplitter):
        _fast_path = False

    data = common.gloo_bytes(common.synthetic_lines(args.ranks, args.lines_per_rank))
    common.header("splitter: 64-rank output split + metrics, fast path vs the general way")
    split_only(data, READ_CHUNK)                                 # warm up
    fast, general = [], []
    for round_ in range(args.rounds):
        order = (OutputSplitter, General) if round_ % 2 == 0 else (General, OutputSplitter)
        for cls in order:
            seconds, n = split_only(data, READ_CHUNK, cls)
            (fast if cls is OutputSplitter else general).append(n / seconds)
        print(f"round {round_ + 1}: fast path {fast[-1]:,.0f} lines/s, general way {general[-1]:,.0f} lines/s")
    ratio = common.median([f / g for f, g in zip(fast, general)])
    print(f"median fast path:   {common.median(fast):>10,.0f} lines/s")
    print(f"median general way: {common.median(general):>10,.0f} lines/s")
    print(f"RESULT splitter fast path / general way = {ratio:.2f}x")
    print(f"machine at the end: {common.machine()}")


if __name__ == "__main__":
    main()
