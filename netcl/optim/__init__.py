"""Optimizers (one fused kernel launch per chunk of parameters), schedulers and gradient clipping.
`optim.lr_scheduler` is PyTorch's name for the schedulers' module."""

from netcl.core import launch_labels
from netcl.optim import lr_scheduler
from netcl.optim.adam import Adam, AdamW
from netcl.optim.clip import clip_grad_norm_, clip_grad_value_
from netcl.optim.optimizer import Optimizer
from netcl.optim.rmsprop import RMSProp, RMSprop
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
from netcl.optim.sgd import SGD, Momentum

__all__ = [
    "Adam",
    "AdamW",
    "ConstantLR",
    "CosineAnnealing",
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestarts",
    "ExponentialLR",
    "LRScheduler",
    "LambdaLR",
    "LinearLR",
    "Momentum",
    "MultiStepLR",
    "OneCycle",
    "OneCycleLR",
    "Optimizer",
    "PolynomialLR",
    "RMSProp",
    "RMSprop",
    "ReduceLROnPlateau",
    "SGD",
    "SequentialLR",
    "StepLR",
    "WarmupCosine",
    "clip_grad_norm_",
    "clip_grad_value_",
    "lr_scheduler",
]

launch_labels.names_ops(__name__)  # netcl.profiling: an optimizer step names its launches (AdamW.step)
