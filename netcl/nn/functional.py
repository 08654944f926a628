"""Stateless functions on Nodes (`import netcl.nn.functional as F`): activations, layers' ops, losses.

They are the differentiable ops of netcl.autograd under PyTorch's functional names: the declared ops
(netcl.ops.declaration: conv2d, linear, the pooling ops, the norms, softmax, log_softmax, embedding,
the losses) under the names their declarations give (`functional=`), added here as each is declared; the
others below.
"""

import sys

from netcl.autograd import (
    declared,
    dropout,
    gelu,
    leaky_relu,
    relu,
    sigmoid,
    silu,
    softplus,
    tanh,
)
from netcl.ops import declaration

__all__ = [
    "dropout",
    "gelu",
    "leaky_relu",
    "relu",
    "sigmoid",
    "silu",
    "softplus",
    "tanh",
]


def _add(decl: declaration.OpDecl) -> None:
    module = sys.modules[__name__]
    for name in decl.functional:
        setattr(module, name, declared.OPS[decl.name])
        if name not in __all__:
            __all__.append(name)


def _remove(decl: declaration.OpDecl) -> None:
    module = sys.modules[__name__]
    for name in decl.functional:
        if name in __all__:
            __all__.remove(name)
            delattr(module, name)


declaration.subscribe(_add, _remove)
