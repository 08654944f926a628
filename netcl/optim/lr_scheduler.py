"""PyTorch's module name for netcl.optim.scheduler (`optim.lr_scheduler.StepLR(...)`, `from
netcl.optim.lr_scheduler import OneCycleLR`): the same classes, re-exported; nothing lives here."""

from netcl.optim.scheduler import (
    CosineAnnealing,
    CosineAnnealingLR,
    LRScheduler,
    OneCycle,
    OneCycleLR,
    ReduceLROnPlateau,
    StepLR,
    WarmupCosine,
)

__all__ = [
    "CosineAnnealing",
    "CosineAnnealingLR",
    "LRScheduler",
    "OneCycle",
    "OneCycleLR",
    "ReduceLROnPlateau",
    "StepLR",
    "WarmupCosine",
]
