"""SGD with momentum, dampening, Nesterov and (L2) weight decay; Momentum is SGD with momentum 0.9."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from netcl.optim.arguments import Flag, Real
from netcl.optim.optimizer import Optimizer


class SGD(Optimizer):
    """PyTorch's SGD: g += wd p; buf = g (first step) or mu buf + (1 - dampening) g;
    g = g + mu buf (nesterov) or buf; p -= lr g.

    lr, momentum, weight_decay are finite and >= 0, dampening in [0, 1]; the momentum buffer is made
    at the first step with momentum != 0 (also when a scheduler or load_state_dict turns it on)."""

    rule = "sgd"
    hyper = {
        "lr": Real(0),
        "momentum": Real(0),
        "dampening": Real(0, 1),
        "weight_decay": Real(0),
        "nesterov": Flag(),
    }
    slot_names = ("momentum_buffer",)
    lazy_state = ("momentum_buffer",)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ):
        super().__init__(
            params,
            dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov),
        )

    def _check_combination(self, group: dict[str, Any], where: str) -> None:
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError(
                f"{where}: Nesterov momentum needs momentum > 0 and dampening 0 "
                f"(got momentum={group['momentum']!r}, dampening={group['dampening']!r})"
            )

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("momentum_buffer",) if group["momentum"] != 0 else ()

    def _hyper(self, group: dict[str, Any], step: int, items: list) -> dict[str, Any]:
        # a momentum buffer just made (zeros) starts as the gradient itself, as PyTorch's does
        first = all(id(p) in self._fresh for p, _ in items)
        return dict(lr=group["lr"], momentum=group["momentum"], dampening=group["dampening"],
                    weight_decay=group["weight_decay"], nesterov=bool(group["nesterov"]), first_step=first)


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
