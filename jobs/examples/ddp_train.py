"""A torchrun job: DistributedDataParallel on synthetic images, reporting loss and img/s.

Submit it with the launcher "torchrun" (an image that carries it, e.g. torch-cpu). torchrun
starts one process per GPU with RANK, LOCAL_RANK and WORLD_SIZE set; each one trains on its own
batches, DDP averages the gradients, and rank 0 saves a checkpoint, checkpoint.pt, every few steps
and the trained model, model.pt, at the end: both in $RINGMASTER_OUTPUT_DIR, the job's artifacts
(give the job the checkpoint pattern *.pt to rerun it from its checkpoint). A rerun from a
checkpoint ($RINGMASTER_CHECKPOINT) resumes at its step.

Options: --steps (default 30), --batch-size (default 16), --checkpoint-every (default 10).
"""
import argparse
import os
import time

import ringmaster_metrics
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--checkpoint-every", type=int, default=10)
options = parser.parse_args()

gpu = torch.cuda.is_available()
dist.init_process_group("nccl" if gpu else "gloo")
rank, local_rank = dist.get_rank(), int(os.environ.get("LOCAL_RANK", 0))
device = torch.device(f"cuda:{local_rank}") if gpu else torch.device("cpu")
if gpu:
    torch.cuda.set_device(device)
torch.manual_seed(1234 + rank)

model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4),
    torch.nn.Flatten(), torch.nn.Linear(16 * 16, 10)).to(device)
ddp = DistributedDataParallel(model, device_ids=[local_rank] if gpu else None)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
output = os.environ.get("RINGMASTER_OUTPUT_DIR", ".")
checkpoint = os.path.join(output, "checkpoint.pt")
resume = os.environ.get("RINGMASTER_CHECKPOINT") or checkpoint
start = 0
if os.path.exists(resume):
    saved = torch.load(resume, map_location=device)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    start = saved["step"]
    print(f"rank {rank}: resuming at step {start}", flush=True)

images = torch.randn(options.batch_size, 3, 32, 32, device=device)
labels = torch.randint(0, 10, (options.batch_size,), device=device)
for step in range(start + 1, options.steps + 1):
    began = time.perf_counter()
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(ddp(images), labels)
    loss.backward()
    optimizer.step()
    seconds = time.perf_counter() - began
    ringmaster_metrics.log(step=step, loss=loss.item(), img_per_sec=options.batch_size / seconds)
    if rank == 0 and step % options.checkpoint_every == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                   checkpoint + ".tmp")
        os.replace(checkpoint + ".tmp", checkpoint)
if rank == 0:
    torch.save(model.state_dict(), os.path.join(output, "model.pt"))
dist.destroy_process_group()
