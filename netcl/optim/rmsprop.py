"""RMSProp (optionally centered, with momentum), PyTorch's formulas."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from netcl.optim.arguments import Flag, Real
from netcl.optim.optimizer import Optimizer


class RMSProp(Optimizer):
    """sq = a sq + (1 - a) g^2; avg = sqrt(sq - ga^2 (centered)) + eps;
    buf = mu buf + g / avg, p -= lr buf (momentum) or p -= lr g / avg.

    lr, eps, weight_decay, momentum are finite and >= 0; alpha in [0, 1]."""

    rule = "rmsprop"
    hyper = {
        "lr": Real(0),
        "alpha": Real(0, 1),
        "eps": Real(0),
        "weight_decay": Real(0),
        "momentum": Real(0),
        "centered": Flag(),
    }
    slot_names = ("square_avg", "grad_avg", "momentum_buffer")

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
        super().__init__(
            params,
            dict(
                lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum, centered=centered
            ),
        )

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        names = ["square_avg"]
        if group["centered"]:
            names.append("grad_avg")
        if group["momentum"] > 0:
            names.append("momentum_buffer")
        return tuple(names)

    def _hyper(self, group: dict[str, Any], step: int, items: list) -> dict[str, Any]:
        return dict(
            lr=group["lr"],
            alpha=group["alpha"],
            eps=group["eps"],
            weight_decay=group["weight_decay"],
            momentum=group["momentum"],
            centered=bool(group["centered"]),
        )


RMSprop = RMSProp
