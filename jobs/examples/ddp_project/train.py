"""An example project (several modules, a config file and a requirement of its own): DDP under
torchrun on synthetic images, its settings in config.yaml (read with PyYAML, which the project's
requirements.txt names), the model in model.py and the data in data.py.

Submit the folder: `ringmaster submit --image torch-cpu --launcher torchrun --gpus 2
./jobs/examples/ddp_project --entry train.py -- --epochs 2`. Rank 0 keeps a checkpoint of every
epoch and the final model in $RINGMASTER_OUTPUT_DIR (the job's artifacts); with the checkpoint
pattern *.pt, a rerun from checkpoint resumes at the epoch after it.
"""
import argparse
import os

import ringmaster_metrics
import torch
import torch.distributed as dist
import yaml
from torch.nn.parallel import DistributedDataParallel

from data import synthetic_loader
from model import SmallNet

parser = argparse.ArgumentParser()
parser.add_argument("--config", default="config.yaml")
parser.add_argument("--epochs", type=int)
options = parser.parse_args()
with open(options.config) as handle:
    config = yaml.safe_load(handle)
epochs = options.epochs or config["epochs"]

gpu = torch.cuda.is_available()
dist.init_process_group("nccl" if gpu else "gloo")
rank, local_rank = dist.get_rank(), int(os.environ.get("LOCAL_RANK", 0))
device = torch.device(f"cuda:{local_rank}") if gpu else torch.device("cpu")
if gpu:
    torch.cuda.set_device(device)

model = SmallNet(config["width"]).to(device)
ddp = DistributedDataParallel(model, device_ids=[local_rank] if gpu else None)
optimizer = torch.optim.SGD(ddp.parameters(), lr=config["lr"], momentum=0.9)
loader = synthetic_loader(config["samples"], config["batch_size"], rank, dist.get_world_size())

output = os.environ.get("RINGMASTER_OUTPUT_DIR", ".")
first = 0
if os.environ.get("RINGMASTER_CHECKPOINT"):
    saved = torch.load(os.environ["RINGMASTER_CHECKPOINT"], map_location=device)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    first = saved["epoch"] + 1
    print(f"rank {rank}: resuming at epoch {first}", flush=True)

step = first * len(loader)
for epoch in range(first, epochs):
    for images, labels in loader:
        step += 1
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(images.to(device)), labels.to(device))
        loss.backward()
        optimizer.step()
        ringmaster_metrics.log(step=step, loss=loss.item(), epoch=epoch)
    if rank == 0:
        path = os.path.join(output, f"checkpoint-{epoch:03d}.pt")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, path + ".tmp")
        os.replace(path + ".tmp", path)
if rank == 0:
    torch.save(model.state_dict(), os.path.join(output, "model.pt"))
dist.destroy_process_group()
