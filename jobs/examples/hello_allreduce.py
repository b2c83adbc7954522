"""Every rank says hello, then all ranks average a tensor with Horovod and report a metric."""
import time

import horovod.torch as hvd
import torch

hvd.init()
print(f"hello from rank {hvd.rank()} of {hvd.size()}")
for step in range(1, 6):
    value = hvd.allreduce(torch.tensor([float(hvd.rank() + step)]), name="value").item()
    print(f'RINGMASTER_METRIC {{"step": {step}, "mean": {value}}}', flush=True)
    time.sleep(0.2)
print(f"rank {hvd.rank()} done")
