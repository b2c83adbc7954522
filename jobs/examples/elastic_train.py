"""An elastic Horovod job: trains a small model and keeps going when the portal adds or removes GPUs.

Submit it with "Most GPUs" (max_gpus) above "GPUs": the portal starts it at GPUs, grows it into
idle GPUs and shrinks it back when a queued job needs them. What makes a script elastic:

- the training loop is a function decorated with @hvd.elastic.run, taking a state object;
- everything that must survive a resize (model, optimizer, step) lives in that state
  (hvd.elastic.TorchState); state.commit() every few steps saves it in memory on every rank;
- on a resize Horovod stops every rank at its next collective, restores the last commit, syncs
  it from rank 0 to new ranks and calls the function again: up to commit-every steps are redone.

Options: --steps (default 60), --commit-every (default 5), --step-seconds (default 0.5).
"""
import argparse
import time

import horovod.torch as hvd
import ringmaster_metrics
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--commit-every", type=int, default=5)
parser.add_argument("--step-seconds", type=float, default=0.5)
options = parser.parse_args()

hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(16, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                     named_parameters=model.named_parameters())
target = torch.randn(16, 1)


@hvd.elastic.run
def train(state):
    while state.step < options.steps:
        inputs = torch.randn(32, 16)
        loss = torch.nn.functional.mse_loss(model(inputs), inputs @ target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        state.step += 1
        loss = hvd.allreduce(loss.detach(), name="loss").item()
        if hvd.rank() == 0:
            print(f"step {state.step} of {options.steps} on {hvd.size()} ranks: loss {loss:.4f}", flush=True)
            ringmaster_metrics.log(step=state.step, loss=loss, ranks=hvd.size())
        if state.step % options.commit_every == 0:
            state.commit()
        time.sleep(options.step_seconds)


def on_reset():
    if hvd.rank() == 0:
        print(f"reset: continuing on {hvd.size()} ranks from step {state.step}", flush=True)


state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)
state.register_reset_callbacks([on_reset])
train(state)
if hvd.rank() == 0:
    print(f"done: {state.step} steps", flush=True)
