"""SGD with momentum, dampening, Nesterov and (L2) weight decay; Momentum is SGD with momentum 0.9."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from netcl.optim.optimizer import Optimizer


class SGD(Optimizer):
    """PyTorch's SGD: g += wd p; buf = g (first step) or mu buf + (1 - dampening) g;
    g = g + mu buf (nesterov) or buf; p -= lr g."""

    kind = 1

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(
                f"SGD needs lr, momentum, weight_decay >= 0 (got {lr}, {momentum}, {weight_decay})"
            )
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum needs momentum > 0 and dampening 0")
        super().__init__(
            params,
            dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov),
        )
        self.state_names = ("momentum_buffer",) if any(g["momentum"] for g in self.param_groups) else ()

    def _hyper(self, group: dict[str, Any], step: int, scalar: type, items: list) -> tuple:
        return (
            scalar(group["lr"]),
            scalar(group["momentum"]),
            scalar(group["dampening"]),
            scalar(group["weight_decay"]),
            np.int32(bool(group["nesterov"])),
            np.int32(step == 1),
        )


class Momentum(SGD):
    """SGD with heavy-ball momentum (0.9 by default)."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        momentum: float = 0.9,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ):
        super().__init__(
            params,
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
        )
