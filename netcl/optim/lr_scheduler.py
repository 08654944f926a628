"""PyTorch's module name for netcl.optim.scheduler (`optim.lr_scheduler.StepLR(...)`, `from
netcl.optim.lr_scheduler import OneCycleLR`): the same classes, re-exported; nothing lives here."""

from netcl.optim.scheduler import (
    ConstantLR,
    CosineAnnealing,
    CosineAnnealingLR,
    CosineAnnealingWarmRestarts,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    LRScheduler,
    MultiStepLR,
    OneCycle,
    OneCycleLR,
    PolynomialLR,
    ReduceLROnPlateau,
    SequentialLR,
    StepLR,
    WarmupCosine,
)

__all__ = [
    "ConstantLR",
    "CosineAnnealing",
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestarts",
    "ExponentialLR",
    "LRScheduler",
    "LambdaLR",
    "LinearLR",
    "MultiStepLR",
    "OneCycle",
    "OneCycleLR",
    "PolynomialLR",
    "ReduceLROnPlateau",
    "SequentialLR",
    "StepLR",
    "WarmupCosine",
]
