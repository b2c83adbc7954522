"""Every rank says hello, then all ranks average a tensor with Horovod and report a metric.

ringmaster_metrics.log() prints a `RINGMASTER_METRIC {...}` line; the job page charts it.
"""
import time

import horovod.torch as hvd
import ringmaster_metrics
import torch

hvd.init()
print(f"hello from rank {hvd.rank()} of {hvd.size()}")
for step in range(1, 6):
    value = hvd.allreduce(torch.tensor([float(hvd.rank() + step)]), name="value").item()
    ringmaster_metrics.log(step=step, mean=value)
    time.sleep(0.2)
print(f"rank {hvd.rank()} done")
