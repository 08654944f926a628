"""Adam (L2 weight decay added to the gradient) and AdamW (decoupled weight decay), PyTorch's formulas."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from netcl.optim.arguments import Flag, Pair, Real
from netcl.optim.optimizer import Optimizer, _bias_corrections


class Adam(Optimizer):
    """m = lerp(m, g, 1 - b1); v = b2 v + (1 - b2) g^2;
    p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).

    amsgrad=True: v in the denominator is the largest v so far (its own state, max_exp_avg_sq, as
    PyTorch's). lr, eps, weight_decay are finite and >= 0; betas a pair in [0, 1)."""

    rule = "adam"
    hyper = {
        "lr": Real(0),
        "betas": Pair(Real(0, 1, high_open=True)),
        "eps": Real(0),
        "weight_decay": Real(0),
        "amsgrad": Flag(),
    }
    slot_names = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
    added_hyper = {"amsgrad": False}   # (a state dict saved before amsgrad existed)
    decoupled = False

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
    ):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad))

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        return self.slot_names if group["amsgrad"] else self.slot_names[:2]

    def _hyper(self, group: dict[str, Any], step: int, items: list) -> dict[str, Any]:
        beta1, beta2 = group["betas"]
        bc1, bc2_sqrt = _bias_corrections(beta1, beta2, step)
        return dict(
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            eps=group["eps"],
            weight_decay=group["weight_decay"],
            decoupled=bool(self.decoupled),
            bias_correction1=bc1,
            bias_correction2_sqrt=bc2_sqrt,
            amsgrad=bool(group["amsgrad"]),
        )


class AdamW(Adam):
    """Adam with decoupled weight decay: p *= 1 - lr wd before the Adam update (default wd 0.01)."""

    decoupled = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
    ):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
