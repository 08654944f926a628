"""Neural-network building blocks: Module, layers, losses (PyTorch's names, netcl's explicit queues)."""

from netcl.autograd.engine import Parameter
from netcl.nn import functional, init
from netcl.nn.layers import (
    GELU,
    AdaptiveAvgPool2d,
    AvgPool2d,
    BatchNorm1d,
    BatchNorm2d,
    Conv2d,
    Dropout,
    Embedding,
    Flatten,
    Identity,
    LayerNorm,
    LeakyReLU,
    Linear,
    MaxPool2d,
    ModuleList,
    ReLU,
    RMSNorm,
    Sequential,
    Sigmoid,
    SiLU,
    Softmax,
    Tanh,
)
from netcl.nn.module import Module, StateDictError

__all__ = [
    "AdaptiveAvgPool2d", "AvgPool2d", "BatchNorm1d", "BatchNorm2d", "Conv2d", "Dropout", "Embedding", "Flatten",
    "GELU", "Identity", "LayerNorm", "LeakyReLU", "Linear", "MaxPool2d", "Module", "ModuleList", "Parameter",
    "RMSNorm", "ReLU", "SiLU", "Sequential", "Sigmoid", "Softmax", "StateDictError", "Tanh", "functional", "init",
]
