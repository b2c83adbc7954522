"""Horovod's synthetic benchmark, shrunk to run on CPUs in seconds: a small convolutional net on
random images, printing the same lines as horovod/examples/pytorch/pytorch_synthetic_benchmark.py.
The same training under either launcher: Horovod's DistributedOptimizer under horovodrun,
DistributedDataParallel (Gloo) under torchrun (RANK set, no HOROVOD_RANK).
"""
import argparse
import os
import timeit

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--image-size", type=int, default=32)
parser.add_argument("--num-warmup-batches", type=int, default=3)
parser.add_argument("--num-batches-per-iter", type=int, default=5)
parser.add_argument("--num-iters", type=int, default=5)
args = parser.parse_args()

torch.manual_seed(42)
torch.set_num_threads(1)
model = nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
    nn.Flatten(), nn.Linear(32 * 16, 10),
)
if "RANK" in os.environ and "HOROVOD_RANK" not in os.environ:       # torchrun
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size)
else:                                                               # horovodrun
    import horovod.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
target = torch.randint(0, 10, (args.batch_size,))


def benchmark_step():
    optimizer.zero_grad()
    loss = F.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()


def log(message):
    if rank == 0:
        print(message, flush=True)


log(f"Model: small-cnn\nBatch size: {args.batch_size}\nNumber of CPUs: {size}")
log("Running warmup...")
timeit.timeit(benchmark_step, number=args.num_warmup_batches)
log("Running benchmark...")
img_secs = []
for x in range(args.num_iters):
    elapsed = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / elapsed
    log(f"Iter #{x}: {img_sec:.1f} img/sec per CPU")
    img_secs.append(img_sec)
mean, conf = np.mean(img_secs), 1.96 * np.std(img_secs)
log(f"Img/sec per CPU: {mean:.1f} +-{conf:.1f}")
log(f"Total img/sec on {size} CPU(s): {size * mean:.1f} +-{size * conf:.1f}")
if "RANK" in os.environ and "HOROVOD_RANK" not in os.environ:
    dist.barrier()                  # no rank leaves while another still uses the process group
    dist.destroy_process_group()
