"""The training script of bench/latency.py: each rank prints `--rate` lines/s for `--seconds`,
every line starting with "@<time.time() at the print> r<rank>i<n> ".

Each rank writes `ready-<rank>` in its working directory (the job folder), then waits for a
file `go` there, written by the benchmark once its viewer is connected; `go` holds the
time.time() all ranks start at. No hvd.init():
only horovodrun's launch and output path matter here, and ranks stay light on a small machine.
"""
import argparse
import os
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--rate", type=float, default=500)
parser.add_argument("--seconds", type=float, default=10)
parser.add_argument("--wait", type=float, default=300, help="seconds to wait for the go file")
args = parser.parse_args()

rank = int(os.environ.get("HOROVOD_RANK", "0"))
go = Path("go")
Path(f"ready-{rank}").touch()
deadline = time.time() + args.wait
while not go.exists():
    if time.time() > deadline:
        sys.exit(f"rank {rank}: no go file after {args.wait:g} s")
    time.sleep(0.01)
start = float(go.read_text() or time.time())
total = int(args.rate * args.seconds)
for i in range(total):
    delay = start + i / args.rate - time.time()
    if delay > 0:
        time.sleep(delay)
    print(f"@{time.time():.6f} r{rank}i{i} Epoch 1 [{i * 32:>6}/{total * 32}] loss={2.5 * 0.999 ** i:.4f} "
          f"lr=0.100000 batch_time=0.2{i % 10}3s", flush=True)
print(f"rank {rank} done", flush=True)
