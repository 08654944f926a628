"""Learning-rate schedulers: StepLR, CosineAnnealing, WarmupCosine, OneCycle, ReduceLROnPlateau.

Each sets `group['lr']` of its optimizer; call `step()` once per epoch (or per batch for the
per-step schedules). Every scheduler has state_dict()/load_state_dict() of plain numbers.
"""

from __future__ import annotations

import math
from typing import Any

from netcl.optim.optimizer import Optimizer


class LRScheduler:
    """Closed-form schedule: lr_i = f(base_lr_i, step). `last_epoch` counts step() calls."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1):
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def lr_at(self, base_lr: float, step: int, group: dict[str, Any]) -> float:
        raise NotImplementedError

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    def step(self) -> None:
        self.last_epoch += 1
        self.refresh()

    def refresh(self) -> None:
        """Set each group's lr for the current step (again, after a change to the schedule itself: a
        longer T_max when a resumed run trains further)."""
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = self.lr_at(base, self.last_epoch, group)
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.__dict__.update({k: v for k, v in state.items() if k != "optimizer"})
        if "base_lrs" in state:
            self.base_lrs = list(state["base_lrs"])
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr


class StepLR(LRScheduler):
    """lr = base * gamma ** (epoch // step_size)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
        if step_size <= 0:
            raise ValueError(f"StepLR: step_size must be positive, got {step_size}")
        self.step_size = int(step_size)
        self.gamma = float(gamma)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int, group: dict[str, Any]) -> float:
        return base_lr * self.gamma ** (step // self.step_size)


class CosineAnnealing(LRScheduler):
    """lr = eta_min + (base - eta_min) (1 + cos(pi t / T_max)) / 2 (PyTorch's closed form), periodic in t."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1):
        if T_max <= 0:
            raise ValueError(f"CosineAnnealing: T_max must be positive, got {T_max}")
        self.T_max = int(T_max)
        self.eta_min = float(eta_min)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int, group: dict[str, Any]) -> float:
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * step / self.T_max)) / 2


CosineAnnealingLR = CosineAnnealing


class WarmupCosine(LRScheduler):
    """Linear warm-up over `warmup_steps` (lr = base (t + 1) / warmup_steps), then cosine decay to
    eta_min at `total_steps`, and eta_min after."""

    def __init__(
        self,
        optimizer: Optimizer,
        warmup_steps: int,
        total_steps: int,
        eta_min: float = 0.0,
        last_epoch: int = -1,
    ):
        if warmup_steps < 0 or total_steps <= warmup_steps:
            raise ValueError(
                f"WarmupCosine needs 0 <= warmup_steps < total_steps, got {warmup_steps}, {total_steps}"
            )
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.eta_min = float(eta_min)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr: float, step: int, group: dict[str, Any]) -> float:
        if step < self.warmup_steps:
            return base_lr * (step + 1) / self.warmup_steps
        if step >= self.total_steps:
            return self.eta_min
        progress = (step - self.warmup_steps) / (self.total_steps - self.warmup_steps)
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * progress)) / 2


class OneCycle(LRScheduler):
    """PyTorch's OneCycleLR (two phases, cosine or linear annealing): from max_lr / div_factor up to
    max_lr over pct_start of total_steps, then down to initial / final_div_factor. With
    cycle_momentum, momentum (or Adam's beta1) moves the opposite way between base and max."""

    def __init__(
        self,
        optimizer: Optimizer,
        max_lr: float | list[float],
        total_steps: int,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        cycle_momentum: bool = True,
        base_momentum: float = 0.85,
        max_momentum: float = 0.95,
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        last_epoch: int = -1,
    ):
        if total_steps <= 0 or not 0 <= pct_start <= 1:
            raise ValueError(
                f"OneCycle needs total_steps > 0 and pct_start in [0, 1], got {total_steps}, {pct_start}"
            )
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        groups = optimizer.param_groups
        max_lrs = max_lr if isinstance(max_lr, (list, tuple)) else [max_lr] * len(groups)
        self.total_steps = int(total_steps)
        self.anneal_strategy = anneal_strategy
        self.phase_ends = [float(pct_start * total_steps) - 1, float(total_steps - 1)]
        for g, m in zip(groups, max_lrs):
            g["initial_lr"] = m / div_factor
            g["max_lr"] = m
            g["min_lr"] = g["initial_lr"] / final_div_factor
        self.max_lrs = list(max_lrs)
        self.cycle_momentum = cycle_momentum and any(("momentum" in g or "betas" in g) for g in groups)
        self.base_momentum = base_momentum
        self.max_momentum = max_momentum
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def _phase(self, step: int) -> tuple[int, float]:
        start = 0.0
        for i, end in enumerate(self.phase_ends):
            if step <= end or i == len(self.phase_ends) - 1:
                return i, (step - start) / (end - start) if end != start else 1.0
            start = end
        raise AssertionError("unreachable")

    def lr_at(self, base_lr: float, step: int, group: dict[str, Any]) -> float:
        i, pct = self._phase(step)
        if i == 0:
            return self._anneal(group["initial_lr"], group["max_lr"], pct)
        return self._anneal(group["max_lr"], group["min_lr"], pct)

    def step(self) -> None:
        if self.last_epoch + 1 > self.total_steps:
            raise ValueError(f"OneCycle was stepped past total_steps={self.total_steps}")
        super().step()
        if self.cycle_momentum:
            i, pct = self._phase(self.last_epoch)
            m = (
                self._anneal(self.max_momentum, self.base_momentum, pct)
                if i == 0
                else self._anneal(self.base_momentum, self.max_momentum, pct)
            )
            for g in self.optimizer.param_groups:
                if "betas" in g:
                    g["betas"] = (m, g["betas"][1])
                elif "momentum" in g:
                    g["momentum"] = m


OneCycleLR = OneCycle


class ReduceLROnPlateau:
    """Multiply lr by `factor` when the metric given to step(metric) has not improved (by threshold,
    'rel' or 'abs', in 'min' or 'max' mode) for `patience` epochs; then wait `cooldown` epochs."""

    def __init__(
        self,
        optimizer: Optimizer,
        mode: str = "min",
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        threshold_mode: str = "rel",
        cooldown: int = 0,
        min_lr: float = 0.0,
        eps: float = 1e-8,
    ):
        if factor >= 1.0:
            raise ValueError(f"ReduceLROnPlateau: factor must be < 1, got {factor}")
        if mode not in ("min", "max") or threshold_mode not in ("rel", "abs"):
            raise ValueError(f"mode must be min|max and threshold_mode rel|abs, got {mode}, {threshold_mode}")
        self.optimizer = optimizer
        self.mode, self.factor, self.patience = mode, float(factor), int(patience)
        self.threshold, self.threshold_mode = float(threshold), threshold_mode
        self.cooldown, self.min_lr, self.eps = int(cooldown), float(min_lr), float(eps)
        self.best = math.inf if mode == "min" else -math.inf
        self.num_bad_epochs = 0
        self.cooldown_counter = 0
        self.last_epoch = 0
        self._last_lr = [g["lr"] for g in optimizer.param_groups]

    def _is_better(self, value: float) -> bool:
        if self.mode == "min":
            bound = (
                self.best * (1 - self.threshold)
                if self.threshold_mode == "rel"
                else self.best - self.threshold
            )
            return value < bound
        bound = (
            self.best * (1 + self.threshold) if self.threshold_mode == "rel" else self.best + self.threshold
        )
        return value > bound

    def step(self, metric: float) -> None:
        value = float(metric)
        self.last_epoch += 1
        if self._is_better(value):
            self.best = value
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            for g in self.optimizer.param_groups:
                new_lr = max(g["lr"] * self.factor, self.min_lr)
                if g["lr"] - new_lr > self.eps:
                    g["lr"] = new_lr
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.__dict__.update({k: v for k, v in state.items() if k != "optimizer"})
        for g, lr in zip(self.optimizer.param_groups, self._last_lr):
            g["lr"] = lr
