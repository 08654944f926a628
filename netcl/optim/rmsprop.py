"""RMSProp (optionally centered, with momentum), PyTorch's formulas."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from netcl.optim.optimizer import Optimizer


class RMSProp(Optimizer):
    """sq = a sq + (1 - a) g^2; avg = sqrt(sq - ga^2 (centered)) + eps;
    buf = mu buf + g / avg, p -= lr buf (momentum) or p -= lr g / avg."""

    kind = 3

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
    ):
        if lr < 0 or eps < 0 or weight_decay < 0 or momentum < 0 or not 0 <= alpha <= 1:
            raise ValueError("RMSProp needs lr, eps, weight_decay, momentum >= 0 and alpha in [0, 1]")
        super().__init__(
            params,
            dict(
                lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum, centered=centered
            ),
        )
        names = ["square_avg"]
        if any(g["centered"] for g in self.param_groups):
            names.append("grad_avg")
        if any(g["momentum"] for g in self.param_groups):
            names.append("momentum_buffer")
        self.state_names = tuple(names)

    def _slots(self, st: dict[str, Any]) -> list[Any]:
        return [st.get("square_avg"), st.get("grad_avg"), st.get("momentum_buffer")]

    def _hyper(self, group: dict[str, Any], step: int, scalar: type, items: list) -> tuple:
        return (
            scalar(group["lr"]),
            scalar(group["alpha"]),
            scalar(group["eps"]),
            scalar(group["weight_decay"]),
            scalar(group["momentum"]),
            np.int32(bool(group["centered"])),
        )


RMSprop = RMSProp
