"""The example project's data: synthetic labelled images, a different shard for each rank."""
import torch
from torch.utils.data import DataLoader, TensorDataset


def synthetic_loader(samples, batch_size, rank, world_size):
    generator = torch.Generator().manual_seed(1000 + rank)
    shard = samples // world_size
    images = torch.randn(shard, 3, 32, 32, generator=generator)
    labels = torch.randint(0, 10, (shard,), generator=generator)
    return DataLoader(TensorDataset(images, labels), batch_size=batch_size, shuffle=True, generator=generator)
