"""Data: DataLoader (background prefetch, pinned staging, async device copies) and datasets."""

from netcl.data.datasets import (
    DatasetUnavailable,
    Split,
    load_digits,
    load_fashion_mnist,
    load_idx_dataset,
    load_mnist,
    locate,
    read_idx,
)
from netcl.data.loader import ArrayDataset, DataLoader
from netcl.data.sampler import DistributedSampler

__all__ = [
    "ArrayDataset",
    "DataLoader",
    "DatasetUnavailable",
    "DistributedSampler",
    "Split",
    "load_digits",
    "load_fashion_mnist",
    "load_idx_dataset",
    "load_mnist",
    "locate",
    "read_idx",
]
