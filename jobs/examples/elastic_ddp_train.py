"""An elastic torchrun job: DDP on synthetic images that goes on when the job grows or shrinks.

Submit it with the launcher "torchrun" and a GPU range (min..max). The portal grows the job
into free GPUs and shrinks it for queued jobs; torchrun then stops every worker and starts them
again in a new world of the new size (RANK and WORLD_SIZE change). So the script keeps its own
checkpoint, and every start resumes from it:

- every worker saves checkpoint.pt in the job's folder every --checkpoint-every steps (each
  host has its own copy; a write is atomic);
- at start, the workers agree on the newest step any of them has, and the lowest rank that has
  it sends the model and optimizer to the others (a new host has no copy yet).

It prints RINGMASTER_METRIC loss and img/s, and the world size it runs at.

Options: --steps (default 200), --batch-size (default 16), --checkpoint-every (default 5),
--step-seconds (the least time a step takes, default 0: a CPU demo finishes in seconds).
"""
import argparse
import io
import os
import time

import ringmaster_metrics
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

CHECKPOINT = "checkpoint.pt"

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--checkpoint-every", type=int, default=5)
parser.add_argument("--step-seconds", type=float, default=0.0)
options = parser.parse_args()

gpu = torch.cuda.is_available()
dist.init_process_group("nccl" if gpu else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
local_rank = int(os.environ.get("LOCAL_RANK", 0))
device = torch.device(f"cuda:{local_rank}") if gpu else torch.device("cpu")
if gpu:
    torch.cuda.set_device(device)
torch.manual_seed(1234 + rank)

model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4),
    torch.nn.Flatten(), torch.nn.Linear(16 * 16, 10)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)


def saved_step():
    try:
        return torch.load(CHECKPOINT, map_location="cpu")["step"]
    except (OSError, EOFError, RuntimeError, KeyError):
        return 0


def resume():
    """The newest step among the workers' checkpoints, loaded on every worker."""
    mine = saved_step()
    newest = torch.tensor([mine])
    dist.all_reduce(newest, op=dist.ReduceOp.MAX)
    if newest.item() == 0:
        return 0
    has_it = torch.tensor([rank if mine == newest.item() else world])
    dist.all_reduce(has_it, op=dist.ReduceOp.MIN)
    payload = [None]
    if rank == has_it.item():
        with open(CHECKPOINT, "rb") as handle:
            payload = [handle.read()]
    dist.broadcast_object_list(payload, src=has_it.item())
    saved = torch.load(io.BytesIO(payload[0]), map_location=device)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    return saved["step"]


start = resume()
print(f"rank {rank} of {world}: {'resuming at step ' + str(start) if start else 'starting'}", flush=True)
ddp = DistributedDataParallel(model, device_ids=[local_rank] if gpu else None)
images = torch.randn(options.batch_size, 3, 32, 32, device=device)
labels = torch.randint(0, 10, (options.batch_size,), device=device)
for step in range(start + 1, options.steps + 1):
    began = time.perf_counter()
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(ddp(images), labels)
    loss.backward()
    optimizer.step()
    time.sleep(max(0.0, options.step_seconds - (time.perf_counter() - began)))
    seconds = time.perf_counter() - began
    ringmaster_metrics.log(step=step, loss=loss.item(), img_per_sec=options.batch_size * world / seconds,
                           world_size=world)
    if step % options.checkpoint_every == 0 or step == options.steps:
        temporary = f"{CHECKPOINT}.{os.getpid()}"
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, temporary)
        os.replace(temporary, CHECKPOINT)
if rank == 0:
    print(f"finished at step {options.steps} on {world} workers", flush=True)
dist.destroy_process_group()
